"""The server's refusals, answered at once and never retried as crashes, and what it does with a
killed driver's other processes; in-process, without a JVM: the supervisor builds plans with
``headrace explain`` (no Spark), and a test that would start a driver records the start instead,
or starts a fake one. The last test starts real drivers, of a pipeline whose sink refuses to run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.errors import REFUSED_EXIT_STATUS
from headrace.runtime.restarts import RestartPolicy
from headrace.server.driver import session_processes
from headrace.server.operations import Operations
from headrace.server.registry import (
    FAILED,
    FINISHED,
    PAUSED,
    RESCALING,
    RESTARTING,
    RUNNING,
    STOPPED,
    Entry,
    Refused,
    Registry,
)
from headrace.server.supervisor import Supervisor

PIPELINE = """import headrace as hr

p = hr.Pipeline("orders")
p.source("orders", hr.sources.Files({inbox!r}, schema="id long, amount long")).sink(
    "out", hr.sinks.Files({out!r}, format="jsonl"))
"""


def until(what: str, check: Callable[[], Any], timeout: float = 60) -> Any:
    """Wait for ``check`` to hold (an event of another thread or process), polling it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def make_supervisor(folder: Path, policy: Callable[[], RestartPolicy] = RestartPolicy.of,
                    load_timeout_s: float = 120.0) -> Supervisor:
    state = folder / "state"
    state.mkdir(exist_ok=True)
    database = str(state / "server.sqlite")
    return Supervisor(Registry(database), Operations(database), str(state), [str(folder)], policy=policy,
                      load_timeout_s=load_timeout_s)


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[Supervisor]:
    made = make_supervisor(tmp_path)
    yield made
    made.close()


def record_launches(supervisor: Supervisor, monkeypatch, also: Callable[[], None] = lambda: None) -> list[Entry]:
    """The drivers ``supervisor`` starts, recorded instead of started (each entry as it was then);
    ``also`` runs at each start."""
    started: list[Entry] = []

    def record(entry: Entry, cold: bool = False) -> None:
        also()
        started.append(Entry(**entry.public()))
        entry.status, entry.wanted, entry.reason = STOPPED, False, "recorded, not started"
        supervisor.registry.put(entry)

    monkeypatch.setattr(supervisor, "_launch", record)
    return started


@pytest.fixture
def launches(supervisor: Supervisor, monkeypatch) -> list[Entry]:
    return record_launches(supervisor, monkeypatch)


def pipeline_file(tmp_path: Path) -> Path:
    path = tmp_path / "orders.py"
    path.write_text(PIPELINE.format(inbox=str(tmp_path / "inbox"), out=str(tmp_path / "out")))
    return path


