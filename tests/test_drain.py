"""``headrace run --drain``: an unbounded pipeline ended for good, its last windows fired.

The Spark test runs a left interval join chained into a window chained into a window, with
four sinks (the join's rows, both windows' results, the dead letters) on two unbounded file
sources: a first run, then more files, then a drain whose driver's process group is SIGKILLed
once it has logged its end, then the drain again. The outputs are compared with the same
computation in plain Python over every record (``model``): a drain gives what a bounded run
over the same files would. The rest checks the end-of-time log entry on hand-made checkpoints.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.contract import END_OF_INPUT_MS, FLUSH_TIME_MS
from headrace.environment import end_of_time
from headrace.errors import HeadraceError, IncompatibleCheckpoint, PlanError

T0 = 1_767_225_600_000  # 2026-01-01 00:00:00 UTC, in ms
S, M = 1_000, 60_000

PIPELINE = """import headrace as hr

p = hr.Pipeline("drained_bids")
auctions = p.source("auctions", hr.sources.Files({auctions!r}, schema="id long, seller string, opened timestamp"),
                    event_time="opened", max_out_of_orderness="5s")
bids = p.source("bids", hr.sources.Files({bids!r}, schema="auction long, price long, at timestamp"),
                event_time="at", max_out_of_orderness="5s")
joined = bids.join(auctions, on={{"auction": "id"}}, how="left", within=("-1h", "0s"), name="with_seller")
joined.sink("joined_out", hr.sinks.Files({out!r} + "/joined", format="jsonl"))
per_minute = (joined.key_by("seller").window(hr.Tumbling("1m"), name="per_minute")
              .aggregate(bids=hr.count(), takings=hr.sum("price")))
per_minute.sink("minutes_out", hr.sinks.Files({out!r} + "/per_minute", format="jsonl"))
(per_minute.key_by("seller").window(hr.Tumbling("5m"), name="per_five")
           .aggregate(minutes=hr.count(), bids=hr.sum("bids"))
           .sink("fives_out", hr.sinks.Files({out!r} + "/per_five", format="jsonl")))
p.dead_letters().sink("dead_out", hr.sinks.Files({out!r} + "/dead", format="jsonl"))
"""

AUCTIONS = [(1, "ann", T0), (2, "bob", T0 + 10 * S), (3, "ann", T0 + 20 * S)]
LATE_AUCTION = (9, "cy", T0 + 12 * M)  # opens after every bid, in a file added while the first run runs
FIRST_BIDS = [(1, 5, T0 + 40 * S), (2, 7, T0 + 50 * S), (5, 1, T0 + 70 * S), (1, 3, T0 + 2 * M + 5 * S),
              (3, 4, T0 + 2 * M + 10 * S)]
LATER_BIDS = [(2, 2, T0 + 4 * M), (3, 6, T0 + 6 * M + S), (7, 8, T0 + 7 * M), (1, 9, T0 + 9 * M + 30 * S)]
BAD_TIME = {"auction": 1, "price": 2, "at": "yesterday"}


def iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat().replace("+00:00", "Z")


def write_lines(path: Path, records: list[dict[str, Any]], bad: str | None = None) -> None:
    lines = [json.dumps(r) for r in records] + ([bad] if bad else [])
    path.write_text("\n".join(lines) + "\n")


def model() -> dict[str, Counter]:
    """The four outputs over every record, computed here: what a bounded run over all the files gives."""
    auctions = [*AUCTIONS, LATE_AUCTION]
    joined = []
    for auction, price, at in FIRST_BIDS + LATER_BIDS:
        sellers = [seller for aid, seller, opened in auctions if aid == auction and at - 3600 * S <= opened <= at]
        joined += [(auction, price, at, seller) for seller in sellers or [None]]
    minutes: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for _, price, at, seller in joined:
        minutes[(seller, at - at % M)].append(price)
    fives: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for (seller, start), prices in minutes.items():
        fives[(seller, start - start % (5 * M))].append(len(prices))
    return {
        "joined": Counter((a, p, iso(at), s) for a, p, at, s in joined),
        "per_minute": Counter((s, iso(start), len(p), sum(p)) for (s, start), p in minutes.items()),
        "per_five": Counter((s, iso(start), len(n), sum(n)) for (s, start), n in fives.items()),
        # a record whose time does not convert is a dead letter as its line was written
        "dead": Counter(["not a bid", json.dumps(BAD_TIME)]),
    }


def outputs(out: Path) -> dict[str, Counter]:
    from headrace.connectors.files_sink import read_rows

    def rows(name: str) -> list[dict[str, Any]]:
        return read_rows(str(out / name), "jsonl") if (out / name).exists() else []

    def stamp(text: str) -> str:
        return iso(int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000))

    return {
        "joined": Counter((r["auction"], r["price"], stamp(r["at"]), r.get("seller")) for r in rows("joined")),
        "per_minute": Counter((r.get("seller"), stamp(r["window_start"]), r["bids"], r["takings"])
                              for r in rows("per_minute")),
        "per_five": Counter((r.get("seller"), stamp(r["window_start"]), r["minutes"], r["bids"])
                            for r in rows("per_five")),
        "dead": Counter(r["raw"] for r in rows("dead")),
    }


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen]]:
    """The runs a test starts: each one's process group is killed when the test ends, failed or not."""
    runs: list[subprocess.Popen] = []
    yield runs
    for run in runs:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)


