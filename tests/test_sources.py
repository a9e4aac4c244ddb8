"""The generator, files and socket sources, through Spark and through their readers directly."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from headrace.connectors.base import CONTROL_COLUMN, DEAD_COLUMNS, FLUSH_TIME_MS, Guarantee
from headrace.connectors.files_source import FileSource
from headrace.connectors.generator import (
    YSB_ADS_SCHEMA,
    Generator,
    generate,
    ysb_ads,
)
from headrace.connectors.socket import Socket
from headrace.connectors.spark_readers.files import FileStreamReader
from headrace.connectors.spark_readers.generator import GeneratorStreamReader
from headrace.errors import PlanError, SourceError

UTC = pa.timestamp("us", tz="UTC")


class Run:
    """A streaming query over one source, collecting every micro-batch as an Arrow table."""

    def __init__(self, spark: Any, connector: Any, run_dir: str, name: str = "src") -> None:
        self.run_dir, self.name = run_dir, name
        self.tables: list[pa.Table] = []
        self.batch_times: list[float] = []
        self.batch_ids: list[int] = []
        source = connector.data_source()
        spark.dataSource.register(source)
        df = (spark.readStream.format(source.name())
              .options(**connector.options(), hr_run_dir=run_dir, hr_source=name).load())

        def collect(batch_df: Any, batch_id: int) -> None:
            self.tables.append(batch_df.toArrow())
            self.batch_times.append(time.time())
            self.batch_ids.append(batch_id)

        self.query = (df.writeStream.foreachBatch(collect)
                      .option("checkpointLocation", os.path.join(run_dir, "checkpoint"))
                      .trigger(processingTime="0 seconds").start())

    @property
    def exhausted(self) -> bool:
        return os.path.exists(os.path.join(self.run_dir, "exhausted", self.name))

    def wait(self, condition: Callable[[], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.query.exception() is not None:
                raise self.query.exception()
            assert time.monotonic() < deadline, "timed out waiting for the query"
            time.sleep(0.05)

    def finish(self, wait_exhausted: bool = True) -> pa.Table:
        """Wait for the end of the input (when asked), process what is left, stop."""
        try:
            if wait_exhausted:
                self.wait(lambda: self.exhausted)
            self.query.processAllAvailable()
        finally:
            self.query.stop()
        return self.table()

    def table(self) -> pa.Table:
        tables = [t for t in self.tables if t.num_rows]
        return pa.concat_tables(tables) if tables else pa.table({})


def data_rows(table: pa.Table) -> list[dict[str, Any]]:
    return [row for row in table.to_pylist() if row[CONTROL_COLUMN] is None]


def control_rows(table: pa.Table) -> list[dict[str, Any]]:
    return [row for row in table.to_pylist() if row[CONTROL_COLUMN] is not None]


def assert_flush_row(table: pa.Table) -> None:
    flush = control_rows(table)
    assert len(flush) == 1
    assert flush[0][CONTROL_COLUMN] == FLUSH_TIME_MS
    assert all(value is None for key, value in flush[0].items() if key != CONTROL_COLUMN)


# ---------------------------------------------------------------------------------------
# Generator


@pytest.mark.fast
def test_generator_config_and_validation() -> None:
    gen = Generator(kind="words", limit=10, seed=3)
    assert gen.bounded and not Generator().bounded
    assert gen.guarantee is Guarantee.EXACTLY_ONCE and not gen.emits_dead_letters
    assert gen.schema() == (("line", "string"), ("event_time", "timestamp"))
    assert gen.options() == {"kind": "words", "rows_per_batch": "1000000", "partitions": "2",
                             "seed": "3", "limit": "10"}
    json.dumps(gen.describe())
    with pytest.raises(PlanError, match="unknown kind"):
        Generator(kind="nope")
    with pytest.raises(PlanError, match="rate"):
        Generator(rate=0)


@pytest.mark.fast
def test_generator_is_a_pure_function_of_seed_and_index() -> None:
    for kind in ("ysb", "words", "clicks"):
        whole = generate(kind, 0, 1000, seed=7)
        parts = pa.Table.from_batches([generate(kind, 0, 400, seed=7), generate(kind, 400, 1000, seed=7)])
        assert pa.Table.from_batches([whole]).equals(parts)
        assert not generate(kind, 0, 1000, seed=8).equals(whole)


@pytest.mark.fast
def test_generator_reader_offsets_and_partitions(tmp_path: Any) -> None:
    gen = Generator(limit=25, rows_per_batch=10, partitions=3)
    reader = GeneratorStreamReader({**gen.options(), "hr_run_dir": str(tmp_path), "hr_source": "g"})
    start = reader.initialOffset()
    assert start == {"offset": 0, "start_ms": 1_700_000_000_000}
    offsets = [start]
    while not offsets[-1].get("flushed"):
        offsets.append(reader.latestOffset(offsets[-1], None))
    assert [o["offset"] for o in offsets] == [0, 10, 20, 25]
    assert (tmp_path / "exhausted" / "g").exists()
    assert reader.latestOffset(offsets[-1], None) == offsets[-1]  # no more data after the end
    parts = reader.partitions(offsets[0], offsets[1])
    assert [(p.start, p.end, p.flush) for p in parts] == [(0, 3, False), (3, 6, False), (6, 10, False)]
    last = reader.partitions(offsets[2], offsets[3])
    assert last[-1].flush and sum(p.end - p.start for p in last) == 5
    first_read = [b for p in parts for b in reader.read(p)]
    again = [b for p in reader.partitions(offsets[0], offsets[1]) for b in reader.read(p)]
    assert pa.Table.from_batches(first_read).equals(pa.Table.from_batches(again))


def test_generator_through_spark_replays_and_ends_with_a_flush_row(spark: Any, tmp_path: Any) -> None:
    gen = Generator(kind="ysb", limit=3000, rows_per_batch=1000, seed=11)
    run = Run(spark, gen, str(tmp_path))
    table = run.finish()
    assert table.schema.names == [name for name, _ in gen.schema()] + [CONTROL_COLUMN]
    assert table.schema.field("event_time").type == UTC
    assert len([t for t in run.tables if t.num_rows]) >= 3  # rows_per_batch caps each micro-batch
    assert_flush_row(table)
    rows = data_rows(table)
    assert len(rows) == 3000
    # What Spark read equals the same offsets generated again, in any order of partitions.
    key = lambda row: row["event_time"]  # noqa: E731 - event times are distinct
    assert sorted(rows, key=key) == generate("ysb", 0, 3000, seed=11).to_pylist()
    times = sorted(int(row["event_time"].timestamp() * 1_000_000) for row in rows)
    assert times[0] == 1_700_000_000_000_000
    assert {b - a for a, b in zip(times, times[1:])} == {10}  # nominal 100 000 events/s
    counts = {kind: sum(row["event_type"] == kind for row in rows) for kind in ("view", "click", "purchase")}
    assert all(800 < count < 1200 for count in counts.values()), counts
    ads = {row["ad_id"] for row in rows}
    assert ads <= {ad["ad_id"] for ad in ysb_ads()} and len(ads) > 900


def test_generator_rate_is_honoured(spark: Any, tmp_path: Any) -> None:
    gen = Generator(kind="clicks", rate=500, limit=500)
    run = Run(spark, gen, str(tmp_path))
    run.wait(lambda: run.exhausted)
    table = run.finish()
    assert len(data_rows(table)) == 500
    assert_flush_row(table)
    # No batch carries an event from the future, and events are 2 ms apart.
    for batch, seen_at in zip(run.tables, run.batch_times):
        times = [t for t in batch.column("event_time").to_pylist() if t is not None]
        if times:
            assert max(times).timestamp() <= seen_at + 0.05
    times = sorted(row["event_time"] for row in data_rows(table))
    assert (times[-1] - times[0]).total_seconds() == pytest.approx(0.998)


@pytest.mark.fast
def test_generator_clicks_come_in_bursts() -> None:
    table = generate("clicks", 0, 200_000, rate=1000).to_pandas()
    table = table.sort_values(["user_id", "event_time"])
    gaps = table.groupby("user_id")["event_time"].diff().dt.total_seconds().dropna()
    assert table["user_id"].nunique() == 200
    assert gaps[gaps >= 30].min() > 30 and gaps[gaps < 30].max() < 12  # bursts, then idle > 30 s
    words = generate("words", 0, 1000).column("line").to_pylist()
    assert {len(line.split()) for line in words} == {3, 4, 5, 6, 7, 8}


@pytest.mark.fast
def test_ysb_ads_table() -> None:
    ads = ysb_ads()
    assert len(ads) == 1000 and YSB_ADS_SCHEMA == (("ad_id", "string"), ("campaign_id", "string"))
    assert ads[0] == {"ad_id": "ad-0000", "campaign_id": "campaign-00"}
    assert len({ad["campaign_id"] for ad in ads}) == 100


def test_stop_file_freezes_the_offset(spark: Any, tmp_path: Any) -> None:
    os.makedirs(tmp_path, exist_ok=True)
    (tmp_path / "stop").write_text("")
    run = Run(spark, Generator(limit=100), str(tmp_path))
    table = run.finish(wait_exhausted=False)
    assert table.num_rows == 0 and not run.exhausted


def test_generator_restarts_from_its_checkpoint_after_a_drain(spark: Any, tmp_path: Any) -> None:
    """Stop at a batch boundary with the stop file, restart from the checkpoint: every event
    exactly once, and a batch id replayed after the restart carries the same rows."""
    gen = Generator(kind="words", limit=5000, rows_per_batch=500, partitions=3, seed=5)
    first = Run(spark, gen, str(tmp_path))
    first.wait(lambda: len(first.tables) >= 2)
    (tmp_path / "stop").write_text("")
    first.query.processAllAvailable()
    first.query.stop()
    assert not first.exhausted and sum(t.num_rows for t in first.tables) < 5000
    os.remove(tmp_path / "stop")
    second = Run(spark, gen, str(tmp_path))
    second.finish()
    batches: dict[int, pa.Table] = {}
    for batch_id, table in [*zip(first.batch_ids, first.tables), *zip(second.batch_ids, second.tables)]:
        if batch_id in batches:  # an idempotent sink skips it; its rows must be the same
            assert sorted(batches[batch_id].to_pylist(), key=str) == sorted(table.to_pylist(), key=str)
        batches[batch_id] = table
    rows = pa.concat_tables([t for t in batches.values() if t.num_rows])
    assert_flush_row(rows)
    expected = generate("words", 0, 5000, seed=5).to_pylist()
    assert sorted(data_rows(rows), key=lambda r: r["event_time"]) == expected


# ---------------------------------------------------------------------------------------
# Files

SCHEMA = "name string, n long, at timestamp"


def write(path: Any, text: str) -> None:
    temporary = path.parent / ("." + path.name)
    temporary.write_text(text)
    os.replace(temporary, path)


def test_files_jsonl_bounded_with_dead_letters(spark: Any, tmp_path: Any) -> None:
    data = tmp_path / "in"
    data.mkdir()
    write(data / "a.jsonl", '{"name": "a", "n": 1, "at": "2024-01-01T00:00:00Z"}\n'
                            '\n'
                            '{"name": "b", "n": "abc"}\n'
                            'not json\n'
                            '{"name": "c", "at": 1700000000000, "extra": true}\n')
    write(data / "b.jsonl", '{"name": "d", "n": 4}\n')
    write(data / ".hidden.jsonl", "ignored\n")
    source = FileSource(data, "jsonl", SCHEMA, bounded=True)
    assert source.bounded and source.emits_dead_letters
    table = Run(spark, source, str(tmp_path / "run")).finish()
    assert table.schema.names == ["name", "n", "at", CONTROL_COLUMN, *DEAD_COLUMNS]
    assert_flush_row(table)
    rows = data_rows(table)
    good = sorted((r["name"], r["n"]) for r in rows if r["_hr_dead_raw"] is None)
    assert good == [("a", 1), ("c", None), ("d", 4)]
    at = {r["name"]: r["at"] for r in rows if r["name"]}
    assert at["a"].isoformat() == "2024-01-01T00:00:00+00:00"
    assert at["c"].timestamp() == 1_700_000_000
    dead = sorted((r["_hr_dead_position"], r["_hr_dead_error"], r["_hr_dead_raw"])
                  for r in rows if r["_hr_dead_raw"] is not None)
    path = str(data / "a.jsonl")
    assert dead == [
        (f"{path}:3", "field 'n': expected long, got 'abc'", '{"name": "b", "n": "abc"}'),
        (f"{path}:4", "invalid JSON (Expecting value at column 1)", "not json"),
    ]
    assert all(r["name"] is None and r["n"] is None for r in rows if r["_hr_dead_raw"] is not None)


def test_files_csv_dead_letters_and_header(spark: Any, tmp_path: Any) -> None:
    data = tmp_path / "in"
    data.mkdir()
    write(data / "a.csv", "n,name,at\n1,a,2024-01-01 00:00:00\n2,b\nx,c,\n3,\"d, e\",1700000000000\n")
    # A clean file goes through pyarrow's CSV reader; the same rules apply.
    write(data / "b.csv", "extra,at,name,n\n0,1700000000000,\"f\ng\",5\n\n0,,,6\n")
    table = Run(spark, FileSource(data, "csv", SCHEMA, bounded=True), str(tmp_path / "run")).finish()
    rows = data_rows(table)
    good = sorted((r["name"] or "", r["n"], r["at"] and r["at"].isoformat()) for r in rows if r["_hr_dead_raw"] is None)
    assert good == [("", 6, None), ("a", 1, "2024-01-01T00:00:00+00:00"), ("d, e", 3, "2023-11-14T22:13:20+00:00"),
                    ("f\ng", 5, "2023-11-14T22:13:20+00:00")]
    path = str(data / "a.csv")
    dead = sorted((r["_hr_dead_position"], r["_hr_dead_error"], r["_hr_dead_raw"])
                  for r in rows if r["_hr_dead_raw"] is not None)
    assert dead == [(f"{path}:3", "expected 3 fields, got 2", "2,b"),
                    (f"{path}:4", "field 'n': expected long, got 'x'", "x,c,")]


def test_files_parquet_unbounded_picks_up_new_files(spark: Any, tmp_path: Any) -> None:
    data = tmp_path / "in"
    data.mkdir()
    pq.write_table(pa.table({"name": ["a", "b"], "n": pa.array([1, 2], pa.int32())}), data / "1.parquet")
    source = FileSource(data, "parquet")
    assert source.schema() == (("name", "string"), ("n", "int")) and not source.emits_dead_letters
    run = Run(spark, source, str(tmp_path / "run"))
    run.wait(lambda: run.table().num_rows == 2)
    pq.write_table(pa.table({"n": pa.array([3], pa.int64()), "name": ["c"]}), data / ".2.parquet")
    os.replace(data / ".2.parquet", data / "0.parquet")  # sorts before the first file: still new
    run.wait(lambda: run.table().num_rows == 3)
    table = run.finish(wait_exhausted=False)
    assert sorted(table.column("name").to_pylist()) == ["a", "b", "c"]
    assert not control_rows(table) and not run.exhausted  # unbounded: no flush row
    assert table.schema.names == ["name", "n", CONTROL_COLUMN]


def test_files_fail_fast_names_file_and_line(spark: Any, tmp_path: Any) -> None:
    data = tmp_path / "in"
    data.mkdir()
    write(data / "a.jsonl", '{"name": "a"}\n{"name": "b"}\nnot json\n')
    run = Run(spark, FileSource(data, "jsonl", SCHEMA, fail_fast=True), str(tmp_path / "run"), name="events")
    with pytest.raises(Exception) as caught:
        run.query.awaitTermination(60)
    message = str(caught.value)
    assert f"source 'events': {data / 'a.jsonl'}:3: invalid JSON (Expecting value at column 1): 'not json'" in message
    run.query.stop()


@pytest.mark.fast
def test_file_reader_directly(tmp_path: Any) -> None:
    """Offsets and parsing rules without Spark."""
    (tmp_path / "b.jsonl").write_text('{"n": 2.0, "name": 5, "at": "2024-01-01T01:00:00+01:00"}\n')
    (tmp_path / "_SUCCESS").write_text("")
    source = FileSource(tmp_path, "jsonl", SCHEMA)
    reader = FileStreamReader({**source.options(), "hr_source": "f"})
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert end == {"files": ["b.jsonl"]}
    assert reader.latestOffset(end, None) == end
    (tmp_path / "a.jsonl").write_text('{"n": 1.5}\n')
    later = reader.latestOffset(end, None)
    assert later == {"files": ["a.jsonl", "b.jsonl"]}
    [part] = reader.partitions(end, later)
    [batch] = list(reader.read(part))
    assert batch.column("_hr_dead_error").to_pylist() == ["field 'n': expected long, got 1.5"]
    [part] = reader.partitions(start, end)
    [batch] = list(reader.read(part))
    row = batch.to_pylist()[0]
    assert (row["n"], row["name"], row["at"].isoformat()) == (2, "5", "2024-01-01T00:00:00+00:00")
    with pytest.raises(PlanError, match="needs schema"):
        FileSource(tmp_path, "csv")
    with pytest.raises(SourceError, match="lacks the column"):
        (tmp_path / "c.csv").write_text("x,y\n1,2\n")
        reader = FileStreamReader({**FileSource(tmp_path, "csv", SCHEMA).options(), "hr_source": "f"})
        list(reader.read(reader.partitions({"files": []}, {"files": ["c.csv"]})[0]))


# ---------------------------------------------------------------------------------------
# Socket


def serve_lines(lines: list[str], delay: float = 0.3) -> tuple[int, threading.Thread]:
    """A one-connection server on an ephemeral port that sends lines, then closes."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def run() -> None:
        with server:
            connection, _ = server.accept()
            with connection:
                half = len(lines) // 2
                connection.sendall("".join(line + "\n" for line in lines[:half]).encode())
                time.sleep(delay)
                payload = "".join(line + "\n" for line in lines[half:])
                connection.sendall(payload[:-1].encode())  # the last line lacks its newline

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return port, thread


