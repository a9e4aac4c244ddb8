"""Every example builds a valid pipeline and explains itself; the docs' test-kit example runs."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headrace.cli import load_pipeline

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
FRAGMENT = "<!-- fragment -->"
_PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    where: str  # README.md:29
    code: str
    fragment: bool  # marked <!-- fragment --> on the line before: a piece of a larger program


def python_blocks(path: Path) -> list[Block]:
    """The fenced python blocks of a Markdown file, in order."""
    text = path.read_text()
    blocks = []
    for match in _PYTHON_BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(f"{path.relative_to(ROOT)}:{line}", match.group(1), before.strip() == FRAGMENT))
    return blocks


@pytest.mark.fast
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_explains(path):
    pipeline = load_pipeline(str(path))
    text = pipeline.explain()
    assert text.startswith(f"pipeline {pipeline.name!r}")
    assert "guarantee:" in text


@pytest.mark.fast
def test_examples_exist():
    assert {p.stem for p in EXAMPLES} >= {"word_count", "windowed_word_count", "ysb", "sessions", "files_to_postgres"}


def test_testing_doc_example_runs(spark):
    """The example in docs/testing.md, run as written."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "testing.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/testing.md", "exec"), namespace)
    namespace["test_counts_per_window"]()


PROGRESS_LINE = re.compile(r"^batch \d+ \| ")
NOISE = ("[warning]", "WARN", "Python worker", "Traceback", "Exception")


def only_progress(stderr: str) -> bool:
    """Nothing on stderr but the progress lines: no traceback, no warning."""
    return not [line for line in stderr.splitlines() if not PROGRESS_LINE.match(line)] and \
        not [word for word in NOISE if word in stderr]


def headrace_command() -> list[str]:
    """``headrace`` as a user types it: the console script beside this Python, else the module."""
    script = Path(sys.executable).with_name("headrace")
    return [str(script)] if script.exists() else [sys.executable, "-m", "headrace.cli"]


def test_readme_tour_runs_as_the_readme_says_quietly_on_a_first_run(tmp_path):
    """The README's tour saved as words.py: ``headrace explain words.py`` prints the plan and starts
    nothing (the file calls ``p.run()``); ``headrace run words.py`` runs it, its functions reaching
    Spark's workers, on a first run (no JVM class archive yet: the JVM writes one as it exits) with
    nothing on stderr but the progress lines: no JVM class-data warnings, no Python-worker chatter."""
    (tmp_path / "words.py").write_text(python_blocks(ROOT / "README.md")[0].code)
    env = {**os.environ, "HEADRACE_CACHE_DIR": str(tmp_path / "cache"), "PYSPARK_PYTHON": sys.executable}

    def headrace(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*headrace_command(), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900)

    explained = headrace("explain", "words.py")
    assert explained.returncode == 0, explained.stderr
    assert explained.stdout.count("pipeline 'word_counts'") == 2  # the file's print(p.explain()), then the command's
    assert "--- batch" not in explained.stdout and explained.stderr == ""
    assert not (tmp_path / ".headrace").exists()  # no checkpoint, no Spark log: nothing ran

    ran = headrace("run", "words.py")
    assert ran.returncode == 0, ran.stderr
    assert "fused Python stage #1" in ran.stdout
    assert "--- batch" in ran.stdout and "window_start" in ran.stdout
    assert "word_counts: 20,000 rows in 2 batches, 0 dead letters, stopped: input exhausted" in ran.stdout
    assert only_progress(ran.stderr), ran.stderr
    assert list((tmp_path / "cache" / "jvm").glob("*.jsa")), "not a first run: no class archive was written"