def checkpoint(root: Path, batches: int, partitions: int = 2, state: bool = False) -> Path:
    """A checkpoint as Spark leaves it: ``batches`` batches in its offset and commit logs, each run
    with ``partitions`` state partitions, and a ``state`` folder when it keeps keyed state."""
    folder = root / "checkpoint"
    for log in ("offsets", "commits"):
        (folder / log).mkdir(parents=True)
    for batch in range(batches):
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {"spark.sql.shuffle.partitions": partitions}}
        (folder / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(metadata)}\n{{}}")
        (folder / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    if state:
        (folder / "state" / "0").mkdir(parents=True)
    return folder


@pytest.mark.fast
def test_a_file_whose_loading_blocks_is_refused_with_422_naming_its_line(tmp_path: Path):
    supervisor = make_supervisor(tmp_path, load_timeout_s=2.0)
    (tmp_path / "app.py").write_text("import time\n\nimport headrace as hr\n\ntime.sleep(1000)\np = hr.Pipeline('x')\n")
    with pytest.raises(Refused) as refused:
        supervisor.submit(str(tmp_path / "app.py"), None)
    assert refused.value.status == 422
    assert str(refused.value) == (
        "loading app.py did not finish within 2 s: it was at app.py:5 (time.sleep(1000)); a pipeline file must "
        "build its pipeline without waiting on anything: move what waits (a connection, a download, a sleep) into "
        "a step or a source")
    assert supervisor.registry.all() == []


@pytest.mark.fast
def test_a_drained_pipeline_is_refused_at_once_and_a_fresh_start_deletes_its_checkpoint_first(
        supervisor: Supervisor, launches: list[Entry], tmp_path: Path):
    file = pipeline_file(tmp_path)
    state_dir = tmp_path / "state" / "pipelines" / "orders"
    root = state_dir / "orders"
    checkpoint(root, 3)
    (root / "drained.json").write_text('{"batch": 3, "at": "2026-12-07T10:00:00+00:00"}\n')
    (state_dir / "progress.jsonl").write_text('{"batch": 2}\n')
    supervisor.registry.put(Entry("orders", str(file), str(state_dir), FINISHED, False, reason="drained"))
    expected = ("pipeline 'orders' was drained at batch 3 (2026-12-07T10:00:00+00:00): every window fired at the "
                "end of time, so its checkpoint takes no more records; submit it again with \"fresh\": true "
                "(headrace submit FILE --fresh), or restart it with ?fresh=true (headrace restart NAME --fresh), to "
                "delete its checkpoint and start over from the beginning of its input")
    for request in (lambda: supervisor.submit(str(file), None), lambda: supervisor.restart("orders")):
        with pytest.raises(Refused) as refused:
            request()
        assert (refused.value.status, str(refused.value)) == (409, expected)
    assert launches == [] and supervisor.registry.get("orders").status == FINISHED
    assert supervisor.registry.exceptions("orders") == []

    entry, started = supervisor.submit(str(file), None, fresh=True)
    assert started and [launched.name for launched in launches] == ["orders"]
    assert not root.exists() and not (state_dir / "progress.jsonl").exists()


@pytest.mark.fast
def test_a_fresh_submit_of_a_running_pipeline_is_refused(supervisor: Supervisor, tmp_path: Path):
    file = pipeline_file(tmp_path)
    state_dir = tmp_path / "state" / "pipelines" / "orders"
    supervisor.registry.put(Entry("orders", str(file), str(state_dir), RUNNING, True, pid=os.getpid()))
    with pytest.raises(Refused) as refused:
        supervisor.submit(str(file), None, fresh=True)
    assert (refused.value.status, str(refused.value)) == (
        409, "pipeline 'orders' is running: a fresh start would delete the checkpoint its driver runs on; restart "
             "it with ?fresh=true (headrace restart orders --fresh) to stop it first")


@pytest.mark.fast
def test_a_submit_the_checkpoint_cannot_take_is_refused_with_the_reasons(supervisor: Supervisor,
                                                                         launches: list[Entry], tmp_path: Path):
    """The plan stored beside the checkpoint reads another source: the driver would refuse it."""
    file = pipeline_file(tmp_path)
    state_dir = tmp_path / "state" / "pipelines" / "orders"
    checkpoint(state_dir / "orders", 1)
    subprocess.run([sys.executable, "-c", "from headrace.environment.checkpoints import write_plan; "
                    "from headrace.runtime.compatibility import plan_record; from headrace.cli import load_pipeline; "
                    f"write_plan({str(state_dir / 'orders')!r}, plan_record(load_pipeline({str(file)!r}).plan))"],
                   check=True, timeout=120)
    file.write_text(file.read_text().replace(str(tmp_path / "inbox"), str(tmp_path / "elsewhere")))
    with pytest.raises(Refused) as refused:
        supervisor.submit(str(file), None)
    message = str(refused.value)
    assert refused.value.status == 409 and message.startswith(
        "starting it is refused: pipeline 'orders' cannot restart from its checkpoint in ")
    advice = ("; undo the change, or submit it again with \"fresh\": true (headrace submit FILE --fresh), or restart "
              "it with ?fresh=true (headrace restart NAME --fresh), to delete its checkpoint and start over from the "
              "beginning of its input")
    assert "source 'orders'" in message and message.endswith(advice)
    supervisor.registry.put(Entry("orders", str(file), str(state_dir), PAUSED, False))  # edited while paused
    for action, what in (("resume", "resuming it"), ("restart", "restarting it")):
        with pytest.raises(Refused) as refused:
            getattr(supervisor, action)("orders")
        assert refused.value.status == 409 and str(refused.value) == message.replace("starting it", what, 1)
    assert launches == [] and supervisor.registry.get("orders").status == PAUSED


@pytest.mark.fast
def test_a_rescale_headrace_rescale_would_refuse_is_refused_at_once(supervisor: Supervisor, tmp_path: Path):
    file = pipeline_file(tmp_path)
    state_dir = tmp_path / "state" / "pipelines" / "orders"
    supervisor.registry.put(Entry("orders", str(file), str(state_dir), STOPPED, False))
    cases = [(None, "pipeline 'orders' has no checkpoint with processed batches yet, so there is no keyed state to "
                    "rescale: resume or restart it first (a new pipeline takes its number of state partitions from "
                    "spark.sql.shuffle.partitions)"),
             (False, "pipeline 'orders' keeps no keyed state (no stateful step in its checkpoint), so there is "
                     "nothing to rescale"),
             (True, "pipeline 'orders''s state already has 2 partitions")]
    for state, expected in cases:
        if state is not None:
            checkpoint(state_dir / "orders", 2, partitions=2, state=state)
        with pytest.raises(Refused) as refused:
            supervisor.rescale("orders", 2)
        assert (refused.value.status, str(refused.value)) == (409, expected)
        assert supervisor.registry.get("orders").status == STOPPED
        shutil.rmtree(state_dir / "orders", ignore_errors=True)


@pytest.mark.parametrize(("status", "action", "expected"), [
    (FAILED, "pause", "cannot pause pipeline 'orders': it is failed; it runs no driver; restart starts it again "
                      "from its checkpoint (its exceptions say why it failed)"),
    (FINISHED, "pause", "cannot pause pipeline 'orders': it is finished; it runs no driver; restart runs it again "
                        "from its checkpoint, remove forgets it"),
    (STOPPED, "pause", "cannot pause pipeline 'orders': it is stopped; it runs no driver; restart starts it again "
                       "from its checkpoint"),
    (FAILED, "stop", "cannot stop pipeline 'orders': it is failed; it runs no driver; restart starts it again from "
                     "its checkpoint (its exceptions say why it failed)"),
    (RESCALING, "restart", "cannot restart pipeline 'orders': it is rescaling; wait until its rescale has started "
                           "it again"),
])
@pytest.mark.fast
def test_a_request_that_makes_no_sense_in_the_pipelines_status_is_refused_with_409(
        supervisor: Supervisor, tmp_path: Path, status: str, action: str, expected: str):
    supervisor.registry.put(Entry("orders", str(pipeline_file(tmp_path)), str(tmp_path / "state"), status, False,
                                  reason="as it was"))
    with pytest.raises(Refused) as refused:
        getattr(supervisor, action)("orders")
    assert (refused.value.status, str(refused.value)) == (409, expected)
    found = supervisor.registry.get("orders")
    assert (found.status, found.reason) == (status, "as it was")


@pytest.mark.fast
def test_pause_and_resume_still_go_where_they_make_sense(supervisor: Supervisor, launches: list[Entry],
                                                         tmp_path: Path):
    supervisor.registry.put(Entry("orders", str(pipeline_file(tmp_path)), str(tmp_path / "state"), RUNNING, True))
    assert supervisor.pause("orders").status == PAUSED  # its driver had ended: paused at once
    supervisor.resume("orders")
    assert [entry.status for entry in launches] == [PAUSED]


# A driver as the server starts one, in a session of its own: it starts a process in its process
# group (as Spark's JVM is) and one that takes a process group of its own (as Spark's Python worker
# daemon does), prints their ids, and waits.
FAKE_DRIVER = """
import os, subprocess, sys, time
wait = [sys.executable, "-c", "import time; time.sleep(600)"]
jvm = subprocess.Popen(wait)
daemon = subprocess.Popen(wait, preexec_fn=lambda: os.setpgid(0, 0))
print(jvm.pid, daemon.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.fast
def test_a_killed_drivers_other_processes_all_end_before_another_driver_starts(tmp_path: Path, monkeypatch):
    """SIGKILL of the driver's process alone leaves its JVM and Python workers: the supervisor ends
    them and starts the next driver only once every process of the old driver's session is gone."""
    driver = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    assert driver.stdout is not None
    others = [int(pid) for pid in driver.stdout.readline().split()]
    supervisor = make_supervisor(tmp_path, policy=lambda: RestartPolicy(attempts=1, window_s=600, backoff_s=0))
    left_at_start: list[list[int]] = []
    launches = record_launches(supervisor, monkeypatch, lambda: left_at_start.append(session_processes(driver.pid)))
    state_dir = tmp_path / "state" / "pipelines" / "orders"
    state_dir.mkdir(parents=True)
    supervisor.registry.put(Entry("orders", str(pipeline_file(tmp_path)), str(state_dir), RUNNING, True,
                                  pid=driver.pid))
    try:
        assert sorted(session_processes(driver.pid)) == sorted([driver.pid, *others])
        supervisor.start()
        os.kill(driver.pid, signal.SIGKILL)  # the driver's process alone, not its group
        driver.wait()
        until("the restart", lambda: launches)
        assert left_at_start == [[]]
        assert session_processes(driver.pid) == []
        assert supervisor.registry.get("orders").restarts == 1
    finally:
        supervisor.close()
        for pid in [driver.pid, *others]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.fast
def test_an_idle_standby_a_killed_server_left_is_ended_with_its_python_workers(tmp_path: Path):
    """A new server ends the idle standby an old one left: every process of its session, Spark's
    Python worker daemon (a process group of its own) too, not only its process group."""
    from headrace.server.standby_pool import StandbyPool

    standby = subprocess.Popen([sys.executable, "-c", FAKE_DRIVER], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    assert standby.stdout is not None
    others = [int(pid) for pid in standby.stdout.readline().split()]
    place = tmp_path / "standby" / "1-1"
    place.mkdir(parents=True)
    (place / "pid").write_text(str(standby.pid))
    try:
        StandbyPool(str(tmp_path / "standby"))
        standby.wait(30)
        until("the standby's processes ending", lambda: session_processes(standby.pid) == [])
    finally:
        for pid in [standby.pid, *others]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.fast
def test_a_file_that_prints_as_it_loads_is_submitted(supervisor: Supervisor, launches: list[Entry], tmp_path: Path):
    file = pipeline_file(tmp_path)
    file.write_text('print("loading orders", {"a": 1})\nprint("{")\n' + file.read_text())
    entry, started = supervisor.submit(str(file), None)
    assert started and entry.name == "orders" and [launched.name for launched in launches] == ["orders"]


# A driver that ends as ``headrace run`` does on an error: its one line in the driver log, its exit
# status in the exit file (as headrace/server/driver.py writes it); each start is counted in STARTS.
ENDING_DRIVER = """
import sys
from headrace.server.driver import write_exit_status
exit_file, starts, status = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(starts, "a") as out:
    out.write("started\\n")
print("headrace: sink 'out' (orders.py:4): the directory 'out' already holds batches of an earlier run; remove it "
      "or use a new path", flush=True)
write_exit_status(exit_file, status)
sys.exit(status)
"""


@pytest.mark.parametrize(("status", "expected_status", "reason_starts", "restarts"), [
    (3, FAILED, "refused: sink 'out' (orders.py:4): the directory 'out' already holds batches of an earlier run; "
                "remove it or use a new path (not restarted: running it again as it is would not help; fix the "
                "cause, then restart it)", 0),
    (1, RESTARTING, "driver exit status 1; restarting from its checkpoint in 60 s", 1),  # the backoff at most 60 s
])
@pytest.mark.fast
def test_a_driver_that_ends_refused_fails_the_pipeline_at_once_and_one_that_failed_otherwise_is_restarted(
        tmp_path: Path, monkeypatch, status: int, expected_status: str, reason_starts: str, restarts: int):
    supervisor = make_supervisor(tmp_path, policy=lambda: RestartPolicy(attempts=1, window_s=600, backoff_s=600))
    starts = tmp_path / "starts.txt"
    monkeypatch.setattr(supervisor, "_driver_command", lambda entry, exit_file, draining: [
        sys.executable, "-c", ENDING_DRIVER, exit_file, str(starts), str(status)])
    supervisor.start()
    try:
        supervisor.submit(str(pipeline_file(tmp_path)), None)
        entry = until("the driver's end", lambda: (found := supervisor.registry.get("orders")).last_exit is not None
                      and found.status != RUNNING and found)
    finally:
        supervisor.close()
    assert (entry.status, entry.reason, entry.restarts, entry.last_exit) == (expected_status, reason_starts, restarts,
                                                                             status)
    assert starts.read_text() == "started\n"
    assert [(e["message"], e["count"]) for e in supervisor.registry.exceptions("orders")] == [
        ("sink 'out' (orders.py:4): the directory 'out' already holds batches of an earlier run; remove it or use a "
         "new path", 1)]


def test_a_pipeline_whose_sink_refuses_to_start_fails_after_one_driver_with_the_refusal_as_its_reason(
        tmp_path: Path):
    """A Files sink refuses a directory holding an earlier run's batches: a check only its driver can
    make. The server starts one driver, not one more per restart, and says why through its API."""
    from local_server import TOKEN

    from headrace.server.http_api import Api, serve

    (tmp_path / "inbox").mkdir()
    (tmp_path / "inbox" / "a.jsonl").write_text('{"id": 1, "amount": 5}\n')
    (tmp_path / "out" / "batch-0").mkdir(parents=True)  # an earlier run's batch
    supervisor = make_supervisor(tmp_path)  # the default restart strategy: 3 restarts within 10 minutes
    api = Api(supervisor, TOKEN, "127.0.0.1", 0)
    http = serve(api)
    api.bound(http.server_address[1])
    threading.Thread(target=http.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{http.server_address[1]}/api/pipelines"

    def call(method: str, path: str = "", body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(url + path, method=method, headers={"Authorization": f"Bearer {TOKEN}"},
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=60) as answer:
            text = answer.read().decode()
            return text if answer.headers.get_content_type() == "text/plain" else json.loads(text)

    supervisor.start()
    try:
        call("POST", body={"file": str(pipeline_file(tmp_path))})
        status = until("the pipeline's end", lambda: (found := call("GET", "/orders"))["status"] not in
                       (RUNNING, "starting") and found, timeout=600)
        log = call("GET", "/orders/logs")
        exceptions = call("GET", "/orders/exceptions")["exceptions"]
    finally:
        supervisor.close()
        http.shutdown()
        http.server_close()
    error = (f"sink 'out' (orders.py:4): the directory {str(tmp_path / 'out')!r} already holds batches of an earlier "
             "run; remove it or use a new path")
    assert (status["status"], status["restarts"], status["last_exit"]) == (FAILED, 0, REFUSED_EXIT_STATUS)
    assert status["reason"] == (f"refused: {error} (not restarted: running it again as it is would not help; fix "
                                "the cause, then restart it)")
    assert [(e["message"], e["count"]) for e in exceptions] == [(error, 1)]  # one driver ended
    assert [line for line in log.splitlines() if line.startswith("headrace: ")] == [f"headrace: {error}"]