def test_socket_reads_lines_until_the_peer_closes(spark: Any, tmp_path: Any) -> None:
    lines = [f"line {k} é" for k in range(1000)] + ["", "last\r"]
    port, server = serve_lines(lines)
    source = Socket("127.0.0.1", port)
    assert source.guarantee is Guarantee.AT_MOST_ONCE and not source.bounded
    before = time.time()
    run = Run(spark, source, str(tmp_path), name="sock")
    table = run.finish()
    server.join(5)
    rows = data_rows(table)
    assert [r["line"] for r in rows] == [line.rstrip("\r") for line in lines]
    assert all(before <= r["received_at"].timestamp() <= time.time() for r in rows)
    assert_flush_row(table)
    assert table.schema.names == ["line", "received_at", CONTROL_COLUMN]
    assert len(os.listdir(tmp_path / "socket" / "sock")) <= 1  # committed segments are deleted


@pytest.mark.fast
def test_socket_connection_failure_is_reported(tmp_path: Any) -> None:
    from headrace.connectors.spark_readers.socket import SocketStreamReader

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    reader = SocketStreamReader({**Socket("127.0.0.1", port, connect_timeout=0.2).options(),
                                 "hr_run_dir": str(tmp_path), "hr_source": "s"})
    start = reader.initialOffset()
    try:
        deadline = time.monotonic() + 5
        with pytest.raises(SourceError, match=f"cannot connect to 127.0.0.1:{port}"):
            while time.monotonic() < deadline:
                reader.latestOffset(start, None)
                time.sleep(0.1)
    finally:
        reader.stop()