def test_fraud_alerts_run_as_a_script_prints_what_docs_process_md_shows_and_nothing_else(tmp_path):
    """``python examples/fraud_alerts.py`` in a new process prints the lines docs/process.md shows;
    its process step runs on Spark's transformWithStateInPandas, whose runner's chatter does not
    reach stderr."""
    env = {**os.environ, "HEADRACE_STATE_DIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run([sys.executable, "examples/fraud_alerts.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert not [word for word in NOISE if word in result.stderr] and result.stderr.strip() == "", result.stderr
    doc = (ROOT / "docs" / "process.md").read_text()
    shown = doc.split("prints:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    printed = [line for line in result.stdout.splitlines() if line.strip()]
    assert printed == shown == ["card 4711: 0.50 then 900.00 (alert 1)", "card 4711: 0.25 then 650.00 (alert 2)"]


def test_late_data_run_as_a_script_prints_its_panes_and_the_record_it_dropped(spark, capsys):
    """``python examples/late_data.py``: an early pane after two readings (1 + 2), the on-time pane
    at the watermark (+ 3), a late pane within the allowed lateness (+ 4, accumulating), and the
    reading of 5 s, past the lateness, in the late side output."""
    import runpy

    runpy.run_path(str(ROOT / "examples" / "late_data.py"), run_name="__main__")
    printed = capsys.readouterr().out.splitlines()
    panes = [tuple(int(n) for n in re.findall(r"total=(\d+) n=(\d+)", line)[0]) for line in printed if "pane" in line]
    assert panes == [(1 + 2, 2), (1 + 2 + 3, 3), (1 + 2 + 3 + 4, 4)], printed
    assert [line.split()[0:2] for line in printed if "pane" in line] == [["a", "[00:00:00,"]] * 3
    dropped = [line for line in printed if line.startswith("dropped by")]
    assert len(dropped) == 1 and '"value": 5' in dropped[0] and "[00:00:00, 00:00:10)" in dropped[0], printed


@pytest.mark.parametrize("name", ["word_count", "sessions"])  # windowed_word_count: 500,000 rows a batch, slow
def test_a_generator_example_runs_with_headrace_run(name, spark, tmp_path, capsys):
    """``headrace run examples/NAME.py``, stopped after a few seconds (``--max-seconds``, as a user
    stops it with Ctrl-C): it runs, and its summary says why it stopped."""
    from headrace.cli import main

    path = ROOT / "examples" / f"{name}.py"
    assert f"headrace run examples/{name}.py" in path.read_text()
    assert main(["run", str(path), "--max-seconds", "10", "--quiet", "--state-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().err == ""


def test_apex_word_count_prints_what_docs_operators_md_shows(spark, capsys):
    """examples/apex_word_count.py, run as a script, prints the output docs/operators.md shows."""
    import runpy

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "apex_word_count.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    doc = (root / "docs" / "operators.md").read_text()
    shown = doc.split("prints:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed == shown
    assert shown[1] == "  from window 0: brown=1 dog=2 fox=1 jumps=1 lazy=1 over=1 quick=1 sleeps=1 the=3"


def test_two_stage_windows_prints_what_docs_windows_md_shows(spark, capsys):
    """examples/two_stage_windows.py, run as a script, prints the output docs/windows.md shows."""
    import runpy

    root = Path(__file__).resolve().parents[1]
    runpy.run_path(str(root / "examples" / "two_stage_windows.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if "busiest minute" in line]
    doc = (root / "docs" / "windows.md").read_text()
    shown = doc.split("`python examples/two_stage_windows.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines() == [
        "cart [00:00, 00:05) busiest minute 1, total 2",
        "home [00:00, 00:05) busiest minute 3, total 6",
        "home [00:05, 00:10) busiest minute 1, total 1",
    ]


def test_auction_bids_prints_what_docs_joins_md_shows_and_a_model_computes(spark, capsys):
    """examples/auction_bids.py, run as a script, prints the output docs/joins.md shows, which a
    plain-Python join and count of the example's records gives too."""
    import runpy

    namespace = runpy.run_path(str(ROOT / "examples" / "auction_bids.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if "takings=" in line]
    doc = (ROOT / "docs" / "joins.md").read_text()
    shown = doc.split("`python examples/auction_bids.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    auctions = [a for batch in namespace["auctions"].steps[:2] for a in batch]
    totals: dict[tuple[int, str], list[int]] = {}
    for batch in namespace["bids"].steps[:2]:
        for bid in batch:
            for auction in auctions:
                if auction["id"] == bid["auction"] and -3_600_000 <= auction["opened"] - bid["at"] <= 0:
                    entry = totals.setdefault((bid["at"] // 60_000, auction["seller"]), [0, 0])
                    entry[0] += 1
                    entry[1] += bid["price"]
    assert printed == [f"{seller} [00:{minute:02}, 00:{minute + 1:02}) bids={n} takings={total}"
                       for (minute, seller), (n, total) in sorted(totals.items())]


def test_nexmark_winning_bids_prints_what_docs_sql_md_shows_and_a_model_computes(spark, capsys):
    """examples/nexmark_winning_bids.py, run as a script, prints the output docs/sql.md shows, which
    plain Python computes too from the example's records: each auction's highest bid while it ran
    (the earlier of equal ones), then per seller the average of its last two, in the order they end."""
    import runpy

    namespace = runpy.run_path(str(ROOT / "examples" / "nexmark_winning_bids.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("auction ", "seller "))]
    doc = (ROOT / "docs" / "sql.md").read_text()
    shown = doc.split("`python examples/nexmark_winning_bids.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    auctions = [a for batch in namespace["auctions"].steps[:3] for a in batch]
    bids = [b for batch in namespace["bids"].steps[:3] for b in batch]
    winners = []
    for a in sorted(auctions, key=lambda a: (a["expires"], a["id"])):
        during = [b for b in bids if b["auction"] == a["id"] and a["dateTime"] <= b["dateTime"] <= a["expires"]]
        best = min(during, key=lambda b: (-b["price"], b["dateTime"]))
        winners.append((a, best))
    expected = [f"auction {a['id']} (seller {a['seller']}, ended {a['expires'] // 60_000:02}:"
                f"{a['expires'] // 1000 % 60:02}): bidder {b['bidder']} at {b['price']}"
                for a, b in sorted(winners, key=lambda w: w[0]["id"])]
    last: dict[int, list[int]] = {}
    averages = []
    for a, b in winners:
        prices = last.setdefault(a["seller"], [])
        prices.append(b["price"])
        averages.append((a["seller"], a["id"], sum(prices[-2:]) / len(prices[-2:])))
    expected += [f"seller {seller} after auction {auction}: average {average:.1f}"
                 for seller, auction, average in sorted(averages)]
    assert printed == expected


# -- every python block of the README and docs/ ---------------------------------------------------
# A ```python block is a complete program unless the line before it is <!-- fragment --> (docs/testing.md).
# A complete block is loaded as `headrace explain FILE` loads a file: its pipeline is built and checked,
# and a run it starts is deferred, never started. Those that run to an end and show their output
# are run as their text says, by the tests named here.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [block for path in DOCS for block in python_blocks(path)]
RUN_BY_THEIR_OWN_TEST = {  # a string in the block -> the test that runs it
    'hr.Pipeline("word_counts")': "test_readme_tour_runs_as_the_readme_says_quietly_on_a_first_run",
    "def test_counts_per_window": "test_testing_doc_example_runs",
    'hr.Pipeline("sql_word_count")': "tests/test_sql.py::test_the_word_count_in_docs_sql_md_prints_what_it_shows",
    'hr.Pipeline("accounts_cdc")': "test_the_cdc_block_of_docs_connectors_md_prints_what_it_shows",
    'hr.Pipeline("orders_by_country")':
        "tests/test_files_partitioning.py::test_the_partitioned_files_of_docs_connectors_md_print_what_it_shows",
    'hr.Pipeline("first_orders")': "tests/test_dedupe.py::test_the_example_of_docs_dedupe_md_prints_what_it_shows",
    'hr.Pipeline("bids_per_minute")':
        "tests/test_window_joins.py::test_the_delay_example_of_docs_joins_md_prints_what_it_shows",
    "Client.find()": "tests/test_server.py::test_queryable_views_answer_as_counted_in_python_through_the_cli_the_api_"
                     "and_the_client",
}
COMPLETE = [b for b in BLOCKS if not b.fragment and not any(s in b.code for s in RUN_BY_THEIR_OWN_TEST)]


def block_of(marker: str) -> Block:
    (block,) = [b for b in BLOCKS if marker in b.code and not b.fragment]
    return block


@pytest.mark.fast
def test_each_block_run_by_its_own_test_is_in_the_docs():
    assert len({block_of(marker).where for marker in RUN_BY_THEIR_OWN_TEST}) == len(RUN_BY_THEIR_OWN_TEST)


@pytest.mark.fast
@pytest.mark.parametrize("block", COMPLETE, ids=[b.where for b in COMPLETE])
def test_a_complete_doc_block_loads_as_headrace_explain_loads_it(block, tmp_path, monkeypatch):
    from headrace.api.stream import Pipeline
    from headrace.cli import load_user_file

    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"block_{block.where.replace('/', '_').replace('.', '_').replace(':', '_')}.py"
    path.write_text(block.code)
    module, ran = load_user_file(str(path))
    pipelines = {id(p): p for p in [ran, *vars(module).values()] if isinstance(p, Pipeline)}
    for pipeline in pipelines.values():
        assert pipeline.explain().startswith(f"pipeline {pipeline.name!r}")
    assert not (tmp_path / ".headrace").exists()  # nothing ran


def test_the_cdc_block_of_docs_connectors_md_prints_what_it_shows(spark, pg, capsys):
    """The change data capture block of docs/connectors.md, run as a script against PostgreSQL: the
    changes it prints and the live copy's last state are those the docs show."""
    block = block_of('hr.Pipeline("accounts_cdc")')
    exec(compile(block.code, block.where, "exec"), {"__name__": "__main__"})
    printed = capsys.readouterr().out
    doc = (ROOT / "docs" / "connectors.md").read_text()
    shown = doc.split(block.code, 1)[1].split("```\n")[2]  # the block, a paragraph, then its output

    def changes(text: str) -> list[str]:
        return sorted(line for line in text.splitlines() if line.startswith("|") and not line.startswith("|op"))

    assert changes(printed) == changes(shown) and len(changes(shown)) == 4, printed
    assert printed.splitlines()[-1] == shown.splitlines()[-1] == "[(1, 'ana', 15)]"


def _reachable(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("name, service, port", [("redis_clicks", "Redis", 6379), ("nats_orders", "NATS", 4222),
                                                 ("rabbitmq_big_orders", "RabbitMQ Streams", 5552)])
def test_a_service_example_run_as_a_script_prints_what_docs_connectors_md_shows(name, service, port, spark, capsys):
    """``python examples/NAME.py`` against the real service prints what docs/connectors.md shows."""
    import runpy

    from conftest import service_or_skip

    service_or_skip(service, _reachable(port), f"nothing listens on 127.0.0.1:{port}")
    runpy.run_path(str(ROOT / "examples" / f"{name}.py"), run_name="__main__")
    printed = capsys.readouterr().out.splitlines()
    doc = (ROOT / "docs" / "connectors.md").read_text()
    shown = doc.split(f"`examples/{name}.py` is this pipeline", 1)[1].split("```\n")[1]  # the next output block
    assert printed == shown.splitlines()
    if name == "rabbitmq_big_orders":  # the orders of 10 or more, in order, keyed by user
        orders = [("ana", 12), ("bob", 3), ("ana", 40), ("cy", 7), ("bob", 25)]
        big = [(i, user, amount) for i, (user, amount) in enumerate(orders) if amount >= 10]
        assert printed == [f'{offset} {{"order_id":{i},"user":"{user}","amount":{amount}}} '
                           f"{{b'key': b'{user}'}}" for offset, (i, user, amount) in enumerate(big)]
    if name == "redis_clicks":  # nine clicks (ms after midnight, user), counted per 10 s window by hand
        clicks = [(0, "ana"), (2_000, "bob"), (4_000, "ana"), (9_999, "ana"), (10_000, "bob"), (12_500, "ana"),
                  (15_000, "bob"), (21_000, "ana"), (29_000, "bob")]
        counts = Counter((at // 10_000, user) for at, user in clicks)
        assert printed == [f"00:00:{w}0-00:00:{w + 1}0 {user}: {n}" for (w, user), n in sorted(counts.items())]


def test_files_to_postgres_runs_with_headrace_run_as_its_docstring_says(spark, pg, tmp_path, monkeypatch):
    """examples/files_to_postgres.py: the two lines its docstring writes to the input folder, then
    ``headrace run`` (stopped after a while, as Ctrl-C would): the order reaches PostgreSQL with its
    amount in cents, the line that is not JSON the dead-letter table."""
    import psycopg
    from conftest import PG_DSN

    from headrace.cli import main

    database = "headrace_example_files_to_postgres"
    if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
        pg.execute(f"CREATE DATABASE {database}")
    dsn = PG_DSN.rsplit("/", 1)[0] + "/" + database
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS orders, orders_dead_letters")
    folder = tmp_path / "orders"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"order_id": 1, "amount": 9.5, "ts": "2026-01-01T10:00:00Z"}\nnot json\n')
    path = ROOT / "examples" / "files_to_postgres.py"
    assert "headrace run examples/files_to_postgres.py" in path.read_text()
    monkeypatch.setenv("HEADRACE_EXAMPLE_INPUT", str(folder))
    monkeypatch.setenv("HEADRACE_EXAMPLE_DSN", dsn)
    assert main(["run", str(path), "--max-seconds", "20", "--quiet", "--state-dir", str(tmp_path / "state")]) == 0
    with psycopg.connect(dsn, autocommit=True) as db:
        assert db.execute("SELECT order_id, amount, amount_cents FROM orders").fetchall() == [(1, 9.5, 950)]
        assert db.execute("SELECT count(*) FROM orders_dead_letters").fetchone() == (1,)
        db.execute("DROP TABLE orders, orders_dead_letters")


# -- the examples that run until stopped or on a lot of generated input ---------------------------
# Each runs as its docstring says (`headrace run examples/NAME.py`, in a process group of its own),
# stopped as a user stops it: Ctrl-C once its output is there, or --max-seconds.

class Example:
    """``with Example(NAME, folder, *ARGS) as run``: ``headrace run examples/NAME.py ARGS`` in a process
    group of its own, its stdout and stderr kept in files; the group is killed if still there at the end."""

    def __init__(self, name: str, folder: Path, *args: str) -> None:
        path = ROOT / "examples" / f"{name}.py"
        assert f"headrace run examples/{name}.py" in path.read_text()
        self.out, self.err = folder / "stdout", folder / "stderr"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "headrace.cli", "run", str(path), "--state-dir", str(folder / "state"), *args],
                cwd=ROOT, env={**os.environ, "PYSPARK_PYTHON": sys.executable}, stdout=out, stderr=err,
                start_new_session=True)

    def __enter__(self) -> Example:
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def wait_for(self, done: Callable[[], bool], timeout: float = 120) -> None:
        """Poll ``done`` until it holds; fails if the run ends or the time runs out first."""
        deadline = time.time() + timeout
        while not done():
            assert self.proc.poll() is None, f"the run ended ({self.proc.returncode}): {self.err.read_text()[-3000:]}"
            assert time.time() < deadline, f"not done within {timeout} s: {self.err.read_text()[-3000:]}"
            time.sleep(0.5)

    def finish(self, timeout: float = 120, ctrl_c: bool = False) -> tuple[int, str, str]:
        """Exit status, stdout and stderr, after a Ctrl-C to the whole group if asked."""
        if ctrl_c:
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"headrace run did not end within {timeout} s")
        return self.proc.returncode, self.out.read_text(), self.err.read_text()


# -- Kafka: fixed topics, emptied first; input with record timestamps; output read read_committed --
KAFKA = "127.0.0.1:9092"


def kafka_or_skip() -> None:
    from conftest import service_or_skip

    pytest.importorskip("confluent_kafka")
    service_or_skip("Kafka", _reachable(9092), f"nothing listens on {KAFKA} (bash scripts/kafka.sh start)")


def fresh_topics(*names: str) -> None:
    """Delete the topics and create them again (one partition each): no record of an earlier run is left."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": KAFKA})
    for future in admin.delete_topics(list(names)).values():
        with contextlib.suppress(KafkaException):  # no such topic yet
            future.result(30)
    deadline = time.time() + 60
    while set(names) & set(admin.list_topics(timeout=30).topics):  # the deletion is asynchronous
        assert time.time() < deadline, f"topics {names} still there 60 s after their deletion"
        time.sleep(0.2)
    todo = set(names)
    while todo:
        for name, future in admin.create_topics([NewTopic(name, 1, 1) for name in todo]).items():
            try:
                future.result(30)
                todo.discard(name)
            except KafkaException as error:  # still being deleted: try again
                if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.time() > deadline:
                    raise
        time.sleep(0.2 if todo else 0)


def produce(topic: str, records: list[tuple[str | bytes, int | None]]) -> None:
    """(value, record timestamp in epoch ms, or None for the producer's clock) each."""
    from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

    def end() -> int:  # the topic's one partition's end offset
        deadline = time.time() + 60
        while True:
            consumer = Consumer({"bootstrap.servers": KAFKA, "group.id": "headrace-test-ends"})
            try:
                return int(consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1])
            except KafkaException as error:  # a topic just made has no leader, or is not known here, for a moment
                transient = error.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                                     KafkaError.LEADER_NOT_AVAILABLE,
                                                     KafkaError.UNKNOWN_TOPIC_OR_PART,
                                                     KafkaError._UNKNOWN_PARTITION)
                if not transient or time.time() > deadline:
                    raise
            finally:
                consumer.close()
            time.sleep(0.2)

    producer, failed = Producer({"bootstrap.servers": KAFKA}), []
    for _attempt in range(3):  # a topic just made again may take the first writes for the one deleted
        before = end()
        failed.clear()
        for value, ms in records:
            producer.produce(topic, value=value, on_delivery=lambda error, _msg: error and failed.append(error),
                             **({"timestamp": ms} if ms is not None else {}))
        assert producer.flush(30) == 0 and not failed, failed  # each record acknowledged by the broker
        if end() - before == len(records):
            return
        time.sleep(1)
    pytest.fail(f"the records written to {topic} do not show in it")


def epoch_ms(text: str) -> int:
    return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)


def test_kafka_orders_runs_as_its_docstring_says_and_writes_each_total_once(tmp_path):
    """examples/kafka_orders.py: orders with record timestamps in two minutes, a record past the second
    minute's end + 5 s that closes both, and a value that is not JSON; ``headrace run``, then Ctrl-C
    once the totals are there: exit 0, the totals per user and minute (read_committed) are those
    computed here, the bad value is in the dead-letter topic, stderr holds only progress lines."""
    from headrace.testing.kafka import read_topic

    kafka_or_skip()
    fresh_topics("orders", "order_totals", "orders_dead_letters")
    t0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z, a minute boundary
    orders = [("ana", 12, 1_000), ("bob", 3, 20_000), ("ana", 40, 59_999), ("bob", 5, 60_000), ("cy", 7, 90_000),
              ("ana", 1, 119_999)]
    closing = ("zed", 1, 126_000)  # its minute stays open: the watermark is 121 s
    produce("orders", [(json.dumps({"user": u, "amount": a}), t0 + at) for u, a, at in [*orders, closing]]
            + [(b"not json", t0 + 30_000)])
    totals: dict[tuple[str, int], list[int]] = {}
    for user, amount, at in orders:
        total = totals.setdefault((user, t0 + at - at % 60_000), [0, 0])
        total[0] += amount
        total[1] += 1
    expected = sorted((user, start, start + 60_000, total, n) for (user, start), (total, n) in totals.items())

    def written() -> list[tuple]:
        return sorted((r.key, epoch_ms(v["window_start"]), epoch_ms(v["window_end"]), v["total"], v["orders"])
                      for r in read_topic(KAFKA, "order_totals") for v in [r.json()])

    with Example("kafka_orders", tmp_path) as run:
        run.wait_for(lambda: len(written()) >= len(expected))
        code, out, err = run.finish(ctrl_c=True)
    assert code == 0, err[-3000:]
    assert written() == expected
    dead = [r.json() for r in read_topic(KAFKA, "orders_dead_letters")]
    assert [(d["source"], d["raw"]) for d in dead] == [("orders", "not json")], dead
    assert f"kafka_orders: {len(orders) + 2} rows in" in out and "1 dead letters, stopped: signal SIGINT" in out, out
    assert only_progress(err), err


def test_kafka_fraud_alerts_runs_in_real_time_mode_as_its_docstring_says(tmp_path):
    """examples/kafka_fraud_alerts.py: payments before the start and while it runs; ``headrace run``,
    then Ctrl-C once the alerts are there: exit 0, the alerts (amount over 1000 or a blocked country,
    with the country's risk) are those listed here, the ones produced while it ran came out before
    the Ctrl-C, and stderr holds only progress lines. (Their latency: benchmarks/kafka.py.)"""
    from headrace.testing.kafka import read_topic

    kafka_or_skip()
    fresh_topics("payments", "fraud_alerts")
    before = [("c1", 2500.0, "XX"), ("c2", 50.0, "US"), ("c3", 1500.0, "YY")]
    later = [("c4", 10.0, "XX"), ("c5", 1000.0, "DE"), ("c6", 999.5, "YY"), ("c7", 1000.5, None)]
    alerts = [("c1", 2500.0, "XX", "blocked"), ("c3", 1500.0, "YY", "watched"),  # by hand
              ("c4", 10.0, "XX", "blocked"), ("c7", 1000.5, None, None)]

    def payments(rows: list[tuple]) -> list[tuple[str, None]]:
        return [(json.dumps({"card": c, "amount": a, "country": k}), None) for c, a, k in rows]

    def written() -> list:
        return read_topic(KAFKA, "fraud_alerts")

    produce("payments", payments(before))
    with Example("kafka_fraud_alerts", tmp_path) as run:
        run.wait_for(lambda: len(written()) >= 2)
        produce("payments", payments(later))
        run.wait_for(lambda: len(written()) >= len(alerts), timeout=30)
        code, out, err = run.finish(ctrl_c=True)
    assert code == 0, err[-3000:]
    records = written()  # keyed by card; a null field is left out of the JSON value
    assert sorted((r.key, v.get("amount"), v.get("country"), v.get("risk")) for r in records
                  for v in [r.json()] if v["card"] == r.key) == alerts
    assert "stopped: signal SIGINT" in out, out
    assert only_progress(err), err


# -- bounded Generator examples: what each printed batch shows, worked out from the input ---------
# a Generator's event i is at FROM + i * EVERY µs (headrace/connectors/generator.py, no rate, default start)
GENERATED_FROM_US, GENERATED_EVERY_US = 1_700_000_000_000_000, 10


def printed_tables(stdout: str) -> list[tuple[int, list[str], list[list[str]]]]:
    """The Console sink's tables: batch id, columns and rows, as cell texts."""
    def cells(line: str) -> list[str]:
        return [cell.strip() for cell in line.strip("|").split("|")]

    lines, tables = stdout.splitlines(), []
    for i, line in enumerate(lines):
        if found := re.fullmatch(r"--- batch (\d+) ---", line):
            rows = itertools.takewhile(lambda row: row.startswith("|"), lines[i + 4:])
            tables.append((int(found[1]), cells(lines[i + 2]), [cells(row) for row in rows]))
    return tables


def check_windows_printed(stdout: str, name: str, kind: str, keys: Callable[[Any], Iterable[str]], *, key: str,
                          value: str, limit: int, rows_per_batch: int, window_s: int, late_s: int) -> int:
    """The output of a pipeline of one ``Generator(kind, limit=, rows_per_batch=)`` source, a tumbling
    window per key counting what ``keys`` gives for a batch of events, and ``Console(limit=10)``: the
    tables are batches 0, 1, ... as the summary counts; batch b shows the windows that the watermark
    in b (the latest event time of the batches before b, less the out-of-orderness; all windows once
    the input is read) closed first, at most 10 of them, with their counts. Returns the rows shown."""
    from headrace.connectors.generator import generate

    summary = re.search(rf"^{name}: ([\d,]+) rows in (\d+) batches, 0 dead letters, stopped: ", stdout, re.M)
    assert summary, stdout[-3000:]
    rows, batches = int(summary[1].replace(",", "")), int(summary[2])
    read, size, events_per_window = -(-rows // rows_per_batch), window_s * 10**6, window_s * 10**6 // GENERATED_EVERY_US

    def watermark(b: int) -> float:
        if b >= read and rows == limit:  # the last events came with the end-of-input flush
            return math.inf
        latest = GENERATED_FROM_US + (min(b, read) * rows_per_batch - 1) * GENERATED_EVERY_US
        return latest - latest % 1000 - late_s * 10**6 if b else -math.inf  # Spark keeps it in ms

    last = GENERATED_FROM_US + (rows - 1) * GENERATED_EVERY_US
    due = {start: next((b for b in range(batches) if watermark(b) >= start + size), None)
           for start in range(GENERATED_FROM_US - GENERATED_FROM_US % size, last + 1, size)}
    counts: Counter[tuple[str, int]] = Counter()
    for start in (start for start, b in due.items() if b is not None):
        first = (start - GENERATED_FROM_US) // GENERATED_EVERY_US
        end = min(rows, first + events_per_window)
        for offset in range(first, end, 1_000_000):
            counts.update((k, start) for k in keys(generate(kind, offset, min(end, offset + 1_000_000))))

    tables = printed_tables(stdout)
    assert [b for b, _, _ in tables] == list(range(batches)), stdout[-3000:]
    shown = [(b, k, *(round(datetime.datetime.fromisoformat(t).timestamp() * 10**6) for t in (start, end)), int(n))
             for b, columns, printed in tables for k, start, end, n in printed]
    assert all(columns == [key, "window_start", "window_end", value] for _, columns, _ in tables), stdout[-3000:]
    for b, _, printed in tables:
        assert len(printed) == min(10, sum(1 for k in counts if due[k[1]] == b)), (b, printed)
    assert all(due[start] == b and end - start == size and counts[k, start] == n for b, k, start, end, n in shown)
    assert len({(k, start) for _, k, start, _, _ in shown}) == len(shown)  # no window twice
    return len(shown)


def test_windowed_word_count_runs_as_its_docstring_says(tmp_path):
    """``headrace run examples/windowed_word_count.py`` to the end of its 300,000 lines: exit 0, only
    progress lines on stderr, and each batch shows the windows its watermark closed with the words
    counted here from the input."""
    with Example("windowed_word_count", tmp_path) as run:
        code, out, err = run.finish()
    assert code == 0 and only_progress(err), err[-3000:]
    assert "stopped: input exhausted" in out, out[-3000:]

    def words(events: Any) -> Iterator[str]:
        return (word.lower() for line in events.column("line").to_pylist() for word in line.split())

    check_windows_printed(out, "windowed_word_count", "words", words,
                          key="word", value="n", limit=300_000, rows_per_batch=100_000, window_s=1, late_s=1)


def test_ysb_runs_as_its_docstring_says(tmp_path):
    """``headrace run examples/ysb.py`` to the end of its 3,000,000 events (about 30 s): exit 0, only
    progress lines on stderr, and each batch shows the campaigns' views in the windows its watermark
    closed, counted here from the input (ad k is in campaign k // 10: ysb_ads in headrace/connectors/generator.py)."""
    def views(events: Any) -> Iterator[str]:
        import pyarrow.compute as pc

        ads = pc.filter(events.column("ad_id"), pc.equal(events.column("event_type"), "view")).to_pylist()
        return (f"campaign-{int(ad[3:]) // 10:02d}" for ad in ads)

    with Example("ysb", tmp_path) as run:
        code, out, err = run.finish()
    assert code == 0 and only_progress(err), err[-3000:]
    # three batches of 1,000,000 events (10 s of event time each), then the one the end of input closes
    assert "ysb: 3,000,000 rows in 4 batches, 0 dead letters, stopped: input exhausted" in out, out[-3000:]
    shown = check_windows_printed(out, "ysb", "ysb", views, key="campaign_id", value="views", limit=3_000_000,
                                  rows_per_batch=1_000_000, window_s=10, late_s=1)
    assert shown == 10 + 10  # 10 of the 100 campaigns' first window, then 10 of the last two windows' 200


def test_late_bids_prints_what_docs_joins_md_shows_and_a_model_computes(spark, capsys):
    """examples/late_bids.py, run as a script, prints the output docs/joins.md shows: the pairs and
    the late records that a plain-Python join computes from the example's records, a record being
    late when its time is at or before the watermark after the batch before (the smaller of the
    sides' largest event times so far)."""
    import json
    import runpy

    namespace = runpy.run_path(str(ROOT / "examples" / "late_bids.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("bid ", "late "))]
    doc = (ROOT / "docs" / "joins.md").read_text()
    shown = doc.split("`python examples/late_bids.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    bid_batches, auction_batches = namespace["bids"].steps[:2], namespace["auctions"].steps[:2]
    on_time: dict[str, list[dict]] = {"left": [], "right": []}
    late: list[tuple[int, str]] = []
    mark = None
    seen: dict[str, list[int]] = {"left": [], "right": []}
    for bids, auctions in zip(bid_batches, auction_batches):
        for side, records, field, key in (("left", bids, "at", "auction"), ("right", auctions, "opened", "id")):
            for record in records:
                if mark is not None and record[field] <= mark:
                    late.append((record[field], f"late {side} record, key {record[key]}, at "
                                               f"{record[field] // 60_000:02}:{record[field] // 1000 % 60:02}: "))
                else:
                    on_time[side].append(record)
            seen[side] += [r[field] for r in records]
        mark = min(max(seen["left"]), max(seen["right"]))
    pairs = sorted((b["at"], b["price"], b["auction"], a["seller"]) for b in on_time["left"] for a in on_time["right"]
                   if a["id"] == b["auction"] and -3_600_000 <= a["opened"] - b["at"] <= 0)
    assert printed[:len(pairs)] == [f"bid {price} at {at // 60_000:02}:{at // 1000 % 60:02} on auction {auction} of "
                                    f"{seller}" for at, price, auction, seller in pairs]
    late_lines = printed[len(pairs):]
    assert [line.split(": {", 1)[0] + ": " for line in late_lines] == [text for _, text in sorted(late)]
    for line in late_lines:  # the record as JSON, its event time as Spark writes a timestamp
        assert "at" in json.loads(line.split(": ", 1)[1]) or "opened" in json.loads(line.split(": ", 1)[1])


def test_titanic_scoring_prints_what_docs_ml_md_shows_with_its_acceptance_figures(tmp_path):
    """``python examples/titanic_scoring.py`` in a new process, as docs/ml.md says to run it: it prints
    the lines docs/ml.md shows, whose figures meet the lab's thresholds, and nothing on stderr."""
    pytest.importorskip("sklearn", reason="the ml extra: pip install -e '.[ml]'")
    env = {**os.environ, "HEADRACE_STATE_DIR": str(tmp_path), "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run([sys.executable, "examples/titanic_scoring.py"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
    doc = (ROOT / "docs" / "ml.md").read_text()
    shown = doc.split("prints:\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    printed = result.stdout.splitlines()
    assert printed == shown
    auc, accuracy = (float(x) for x in re.findall(r"AUC ([\d.]+), accuracy ([\d.]+)", printed[1])[0])
    assert auc >= 0.80 and accuracy >= 0.75
    assert printed[0] == "held-out passengers: 263" and printed[2].startswith("scored in the stream: 263 passengers")
    for line in (printed[3], printed[6]):  # scikit-learn's, then Spark MLlib's
        difference, differing = re.findall(r": ([\d.e+-]+); predictions that differ: (\d+)$", line)[0]
        assert float(difference) <= 1e-12 and differing == "0"
    assert printed[5] == "scored in the stream: 263 passengers by model version 2"


def test_online_learning_prints_what_docs_ml_md_shows_and_river_alone_computes(spark, capsys):
    """examples/online_learning.py, run as a script, prints the lines docs/ml.md shows: each sensor's
    accuracy before the flip and at the end, and where the drift is flagged, as River computes them
    alone on the example's readings (in time order, a model per sensor)."""
    import runpy

    pytest.importorskip("river", reason="the ml extra: pip install -e '.[ml]'")
    from river import drift, metrics

    namespace = runpy.run_path(str(ROOT / "examples" / "online_learning.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("s")]
    doc = (ROOT / "docs" / "ml.md").read_text()
    shown = doc.split("`python examples/online_learning.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    expected = []
    for sensor in ("s0", "s1"):
        model, accuracy, adwin = namespace["model"](), metrics.Accuracy(), drift.ADWIN()
        flags, at_flip, seen = [], None, 0
        for r in (r for r in namespace["readings"]() if r["sensor"] == sensor):
            x = {"a": r["a"], "b": r["b"], "c": r["c"]}
            predicted = model.predict_one(x)
            if predicted is not None:
                accuracy.update(r["alarm"], predicted)
            before = adwin.estimation
            adwin.update(float(predicted != r["alarm"]))
            if adwin.drift_detected and adwin.estimation > before:
                flags.append(f"{r['ts'] // 1000} s")
            model.learn_one(x, r["alarm"])
            seen += 1
            if r["ts"] < namespace["FLIP"] * 1000:
                at_flip = accuracy.get()
        expected.append(f"{sensor}: {seen} readings learnt; accuracy {at_flip:.3f} before the flip, "
                        f"{accuracy.get():.3f} at the end; drift flagged at {', '.join(flags) or 'no time'}")
    assert printed == expected


def test_rolling_spend_prints_what_docs_ml_md_shows_and_a_model_computes(spark, capsys):
    """examples/rolling_spend.py, run as a script, prints the lines docs/ml.md shows: for each charge,
    its card's charges, spend and largest charge in the 10 minutes up to it, computed here in plain
    Python from the example's charges, and the charges over 300."""
    import runpy

    namespace = runpy.run_path(str(ROOT / "examples" / "rolling_spend.py"), run_name="__main__")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("card ", "suspicious"))]
    doc = (ROOT / "docs" / "ml.md").read_text()
    shown = doc.split("`python examples/rolling_spend.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    charges = [c for batch in namespace["charges"].steps if isinstance(batch, list) for c in batch]
    lines, suspicious = [], []
    for c in sorted(charges, key=lambda c: (c["card"], c["ts"])):
        window = [o["amount"] for o in charges if o["card"] == c["card"] and c["ts"] - 600_000 < o["ts"] <= c["ts"]]
        at = f"{c['ts'] // 3_600_000:02}:{c['ts'] // 60_000 % 60:02}"
        lines.append(f"card {c['card']} at {at}: {c['amount']:>3}, in the 10 minutes up to it {len(window)} charges, "
                     f"spend {sum(window)}, largest {max(window)}")
        if sum(window) > 300:
            suspicious.append((c["ts"], f"suspicious: card {c['card']} at {at} (spend {sum(window)})"))
    assert printed == lines + [text for _, text in sorted(suspicious)]


def test_enrich_orders_prints_what_docs_enrich_md_shows_and_its_service_answers(spark, capsys):
    """examples/enrich_orders.py, run as a script, prints the output docs/enrich.md shows: each
    order with its card's country and risk as the example's service knows them (the busy first
    call of c2 tried again), in the orders' order, and the order of the unknown card as a dead
    letter."""
    import json
    import runpy

    pytest.importorskip("aiohttp", reason="the enrich extra: pip install -e '.[enrich]'")
    namespace = runpy.run_path(str(ROOT / "examples" / "enrich_orders.py"), run_name="__main__")
    printed = capsys.readouterr().out.splitlines()
    doc = (ROOT / "docs" / "enrich.md").read_text()
    shown = doc.split("`python examples/enrich_orders.py` prints:\n\n```\n", 1)[1].split("```", 1)[0]
    assert printed == shown.splitlines()
    cards = namespace["CARDS"]
    known = [o for o in namespace["ORDERS"] if o["card"] in cards]
    assert printed[:len(known)] == [f"order {o['order']}: {o['amount']:5.1f} on card {o['card']} from "
                                    f"{cards[o['card']][0]}, risk {cards[o['card']][1]}" for o in known]
    unknown = [o for o in namespace["ORDERS"] if o["card"] not in cards]
    assert [json.loads(line.split(": call", 1)[0].removeprefix("dead letter ")) for line in printed[len(known):]] \
        == unknown