def headrace(started: list[subprocess.Popen], *args: str, cwd: Path) -> subprocess.Popen:
    run = subprocess.Popen([sys.executable, "-m", "headrace.cli", *args, "--state-dir", str(cwd / "state")],
                           cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, env={**os.environ, "PYSPARK_PYTHON": sys.executable})
    started.append(run)
    return run


def wait_for(what: str, check: Any, process: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert process.poll() is None, f"the run ended before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def logged_end(checkpoint: Path) -> bool:
    return end_of_time.pending_end(str(checkpoint)) is not None if (checkpoint / "offsets").exists() else False


def test_a_drain_killed_after_logging_its_end_then_drained_again_fires_every_window_once(
        tmp_path: Path, started: list[subprocess.Popen]):
    auctions_in, bids_in, out = tmp_path / "auctions", tmp_path / "bids", tmp_path / "out"
    auctions_in.mkdir()
    bids_in.mkdir()
    (tmp_path / "bids.py").write_text(PIPELINE.format(auctions=str(auctions_in), bids=str(bids_in), out=str(out)))
    write_lines(auctions_in / "a1.jsonl", [{"id": i, "seller": s, "opened": t} for i, s, t in AUCTIONS])
    write_lines(bids_in / "b1.jsonl", [{"auction": a, "price": p, "at": t} for a, p, t in FIRST_BIDS], "not a bid")
    checkpoint = tmp_path / "state" / "drained_bids" / "checkpoint"

    first = headrace(started, "run", "bids.py", "--quiet", cwd=tmp_path)
    wait_for("the first batch", lambda: (checkpoint / "commits" / "0").exists(), first)
    write_lines(auctions_in / "a2.jsonl", [dict(zip(("id", "seller", "opened"), LATE_AUCTION, strict=True))])
    matched = sum(1 for a, _, _ in FIRST_BIDS if a in (1, 2, 3))
    wait_for("the first bids' matches", lambda: sum(outputs(out)["joined"].values()) == matched, first)
    first.send_signal(signal.SIGTERM)
    assert first.wait(60) == 0, first.communicate()
    # the join holds the watermark an hour back (an auction matches bids for an hour): every window is open
    assert not outputs(out)["per_minute"] and not outputs(out)["per_five"]

    write_lines(bids_in / "b2.jsonl", [{"auction": a, "price": p, "at": t} for a, p, t in LATER_BIDS],
                json.dumps(BAD_TIME))
    killed = headrace(started, "run", "bids.py", "--drain", "--quiet", cwd=tmp_path)
    wait_for("the drain to log its end", lambda: logged_end(checkpoint), killed)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(30)
    assert not (tmp_path / "state" / "drained_bids" / "drained.json").exists()

    drained = headrace(started, "run", "bids.py", "--drain", cwd=tmp_path)
    stdout, stderr = drained.communicate(timeout=240)
    assert drained.returncode == 0, stderr
    assert "stopped: drained: every window fired, ended for good at batch" in stdout
    assert outputs(out) == model()  # every window and unmatched bid once, across the kill

    refused = headrace(started, "run", "bids.py", cwd=tmp_path)
    _, stderr = refused.communicate(timeout=120)
    assert refused.returncode == 3  # refused: running it again would not help
    assert stderr.startswith("headrace: pipeline 'drained_bids' was drained at batch ")
    assert "every later record would be late; run it with --fresh to start over" in stderr


# -- the end-of-time entry, on hand-made checkpoints -----------------------------------------------

def entry(watermark: int) -> str:
    return "\n".join(["v1", json.dumps({"batchWatermarkMs": watermark, "batchTimestampMs": 5, "conf": {"a": "b"}}),
                      '{"logOffset":3}', '{"files":["x.jsonl"]}'])


def checkpoint_with(tmp_path: Path, offsets: dict[int, str], commits: list[int]) -> str:
    for folder in ("offsets", "commits"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    for batch, text in offsets.items():
        (tmp_path / "offsets" / str(batch)).write_text(text)
    for batch in commits:
        (tmp_path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    return str(tmp_path)


@pytest.mark.fast
def test_the_end_is_the_last_batch_again_with_the_watermark_at_the_end_of_time(tmp_path: Path):
    checkpoint = checkpoint_with(tmp_path, {0: entry(0), 1: entry(1_000)}, [0, 1])
    assert end_of_time.pending_end(checkpoint) is None
    assert end_of_time.log_end(checkpoint) == 2
    lines = (tmp_path / "offsets" / "2").read_text().splitlines()
    assert lines[0] == "v1" and lines[2:] == ['{"logOffset":3}', '{"files":["x.jsonl"]}']  # no new data
    assert json.loads(lines[1]) == {"batchWatermarkMs": FLUSH_TIME_MS, "batchTimestampMs": 5, "conf": {"a": "b"}}
    assert FLUSH_TIME_MS >= END_OF_INPUT_MS and end_of_time.pending_end(checkpoint) == 2
    (tmp_path / "commits" / "2").write_text("v1\n{}")
    assert end_of_time.pending_end(checkpoint) is None


@pytest.mark.fast
def test_no_end_is_logged_without_a_committed_batch_nor_over_a_batch_in_flight(tmp_path: Path):
    assert end_of_time.log_end(checkpoint_with(tmp_path / "empty", {}, [])) is None
    in_flight = checkpoint_with(tmp_path / "in_flight", {0: entry(0), 1: entry(0)}, [0])
    assert end_of_time.pending_end(in_flight) is None  # an ordinary batch planned and not committed
    with pytest.raises(HeadraceError, match=r"its batch 1 was planned and not committed; run the pipeline once "
                                            r"more, then drain it"):
        end_of_time.log_end(in_flight)
    odd = checkpoint_with(tmp_path / "odd", {0: "v1\n[]\n{}"}, [0])
    with pytest.raises(HeadraceError, match=r"cannot drain: Spark's offset log entry .*/offsets/0 is not a version "
                                            r"line followed by metadata with batchWatermarkMs"):
        end_of_time.log_end(odd)


@pytest.mark.fast
def test_a_drained_pipeline_is_refused_until_started_fresh(tmp_path: Path):
    end_of_time.refuse_drained(str(tmp_path), "p")  # not drained: nothing to say
    end_of_time.mark_drained(str(tmp_path), 7)
    with pytest.raises(IncompatibleCheckpoint, match=r"^pipeline 'p' was drained at batch 7 \(20\d\d-.*\): every "
                                                     r"window fired at the end of time"):
        end_of_time.refuse_drained(str(tmp_path), "p")


@pytest.mark.fast
def test_a_drain_is_refused_for_real_time_and_operator_pipelines_before_spark_starts(tmp_path: Path):
    import headrace as hr
    from headrace.runtime.runner import PipelineRun

    fast = hr.Pipeline("fast", trigger="real-time")
    fast.source("in", hr.sources.Kafka("t", schema="v long")).sink("out", hr.sinks.Kafka("u", exactly_once=False))
    with pytest.raises(PlanError, match=r"^pipeline 'fast' runs in real-time mode, which has no micro-batch a "
                                        r"drain could end it with; stop it instead$"):
        PipelineRun(fast, state_dir=str(tmp_path), drain=True)

    class Upper(hr.Operator):
        lines = hr.InputPort()
        out = hr.OutputPort("line string")

        def process(self, record: dict) -> None:
            self.out.emit({"line": record["line"].upper()})

    operators = hr.Pipeline("operators")
    lines = operators.source("lines", hr.sources.Files(str(tmp_path), schema="line string"))
    upper = operators.add_operator("upper", Upper())
    operators.add_stream("lines_in", lines, upper.lines)
    upper.out.stream(name="upper_lines").sink("out", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
    with pytest.raises(PlanError, match=r"^pipeline 'operators' runs operators, which learn that their input "
                                        r"ended only from a bounded source, not from a drain; stop it instead"):
        PipelineRun(operators, state_dir=str(tmp_path), drain=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
