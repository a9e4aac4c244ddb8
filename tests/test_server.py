"""``headrace server`` for real: a server process, pipelines submitted through the CLI, their drivers
SIGKILLed and restarted, the server itself SIGKILLed and started again, and the API's refusals."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLOSE_WAIT_S = 120  # how long a SIGTERMed server may take to stop (Server.close)
PIPELINE = """import headrace as hr

p = hr.Pipeline("orders_copy")
p.source("orders", hr.sources.Files({inbox!r}, schema="id long, amount long", max_files_per_batch=1)).sink(
    "out", hr.sinks.Files({out!r}, format="jsonl"))
"""


def eventually(what: str, check: Callable[[], Any], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    """A ``headrace server`` process on a free port, its state in ``state``; without a standby driver
    unless a test passes ``--standby``."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.state = folder, folder / "state"
        self.process: subprocess.Popen[str] | None = None

    def start(self, *options: str, **environment: str) -> Server:
        address = self.state / "server.json"
        if address.exists():
            address.unlink()
        self.process = subprocess.Popen([sys.executable, "-m", "headrace.cli", "server", "--port", "0", "--state-dir",
                                         str(self.state), "--allow", str(self.folder), "--no-standby", *options],
                                        cwd=self.folder,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        env={**os.environ, **environment})
        eventually("the server's address", address.exists, 30)
        self.url = json.loads(address.read_text())["url"]
        self.token = (self.state / "server.token").read_text()
        return self

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "headrace.cli", *args, "--state-dir", str(self.state)],
                              cwd=self.folder, capture_output=True, text=True, timeout=180, check=False)

    def status(self, name: str) -> dict[str, Any]:
        done = self.cli("status", name, "--json")
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def call(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
             token: bool = True) -> tuple[int, Any]:
        given = {"Authorization": f"Bearer {self.token}"} if token else {}
        request = urllib.request.Request(self.url + path, data=body, method=method,
                                         headers={**given, **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                text = answer.read().decode()
                return answer.status, text if answer.headers.get_content_type() == "text/plain" else json.loads(text)
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            # the server stops its pipelines at a batch boundary first: on a loaded machine a batch
            # took over 30 s (the web UI's test in the CI of 75ef341)
            self.process.wait(timeout=CLOSE_WAIT_S)

    def output(self) -> str:
        """What the server printed (it is stopped first)."""
        self.close()
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout.read()


@pytest.fixture
def server(tmp_path: Path):
    running = Server(tmp_path).start()
    yield running
    running.close()
    for entry in json.loads(running.cli("list", "--json").stdout or "[]") if running.process else []:
        if entry["pid"]:
            os.killpg(entry["pid"], signal.SIGKILL)


def committed(out: Path) -> list[dict[str, Any]]:
    """The rows of the files Spark's file sink committed (a batch a killed driver wrote but did not commit
    leaves a file that its log does not list)."""
    from headrace.connectors.files_sink import read_rows

    return list(read_rows(str(out), "jsonl")) if (out / "_spark_metadata").exists() else []


def metrics(server: Server, pipeline: str = "orders_copy") -> dict[str, str]:
    """The pipeline's samples of ``GET /metrics``, by metric name."""
    status, text = server.call("GET", "/metrics")
    assert status == 200 and "# TYPE headrace_input_records_total counter" in text, text
    mine = f'{{pipeline="{pipeline}"}}'
    samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    return {name.removesuffix(mine): value for name, value in samples.items() if name.endswith(mine)}


def out_rows(out: Path) -> list[tuple[int, int]]:
    return sorted((r["id"], r["amount"]) for r in committed(out))


def test_a_submitted_pipeline_survives_a_sigkill_of_its_driver_and_of_the_server(server: Server, tmp_path: Path):
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"id": 1, "amount": 10}\n{"id": 2, "amount": 20}\n')
    (tmp_path / "orders.py").write_text(PIPELINE.format(inbox=str(inbox), out=str(out)))

    submitted = server.cli("submit", "orders.py")
    assert submitted.returncode == 0, submitted.stderr
    assert submitted.stdout.startswith("orders_copy: running, driver pid "), submitted.stdout
    first = server.status("orders_copy")
    again = server.cli("submit", "orders.py", "--json")  # idempotent: the running pipeline, not a second one
    assert json.loads(again.stdout)["pid"] == first["pid"]
    eventually("the first file's rows", lambda: len(out_rows(out)) == 2)
    # Spark reports a batch once it is committed: a kill in between would leave it out of the counters
    eventually("the first batch's report", lambda: metrics(server)["headrace_input_records_total"] == "2")

    os.killpg(first["pid"], signal.SIGKILL)  # the driver's whole process group: the JVM and the Python workers
    restarted = eventually("a restarted driver", lambda: (s := server.status("orders_copy"))["pid"] not in (
        0, first["pid"]) and s)
    assert (restarted["status"], restarted["restarts"]) == ("running", 1)
    (inbox / "b.jsonl").write_text('{"id": 3, "amount": 30}\n')
    eventually("the second file's rows", lambda: len(out_rows(out)) == 3)

    server.kill()  # the drivers do not depend on the server
    server.start()
    listed = server.cli("list")
    assert listed.stdout.startswith(f"orders_copy: running, 1 restart, driver pid {restarted['pid']} "), listed.stdout
    (inbox / "c.jsonl").write_text('{"id": 4, "amount": 40}\n')
    eventually("the third file's rows", lambda: len(out_rows(out)) == 4)

    stopped = server.cli("stop", "orders_copy")
    assert stopped.stdout.startswith("orders_copy: stopping"), stopped.stdout
    final = eventually("the stop", lambda: (s := server.status("orders_copy"))["status"] == "stopped" and s)
    assert final["last_exit"] == 0 and final["pid"] == 0
    assert out_rows(out) == [(1, 10), (2, 20), (3, 30), (4, 40)]  # each record once, through both kills
    figures = metrics(server)  # each batch id counted once, across the three drivers' reports
    counted = ("headrace_input_records_total", "headrace_dead_letters_total", "headrace_driver_restarts_total",
               "headrace_pipeline_running")
    assert {name: figures.get(name) for name in counted} == dict(zip(counted, ("4", "0", "1", "0"), strict=True))
    # the driver log: a line per batch, and each driver's end (the last one stopped by the request)
    log = server.cli("logs", "orders_copy", "--lines", "200").stdout
    assert re.search(r"^batch \d+ \| \d+ rows/s \| ", log, re.MULTILINE), log
    assert log.splitlines()[-1].startswith("orders_copy: 2 rows in "), log


def test_the_api_refuses_bad_requests_with_a_reason(server: Server, tmp_path: Path):
    (tmp_path / "broken.py").write_text("import headrace as hr\np = hr.Pipeline('broken')\np.source('x', 1)\n")
    status, spec = server.call("GET", "/api/openapi.json", token=False)
    assert status == 200 and set(spec["paths"]) == {
        "/api/pipelines", "/api/pipelines/{name}", "/metrics", "/api/pipelines/{name}/logs",
        "/api/pipelines/{name}/{action}", "/api/pipelines/{name}/state", "/api/pipelines/{name}/state/{view}",
        "/api/pipelines/{name}/state/{view}/{key}", "/api/pipelines/{name}/changes/{view}",
        "/api/pipelines/{name}/figures", "/api/pipelines/{name}/dag", "/api/pipelines/{name}/exceptions",
        "/api/pipelines/{name}/checkpoints", "/api/pipelines/{name}/config", "/api/operations/{id}"}
    assert server.call("GET", "/api/pipelines", token=False) == (200, [])  # reads on 127.0.0.1 need no token
    refusals = [
        (server.call("POST", "/api/pipelines", b'{"file": "x.py"}', token=False), 401, "needs the server's token"),
        (server.call("GET", "/api/pipelines", headers={"Host": "evil.example:80"}), 403, "Host header"),
        (server.call("POST", "/api/pipelines", b"{not json"), 400, "the body is not JSON"),
        (server.call("POST", "/api/pipelines", b'{"file": 3}'), 400, "give the pipeline's file"),
        (server.call("POST", "/api/pipelines", b'{"file": "a.py", "nmae": "x"}'), 400, "unknown field(s) nmae"),
        (server.call("POST", "/api/pipelines", b'{"file": "/etc/passwd"}'), 403, "outside the directories"),
        (server.call("POST", "/api/pipelines", json.dumps({"file": str(tmp_path / "broken.py")}).encode()), 400,
         "broken.py:3"),
        (server.call("POST", "/api/pipelines", b"x" * 70_000), 413, "more than 65536"),
        (server.call("GET", "/api/pipelines/nope"), 404, "no pipeline 'nope'"),
        (server.call("POST", "/api/pipelines/nope/explode"), 404, "no action 'explode'"),
        (server.call("GET", "/api/pipelines/nope/logs?lines=many"), 400, "lines must be a whole number"),
        (server.call("DELETE", "/api/pipelines"), 405, "GET and POST only"),
        (server.call("POST", "/api/pipelines/nope/stop", headers={"Origin": "http://evil.example"}), 403,
         "a POST from another site (http://evil.example) is refused"),
        (server.call("GET", "/api/operations/ab12"), 404, "no operation 'ab12'"),
        (server.call("POST", "/api/pipelines/nope/stop?now=true&drain=true"), 400,
         "now and drain exclude each other: a drain stops at a batch boundary"),
        (server.call("GET", "/api/pipelines/nope/state/totals/a%7Cb"), 404, "no pipeline 'nope'"),
        (server.call("GET", "/api/pipelines/nope/state/totals?limit=5000"), 400, "limit must be a whole number"),
        (server.call("GET", "/api/pipelines/nope/state/totals?min_batch=-1"), 400, "min_batch must be a whole"),
        (server.call("GET", "/api/pipelines/nope/changes/totals?after=x"), 400, "after must be a whole number"),
        (server.call("GET", "/api/pipelines/nope/checkpoints?limit=0"), 400, "limit must be a whole number from 1"),
        (server.call("GET", "/api/pipelines/nope/config"), 404, "no pipeline 'nope'"),
    ]
    for (status, body), expected, message in refusals:
        assert status == expected and message in body["error"], (status, body)
    done = server.cli("stop", "nope")
    assert done.returncode == 1 and "no pipeline 'nope'" in done.stderr
    done = server.cli("submit", str(tmp_path / "broken.py"), "--name", "")
    assert done.returncode == 1 and "name must be the pipeline's name on the server, got ''" in done.stderr

    # Schemathesis: requests made from the OpenAPI description, valid and not, every method; none gets a 5xx
    fuzz = subprocess.run([str(Path(sys.executable).parent / "schemathesis"), "run", f"{server.url}/api/openapi.json",
                           "--checks", "not_a_server_error", "--max-examples", "60", "--seed", "1", "-H",
                           f"Authorization: Bearer {server.token}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    operations = sum(len(methods) for methods in spec["paths"].values())
    assert fuzz.returncode == 0 and re.search(rf"Tested: {operations}\b", fuzz.stdout), fuzz.stdout[-3000:]


def doc_session(marker: str) -> list[tuple[str, str]]:
    """The commands of a session in docs/control-plane.md, each with the output the doc shows."""
    doc = (ROOT / "docs" / "control-plane.md").read_text()
    session = doc.split(f"<!-- {marker} -->\n```\n", 1)[1].split("```", 1)[0]
    return [(chunk.split("\n", 1)[0], chunk.split("\n", 1)[1]) for chunk in session.split("$ ")[1:]]


class RootServer:
    """``headrace server`` in the repository's root, as the docs start it (its state dir from
    $HEADRACE_STATE_DIR, the default port, a warm standby driver)."""

    def __init__(self, tmp_path: Path) -> None:
        self.state = tmp_path / "state"
        self.environment = {**os.environ, "HEADRACE_STATE_DIR": str(self.state)}

    def __enter__(self) -> RootServer:
        self.process = subprocess.Popen([sys.executable, "-m", "headrace.cli", "server"], cwd=ROOT,
                                        env=self.environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True)
        try:
            eventually("the server", lambda: (self.state / "server.json").exists() or self.process.poll() is not None,
                       60)
        except AssertionError:
            self.process.kill()
            raise
        if self.process.poll() is not None:
            raise AssertionError(f"headrace server ended at once: {self.process.communicate()[0]}")
        # the docs' sessions begin once the standby the server starts is ready, a few seconds later
        eventually("the server's warm standby driver", lambda: list((self.state / "standby").glob("*/ready")), 180)
        return self

    def __exit__(self, *exc: object) -> None:
        listed = self.run("headrace list --json").stdout
        self.process.terminate()
        self.process.wait(timeout=30)
        for entry in json.loads(listed or "[]"):
            if entry["pid"]:
                os.killpg(entry["pid"], signal.SIGKILL)

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        assert command.startswith("headrace ")
        return subprocess.run([sys.executable, "-m", "headrace.cli", *shlex.split(command)[1:]], cwd=ROOT,
                              env=self.environment, capture_output=True, text=True, timeout=180, check=False)

    def play(self, session: list[tuple[str, str]]) -> None:
        """Each command, until it prints what the doc shows (but for process ids, the file's directory
        and the seconds a run took)."""
        def shown(text: str) -> str:
            text = re.sub(r"driver pid \d+", "driver pid N", text)
            text = re.sub(r"\(\d+(\.\d+)? s\)$", "(N s)", text, flags=re.MULTILINE)
            return text.replace(str(ROOT), "/home/you/headrace")

        for command, expected in session:
            # a session's first query waits for the pipeline's batches: on a loaded machine (CI's
            # three test processes on two cores) its first batch alone took 67 s
            eventually(f"{command!r} to print what the doc shows",
                       lambda c=command, e=expected: shown(self.run(c).stdout) == shown(e), 300)


def test_the_session_of_docs_control_plane_md_prints_what_it_shows(tmp_path: Path):
    with RootServer(tmp_path) as server:
        server.play(doc_session("server session"))


def test_queryable_views_answer_as_counted_in_python_through_the_cli_the_api_and_the_client(tmp_path: Path):
    """docs/control-plane.md's views session as written (examples/queryable_word_counts.py), then every
    key of both views, page by page, and the feed of changes, each equal to counts made here from the
    generator's lines; waiting for a batch that does not come, and the refusals."""
    from headrace.connectors.generator import generate
    from headrace.server.client import Client, ServerError

    lines = generate("words", 0, 300_000)
    totals: Counter[str] = Counter()
    windows: Counter[str] = Counter()
    updated = set()  # (batch, word and window) of each window a batch changes: its emit="updates" rows
    for index, (line, at) in enumerate(zip(lines.column("line").to_pylist(), lines.column("event_time").to_pylist(),
                                           strict=True)):
        for word in line.lower().split():
            totals[word] += 1
            windows[f"{word}|{at:%Y-%m-%d %H:%M:%S}"] += 1  # the window's start, as Spark writes it as text
            updated.add((index // 100_000, f"{word}|{at:%Y-%m-%d %H:%M:%S}"))  # 100,000 lines a batch
    name = "queryable_word_counts"
    with RootServer(tmp_path) as server:
        server.play(doc_session("views session"))
        doc = (ROOT / "docs" / "control-plane.md").read_text()
        block = doc.split("```python\n", 1)[1].split("```", 1)[0]
        assert "Client.find()" in block
        shown = doc.split(block, 1)[1].split("```\n", 2)[2].split("```", 1)[0]  # the block, a line, its output
        ran = subprocess.run([sys.executable, "-c", block], cwd=ROOT, env=server.environment, capture_output=True,
                             text=True, timeout=120, check=False)
        assert (ran.stdout, ran.stderr) == (shown, "")
        client = Client.find(str(server.state))
        final = client.query(name, "totals", "stream")
        assert final["value"] == {"word": "stream", "count": totals["stream"]}

        def every(view: str) -> dict[str, Any]:
            rows, cursor = [], None
            while True:
                page = client.query(name, view, limit=1000, cursor=cursor)
                assert page["batch_id"] == final["batch_id"]
                rows += page["rows"]
                cursor = page["next_cursor"]
                if cursor is None:
                    return {row["key"]: row["value"] for row in rows}

        assert {key: value["count"] for key, value in every("totals").items()} == dict(totals)
        assert {key: value["n"] for key, value in every("per_second").items()} == dict(windows)
        feed = list(client.changes(name, "totals", after=0, until=final["batch_id"]))
        assert [event["batch_id"] for event in feed] == [final["batch_id"]]  # it finished: one event, every key
        assert {row["key"]: row["value"]["count"] for row in feed[0]["rows"]} == dict(totals)

        # each step's records, the window's too (run on headrace's window processor, read per batch by its view)
        steps = client.call("GET", f"/api/pipelines/{name}/figures")["steps"]
        assert {step: steps[step]["records_total"] for step in ("count", "windows")} == {
            "count": len({(batch, word) for batch, key in updated for word in [key.split("|")[0]]}),
            "windows": len(updated)}

        later = final["batch_id"] + 5
        refusals = [
            (lambda: client.query(name, "totals", "stream", min_batch=later, timeout=0.5),
             f"(409): view 'totals' is at batch {final['batch_id']}; batch {later} was not reached in 0.5 s"),
            (lambda: client.query(name, "totals", "zebra"),
             f"(404): view 'totals' has no key 'zebra' as of batch {final['batch_id']}"),
            (lambda: client.query(name, "nope"), "(404): pipeline 'queryable_word_counts' has no view 'nope' (its "
                                                 "views: per_second, totals)"),
            (lambda: client.query(name, "totals", limit=0), "(400): limit must be a whole number from 1 to 1000"),
            (lambda: client.query("other", "totals"), "(404): no pipeline 'other'"),
        ]
        for call, message in refusals:
            with pytest.raises(ServerError) as refused:
                call()
            assert message in str(refused.value)


def test_pause_resume_and_an_upgrade_keep_the_output_exact_and_a_refused_upgrade_changes_nothing(
        server: Server, tmp_path: Path):
    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"id": 1, "amount": 10}\n')
    (tmp_path / "orders.py").write_text(PIPELINE.format(inbox=str(inbox), out=str(out)))
    assert server.cli("submit", "orders.py").returncode == 0
    eventually("the first file's rows", lambda: len(out_rows(out)) == 1)

    # --wait: until the operation the request began has ended
    assert server.cli("pause", "orders_copy", "--wait").returncode == 0
    paused = server.status("orders_copy")
    assert (paused["status"], paused["pid"], paused["last_exit"]) == ("paused", 0, 0)
    (inbox / "b.jsonl").write_text('{"id": 2, "amount": 20}\n')  # waits in the directory while paused
    resumed = server.cli("resume", "orders_copy", "--wait", "--json")
    assert resumed.returncode == 0, resumed.stderr
    operation = json.loads(resumed.stdout)["operation"]
    assert (operation["action"], operation["status"]) == ("resume", "done")
    assert server.call("GET", f"/api/operations/{operation['id']}") == (200, operation)
    eventually("the second file's rows", lambda: len(out_rows(out)) == 2)

    doubled = PIPELINE.replace(').sink(\n', ').select("id", "amount", doubled=hr.col("amount") * 2).sink(\n')
    (tmp_path / "orders_v2.py").write_text(doubled.format(inbox=str(inbox), out=str(out)))
    before = server.status("orders_copy")
    upgraded = server.cli("upgrade", "orders_copy", "orders_v2.py", "--wait", "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    after = json.loads(upgraded.stdout)  # the new version's driver is under way
    assert after["pid"] not in (0, before["pid"]) and after["operation"]["status"] == "done"
    assert after["file"] == str(tmp_path / "orders_v2.py") and after["restarts"] == 0
    (inbox / "c.jsonl").write_text('{"id": 3, "amount": 30}\n')
    eventually("the third file's rows", lambda: len(out_rows(out)) == 3)
    assert [r.get("doubled") for r in committed(out) if r["id"] == 3] == [60]  # the new code wrote it

    elsewhere = tmp_path / "other_inbox"
    elsewhere.mkdir()
    (tmp_path / "orders_v3.py").write_text(PIPELINE.format(inbox=str(elsewhere), out=str(out)))
    refused = server.cli("upgrade", "orders_copy", "orders_v3.py")
    assert refused.returncode == 1 and "the upgrade is refused, 'orders_copy' runs on" in refused.stderr
    assert "orders" in refused.stderr.split("runs on:", 1)[1]  # the reason names the changed source
    assert server.status("orders_copy")["pid"] == after["pid"]  # the old version was not touched

    assert server.cli("stop", "orders_copy", "--drain", "--now").returncode == 2  # a drain ends at a batch boundary
    (inbox / "d.jsonl").write_text('{"id": 4, "amount": 40}\n')
    asked = server.cli("stop", "orders_copy", "--drain", "--json")
    assert asked.returncode == 0, asked.stderr
    operation = json.loads(asked.stdout)["operation"]
    # the drain's own driver (not the stopping one), killed: the server drains again
    draining = eventually("the drain's driver", lambda: (entry := server.status("orders_copy"))["pid"] not in (
        0, after["pid"]) and entry["status"] == "draining" and entry)
    os.killpg(draining["pid"], signal.SIGKILL)
    ended = eventually("the drain's end", lambda: (entry := server.status("orders_copy"))["status"] == "finished"
                       and entry, 180)
    assert (ended["reason"], ended["restarts"]) == ("drained: every window fired; it ended for good", 1)
    assert server.call("GET", f"/api/operations/{operation['id']}")[1]["status"] == "done"
    # each record once, across the pause, the upgrade and the drain (which read what the directory held)
    assert out_rows(out) == [(1, 10), (2, 20), (3, 30), (4, 40)]
    assert server.call("POST", "/api/pipelines/orders_copy/stop?drain=true") == (
        409, {"error": "pipeline 'orders_copy' is finished; there is nothing to drain"})


def test_the_standby_takes_a_pipeline_while_it_warms_up_and_a_warm_one_takes_its_restart(tmp_path: Path):
    """``headrace server`` keeps a standby driver by default. Submitted once the standby's session is
    up, a pipeline is taken by it (during its warm-up pipeline, or once ready). Once that first
    driver has committed a batch, a new standby starts; killed, the pipeline is taken by that one,
    warm, with each record written once."""
    server = Server(tmp_path).start("--standby")
    try:
        inbox, out = tmp_path / "inbox", tmp_path / "out"
        inbox.mkdir()
        (inbox / "a.jsonl").write_text('{"id": 1, "amount": 10}\n')
        (tmp_path / "orders.py").write_text(PIPELINE.format(inbox=str(inbox), out=str(out)))
        eventually("the standby's session", lambda: list((server.state / "standby").glob("*/session")), 180)
        assert server.cli("submit", "orders.py").returncode == 0
        first = server.status("orders_copy")
        assert first["reason"] in ("a standby driver, still warming up, took it", "a warm standby driver took it")
        eventually("the first file's rows", lambda: len(out_rows(out)) == 1)
        eventually("the next standby, ready", lambda: len(list((server.state / "standby").glob("*/ready"))) == 2,
                   180)
        os.killpg(first["pid"], signal.SIGKILL)
        eventually("a restarted driver", lambda: server.status("orders_copy")["pid"] not in (0, first["pid"]))
        assert server.status("orders_copy")["reason"] == "a warm standby driver took it"
        (inbox / "b.jsonl").write_text('{"id": 2, "amount": 20}\n')
        eventually("the second file's rows", lambda: len(out_rows(out)) == 2)
        assert server.cli("stop", "orders_copy").returncode == 0
        eventually("the stop", lambda: server.status("orders_copy")["status"] == "stopped")
        assert out_rows(out) == [(1, 10), (2, 20)]
    finally:
        server.close()
        standbys = [int(p.read_text()) for p in (server.state / "standby").glob("*/pid")]

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    eventually("no standby left running", lambda: not [pid for pid in standbys if running(pid)], 30)


def to_delta(tmp_path: Path) -> Path:
    """A pipeline file writing to Delta, which needs Delta's package in its JVM."""
    (tmp_path / "to_delta.py").write_text(
        "import headrace as hr\n\np = hr.Pipeline('to_delta')\n"
        f"p.source('orders', hr.sources.Files({str(tmp_path / 'inbox')!r}, schema='id long')).sink(\n"
        f"    'table', hr.sinks.Delta({str(tmp_path / 'table')!r}))\n")
    return tmp_path / "to_delta.py"


def test_a_starting_standby_hands_a_pipeline_that_needs_connector_packages_back_at_once(tmp_path: Path):
    """A standby whose JVM starts with no fetched jars lacks Delta's package: handed a pipeline
    writing to Delta while its JVM still starts, it exits at once with the status that has the
    supervisor start an ordinary driver (75), before its session is up."""
    from headrace.server.standby_pool import NEEDS_COLD_START

    folder, no_jars = tmp_path / "standby", tmp_path / "no-jars"
    folder.mkdir()
    no_jars.mkdir()
    to_delta(tmp_path)
    exit_file = tmp_path / "driver.exit"
    (folder / "assignment.json").write_text(json.dumps({
        "file": str(tmp_path / "to_delta.py"), "state_dir": str(tmp_path / "state"), "log": str(tmp_path / "log"),
        "progress_log": str(tmp_path / "progress"), "exit_file": str(exit_file)}))
    standby = subprocess.run([sys.executable, "-m", "headrace.standby", str(folder)], capture_output=True,
                             text=True, timeout=120, check=False, start_new_session=True,
                             env={**os.environ, "HEADRACE_JARS_DIR": str(no_jars)})
    assert standby.returncode == NEEDS_COLD_START, standby.stderr
    assert exit_file.read_text() == str(NEEDS_COLD_START)
    assert not (folder / "ready").exists()


def test_a_standby_started_with_the_fetched_jars_takes_a_pipeline_that_needs_them(tmp_path: Path, monkeypatch):
    """A standby's JVM starts with every fetched jar (``scripts/fetch_jars.sh``), as any driver's:
    a pipeline whose packages the folder holds is not handed back; one that needs a package the
    folder lacks is, and so is one whose packages came into the folder after the standby started."""
    from headrace.environment import jars
    from headrace.standby import _needs_cold_start

    folder = tmp_path / "jars"
    folder.mkdir()
    (folder / "delta.jar").write_bytes(b"")
    (folder / jars.MANIFEST).write_text(f"{jars.DELTA.name}:4.4.0 delta.jar\n")
    monkeypatch.setenv("HEADRACE_JARS_DIR", str(folder))
    launched = jars.session_settings(())
    job = {"file": str(to_delta(tmp_path))}
    assert launched["spark.jars"] == str(folder / "delta.jar")
    assert not _needs_cold_start(job, launched)
    (tmp_path / "to_kafka.py").write_text(
        "import headrace as hr\n\np = hr.Pipeline('to_kafka')\n"
        f"p.source('orders', hr.sources.Files({str(tmp_path / 'inbox')!r}, schema='id long')).sink(\n"
        "    'topic', hr.sinks.Kafka('orders', exactly_once=False))\n")
    assert _needs_cold_start({"file": str(tmp_path / "to_kafka.py")}, launched)
    assert _needs_cold_start(job, {})



# -- the API in this process, over state dirs written here (no driver, no JVM) ------------------------

def local_server(tmp_path: Path) -> Any:
    from local_server import Server as LocalServer

    return LocalServer(tmp_path)


def raw_request(url: str, request: bytes) -> bytes:
    """Send ``request`` as it is on a connection of its own; what the server answers before it closes."""
    import socket

    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
        return answer


def views_pipeline(local: Any, tmp_path: Path) -> Path:
    """``orders``, whose recorded plan declares the view ``totals``; its root."""
    import headrace as hr
    from headrace.runtime.compatibility import record_plan

    root = local.pipeline("orders", tmp_path / "state")
    (root / "checkpoint").mkdir(parents=True)
    p = hr.Pipeline("orders")
    words = p.source("words", hr.sources.Files(str(tmp_path), schema="word string"))
    words.key_by("word").count(name="count").queryable("totals")
    record_plan(p.plan, str(root))
    return root


def apply_a_batch(root: Path) -> None:
    """Batch 1 of the view ``totals`` in the store of the pipeline at ``root``: the word a, twice."""
    from headrace.connectors.view_store import ViewWriter, store_path
    from headrace.environment.checkpoints import run_dir

    store = store_path(run_dir(str(root), root.name, ""))
    os.makedirs(os.path.dirname(store), exist_ok=True)
    ViewWriter(store).apply("totals", ("word",), 1, None, [("a", json.dumps({"word": "a", "count": 2}))])


@pytest.mark.fast
def test_an_unknown_view_is_a_404_at_once_for_a_lookup_a_wait_and_a_feed(tmp_path: Path):
    """A view the pipeline neither holds nor declares: 404 naming it and the views there are, for a
    lookup, a wait for a batch (at once, not after the wait) and a feed of changes; a declared view
    with no batch yet is waited for, and its feed gives its batch once there is one."""
    local = local_server(tmp_path)
    try:
        root = views_pipeline(local, tmp_path)
        base = "/api/pipelines/orders"
        refused = "pipeline 'orders' has no view 'nope' (its views: totals)"
        for path in (f"{base}/state/nope/a", f"{base}/state/nope?min_batch=3&timeout=60",
                     f"{base}/state/nope/a?min_batch=3&timeout=60", f"{base}/changes/nope?after=0"):
            assert local.get(path) == (404, {"error": refused}), path
        status, body = local.get(f"{base}/state/totals/a?min_batch=0&timeout=0.2")
        assert (status, body["error"]) == (409, "view 'totals' has no batch yet; batch 0 was not reached in 0.2 s")
        apply_a_batch(root)
        with urllib.request.urlopen(f"{local.url}{base}/changes/totals?until=1", timeout=30) as feed:
            events = feed.read().decode()
        assert feed.status == 200 and '"rows": [{"key": "a", "value": {"word": "a", "count": 2}}]' in events
    finally:
        local.close()


@pytest.mark.fast
def test_a_short_body_an_empty_name_and_a_host_in_capitals_get_their_answers(tmp_path: Path, monkeypatch):
    """A body shorter than its Content-Length is refused once no more of it comes (the connection
    held open), naming the bytes; an empty name is refused naming the field; a Host header in
    capitals is the same host."""
    from headrace.server import http_api

    monkeypatch.setattr(http_api, "BODY_TIMEOUT_S", 0.2)
    local = local_server(tmp_path)
    try:
        port = local.url.rsplit(":", 1)[1]
        headers = (f"POST /api/pipelines HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer token\r\n"
                   "Content-Type: application/json\r\n")
        answer = raw_request(local.url, f"{headers}Content-Length: 100\r\n\r\n".encode() + b'{"file": "a.py"')
        status_line, _, body = answer.decode().partition("\r\n\r\n")
        assert status_line.startswith("HTTP/1.0 400 ")
        assert json.loads(body) == {"error": "the body ended after 15 of the 100 bytes its Content-Length gives "
                                             "(nothing more came for 0.2 s); send the whole body"}
        empty = json.dumps({"file": str(tmp_path / "orders.py"), "name": ""}).encode()
        answer = raw_request(local.url, f"{headers}Content-Length: {len(empty)}\r\n\r\n".encode() + empty)
        status_line, _, body = answer.decode().partition("\r\n\r\n")
        assert status_line.startswith("HTTP/1.0 400 ") and json.loads(body) == {
            "error": "name must be the pipeline's name on the server, got '': leave it out to use the name in its file"}
        for host in (f"LOCALHOST:{port}", f"LocalHost:{port}"):
            answer = raw_request(local.url, f"GET /api/pipelines HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.0 200 "), answer
        answer = raw_request(local.url, f"GET /api/pipelines HTTP/1.1\r\nHost: EVIL.example:{port}\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.0 403 "), answer
    finally:
        local.close()


@pytest.mark.fast
def test_a_client_that_leaves_before_its_answer_is_let_go_without_a_traceback(tmp_path: Path, capfd):
    """The request is read, the client gone when its answer is written (and when a next request
    would be read): nothing printed."""
    import socket

    local = local_server(tmp_path)
    try:
        port = local.url.rsplit(":", 1)[1]
        whole = f"GET /api/openapi.json HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
        for request in (whole, whole[:30]):  # gone before the answer; gone in the middle of the request
            server_end, client_end = socket.socketpair()
            client_end.sendall(request)
            client_end.close()
            local.http.process_request_thread(server_end, ("127.0.0.1", 0))  # as a request's thread runs it
        reset_end, client_end = socket.socketpair()
        client_end.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client_end.close()
        local.http.process_request_thread(reset_end, ("127.0.0.1", 0))
    finally:
        local.close()
    assert capfd.readouterr() == ("", "")


@pytest.mark.fast
def test_the_openapi_status_enum_names_every_status():
    from headrace.server.openapi import OPENAPI

    assert sorted(OPENAPI["components"]["schemas"]["Pipeline"]["properties"]["status"]["enum"]) == sorted(
        ["starting", "running", "restarting", "stopping", "stopped", "paused", "finished", "failed", "draining",
         "rescaling"])


@pytest.mark.fast
def test_batches_count_a_rescales_batch_and_a_pipeline_not_running_has_no_rate(tmp_path: Path):
    """Batches 0-2 reported, and batch 3 of a rescale in the commit log only (it reads no input and
    reports nothing): 4 batches. A rate (the pipeline's, each step's) while it runs; 0 once it is
    stopped or failed."""
    from headrace.server.metrics import Metrics
    from headrace.server.registry import FAILED, RUNNING, STOPPED, Entry

    root = tmp_path / "state" / "orders"
    (root / "checkpoint" / "commits").mkdir(parents=True)
    for batch in range(4):
        (root / "checkpoint" / "commits" / str(batch)).write_text("v1\n{}\n")
    reports = [{"batch": batch, "batch_ms": 2000, "input_rows": 129, "rows_per_second": 64.5,
                "step_records": {"orders": 129}} for batch in range(3)]
    (tmp_path / "state" / "progress.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reports))
    metrics = Metrics("progress.jsonl")
    for status, rate in ((RUNNING, 64.5), (STOPPED, 0), (FAILED, 0)):
        entry = Entry("orders", str(tmp_path / "orders.py"), str(tmp_path / "state"), status, status == RUNNING)
        figures = metrics.figures(entry)
        assert (figures["totals"]["batches"], figures["last"]["rows_per_second"]) == (4, rate)
        assert figures["steps"]["orders"]["records_per_second"] == rate
        samples = metrics.exposition([entry], {}).splitlines()
        assert 'headrace_batches_total{pipeline="orders"} 4' in samples
        assert f'headrace_input_records_per_second{{pipeline="orders"}} {rate}' in samples
