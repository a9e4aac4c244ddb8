"""Sinks: console, files, PostgreSQL and null, driven by batch DataFrames and real streaming queries."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import uuid

import pytest
from conftest import PG_DSN

from headrace.connectors.base import Guarantee, redact_dsn
from headrace.connectors.console import Console, format_batch
from headrace.connectors.files_sink import FileSink, read_rows
from headrace.connectors.null_sink import Null
from headrace.connectors.postgres import COMMIT_TABLE, Postgres
from headrace.errors import PlanError, SinkError


def words(spark, rows):
    return spark.createDataFrame(rows, "word string, n long")


def write_inputs(folder, batches):
    """One JSON-lines file per batch, for a file stream read one file per micro-batch."""
    os.makedirs(folder, exist_ok=True)
    for index, rows in enumerate(batches):
        file = os.path.join(folder, f"part-{index:03d}.json")
        with open(file, "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in rows)
        os.utime(file, (1_700_000_000 + index, 1_700_000_000 + index))  # the file source goes by age


def stream_of(spark, folder):
    return (spark.readStream.schema("word string, n long").option("maxFilesPerTrigger", 1)
            .json(str(folder)))


def run_to_end(writer):
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(120)
    return query


# -- Null ---------------------------------------------------------------------

def test_null_sink_computes_and_discards(spark):
    sink = Null()
    assert sink.native_format == "noop"
    assert sink.guarantee is Guarantee.EXACTLY_ONCE
    sink.write_batch(words(spark, [("a", 1)]), 0)


# -- Console ------------------------------------------------------------------

def test_console_prints_header_and_rows(spark, capsys):
    sink = Console(limit=2)
    assert sink.native_format is None
    assert sink.guarantee is Guarantee.AT_LEAST_ONCE
    sink.write_batch(words(spark, [("a", 1), ("b", 2), ("c", 3)]), 4)
    out = capsys.readouterr().out
    assert out.startswith("--- batch 4 ---\n")
    assert "|word|n  |" in out and "|a   |1  |" in out and "|b   |2  |" in out
    assert "|c" not in out
    assert "only showing the first 2 rows" in out


@pytest.mark.fast
def test_console_format_truncates_and_shows_nulls():
    text = format_batch(0, ["s"], [["x" * 30], [None]], width=10)
    assert "|xxxxxxx...|" in text and "|null      |" in text
    assert format_batch(1, ["s"], []).endswith("(no rows)")


@pytest.mark.fast
def test_console_rejects_bad_arguments():
    with pytest.raises(PlanError, match="limit"):
        Console(limit=-1)
    with pytest.raises(PlanError, match="truncate"):
        Console(truncate=0)


# -- Files --------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_file_sink_write_batch_is_exactly_once(spark, tmp_path, fmt):
    path = str(tmp_path / "out")
    sink = FileSink(path, format=fmt)
    os.makedirs(path)
    os.makedirs(os.path.join(path, "_tmp-1-deadbeef"))  # left behind by a crashed attempt of batch 1
    sink.write_batch(words(spark, [("a", 1), ("b", 2)]), 0)
    sink.write_batch(words(spark, [("c", 3)]), 1)
    sink.write_batch(words(spark, [("c", 3)]), 1)  # replayed: already committed
    assert sorted(os.listdir(path)) == ["batch-000000000000", "batch-000000000001"]
    assert sorted((r["word"], r["n"]) for r in read_rows(path, fmt)) == [("a", 1), ("b", 2), ("c", 3)]
    if fmt == "parquet":
        assert spark.read.parquet(f"{path}/batch-*").count() == 3


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_file_sink_native_streaming_layout(spark, tmp_path, fmt):
    write_inputs(tmp_path / "in", [[{"word": "a", "n": 1}], [{"word": "b", "n": 2}, {"word": "c", "n": 3}]])
    path = str(tmp_path / "out")
    sink = FileSink(path, format=fmt)
    native = {"parquet": "parquet", "jsonl": "json"}[fmt]
    assert (sink.native_format, sink.native_options()) == (native, {"path": path})
    writer = (stream_of(spark, tmp_path / "in").writeStream.format(sink.native_format)
              .options(**sink.native_options()).option("checkpointLocation", str(tmp_path / "ck")))
    run_to_end(writer)
    assert os.path.isdir(os.path.join(path, "_spark_metadata"))
    # A file no batch committed (as a crashed attempt leaves) is not read.
    words(spark, [("stray", 9)]).coalesce(1).write.format(native).save(str(tmp_path / "stray"))
    stray = next(f for f in os.listdir(tmp_path / "stray") if f.startswith("part-"))
    os.rename(tmp_path / "stray" / stray, os.path.join(path, "part-stray"))
    rows = sorted((r["word"], r["n"]) for r in read_rows(path, fmt))
    assert rows == [("a", 1), ("b", 2), ("c", 3)]
    read_back = spark.read.format(native).schema("word string, n long").load(path).collect()
    assert sorted((r.word, r.n) for r in read_back) == rows
    with pytest.raises(SinkError, match="_spark_metadata"):
        sink.write_batch(words(spark, [("d", 4)]), 2)


@pytest.mark.fast
def test_file_sink_rejects_bad_arguments():
    with pytest.raises(PlanError, match="format"):
        FileSink("/tmp/x", format="csv")
    with pytest.raises(PlanError, match="local"):
        FileSink("s3://bucket/x")


class JsonLinesBatch:
    """A micro-batch as the Files sink writes it (``df.write.mode(...).json(folder)``), without
    Spark: one part file of JSON lines in a new folder."""

    def __init__(self, rows):
        self.rows, self.write = rows, self

    def mode(self, mode):
        assert mode == "errorifexists"
        return self

    def json(self, folder):
        os.makedirs(folder)
        with open(os.path.join(folder, "part-00000.json"), "w") as out:
            out.writelines(json.dumps(row) + "\n" for row in self.rows)


@pytest.mark.fast
def test_file_sink_batches_it_was_never_given_are_not_lost_ones(tmp_path):
    """One directory per batch, as the writer drives a bound sink across restarts: batch 3 is a
    rescale's, which reaches no sink, so a start after the run that followed it goes on; directories
    removed later between the first and the last still stop the start."""
    out, run_dir = tmp_path / "out", str(tmp_path / "p" / "run")

    def started():
        sink = FileSink(str(out), format="jsonl").bind("out/p@0001")
        sink.prepare(run_dir)
        return sink

    def write(sink, *batches):
        for batch in batches:
            sink.write_batch(JsonLinesBatch([{"batch": batch}]), batch)

    write(started(), 0, 1, 2)
    write(started(), 4, 5)  # after the rescale's batch 3
    write(started(), 6)
    assert [row["batch"] for row in read_rows(str(out), "jsonl")] == [0, 1, 2, 4, 5, 6]
    started()
    for batch in (5, 1):
        os.rename(out / f"batch-{batch:012d}", tmp_path / f"away-{batch}")
    with pytest.raises(SinkError, match=r"^sink 'out': the directory '.*' lost the directories of batches 1, 5 after "
                                        r"this sink committed batches 0-6 into it \(run record "):
        started()


# -- PostgreSQL -----------------------------------------------------------------


@pytest.fixture
def table(pg):
    """A fresh table name and sink name; both are cleaned up afterwards."""
    name = f"hr_test_{uuid.uuid4().hex[:12]}"
    yield name
    pg.execute(f"DROP TABLE IF EXISTS {name}")
    pg.execute(f"DELETE FROM {COMMIT_TABLE} WHERE sink LIKE %s", (f"{name}%",))


def rows_of(pg, table, order="word"):
    return pg.execute(f"SELECT word, n FROM {table} ORDER BY {order}").fetchall()


def commits_of(pg, sink_name):
    return pg.execute(f"SELECT batch_id FROM {COMMIT_TABLE} WHERE sink = %s ORDER BY batch_id",
                      (sink_name,)).fetchall()


def test_postgres_replayed_batch_adds_nothing(spark, pg, table):
    sink = Postgres(table, dsn=PG_DSN).bind(f"{table}-step")
    assert sink.name == f"{table}-step"
    batch1 = words(spark, [("b", 2), ("c", 3)])
    sink.write_batch(words(spark, [("a", 1)]), 0)
    sink.write_batch(batch1, 1)
    sink.write_batch(batch1, 1)  # Spark replays batch 1 after a failure
    fresh = Postgres(table, dsn=PG_DSN, name=f"{table}-step")  # a restarted driver: new object, same name
    fresh.write_batch(batch1, 1)
    fresh.close()
    sink.close()
    assert rows_of(pg, table) == [("a", 1), ("b", 2), ("c", 3)]
    assert commits_of(pg, f"{table}-step") == [(0,), (1,)]


def test_postgres_batch_rows_are_loaded_by_the_executors_not_the_driver(spark, pg, table, monkeypatch):
    """A 300,000-row batch of 3 partitions: no row is collected to the driver (toArrow and
    toPandas would fail), every row arrives once, and the staging table is gone."""
    from pyspark.sql import DataFrame

    from headrace.connectors import postgres_staging as staging

    def refused(*_args, **_kwargs):
        raise AssertionError("the batch's rows were collected to the driver")

    monkeypatch.setattr(DataFrame, "toArrow", refused)
    monkeypatch.setattr(DataFrame, "toPandas", refused)
    batch = spark.range(0, 300_000, numPartitions=3).selectExpr("concat('w', id % 1000) AS word", "id AS n")
    sink = Postgres(table, dsn=PG_DSN).bind(table)
    sink.write_batch(batch, 0)
    sink.close()
    assert pg.execute(f"SELECT count(*), count(DISTINCT n), sum(n) FROM {table}").fetchone() == (
        300_000, 300_000, sum(range(300_000)))
    assert pg.execute("SELECT to_regclass(%s)", (staging.stage_name(table, 0),)).fetchone()[0] is None


def test_postgres_staging_a_partition_again_replaces_its_rows(pg):
    """A task Spark runs again (a lost executor) loads its partition again: its rows are there once."""
    import pyarrow as pa

    from headrace.connectors import postgres_staging as staging
    from headrace.connectors.postgres import _csv_ready

    stage = staging.Stage(staging.stage_name(f"again-{uuid.uuid4()}", 0), ("word", "n"), ("text", "bigint"))
    stage.create(pg)
    rows = [pa.RecordBatch.from_pydict({"word": ["a", "b"], "n": [1, 2]})]
    assert stage.load_partition(pg, 0, rows, _csv_ready) == 2
    assert stage.load_partition(pg, 1, rows, _csv_ready) == 2
    assert stage.load_partition(pg, 0, rows, _csv_ready) == 2  # partition 0 again
    assert pg.execute(f'SELECT _hr_part, count(*) FROM "{stage.name}" GROUP BY 1 ORDER BY 1').fetchall() == [
        (0, 2), (1, 2)]
    pg.execute(f'DROP TABLE "{stage.name}"')


def test_postgres_drops_staging_tables_a_killed_driver_left(spark, pg, table):
    from headrace.connectors import postgres_staging as staging

    sink = Postgres(table, dsn=PG_DSN).bind(f"{table}-left")
    left = staging.Stage(staging.stage_name(sink.name, 7), ("word", "n"), ("text", "bigint"))
    left.create(pg)
    sink.prepare("unused")
    sink.close()
    assert pg.execute("SELECT to_regclass(%s)", (left.name,)).fetchone()[0] is None


def test_postgres_upserts_by_key(spark, pg, table):
    sink = Postgres(table, dsn=PG_DSN, key="word").bind(table)
    sink.write_batch(words(spark, [("a", 1), ("b", 2)]), 0)
    sink.write_batch(words(spark, [("a", 10), ("c", 3), ("c", 30)]), 1)  # last row of a key wins
    sink.close()
    assert rows_of(pg, table) == [("a", 10), ("b", 2), ("c", 30)]
    key = pg.execute("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                     "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = %s::regclass AND i.indisprimary",
                     (table,)).fetchall()
    assert key == [("word",)]


def test_postgres_creates_table_from_spark_types(spark, pg, table):
    from pyspark.sql import types as T

    schema = T.StructType([
        T.StructField("id", T.LongType()), T.StructField("s", T.StringType()),
        T.StructField("i", T.IntegerType()), T.StructField("d", T.DoubleType()),
        T.StructField("b", T.BooleanType()), T.StructField("ts", T.TimestampType()),
        T.StructField("day", T.DateType()), T.StructField("raw", T.BinaryType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("attrs", T.MapType(T.StringType(), T.LongType())),
        T.StructField("point", T.StructType([T.StructField("x", T.LongType())])),
    ])
    when = datetime.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=datetime.UTC)
    rows = [
        (1, 'a,"quoted"\nline', 7, float("nan"), True, when, datetime.date(2024, 1, 2), b"\x00\xff",
         decimal.Decimal("12.34"), ["x", None], {"k": 1}, {"x": 5}),
        (2, "", None, float("-inf"), None, None, None, b"", None, [], {}, None),
        (3, None, None, 1.5, False, None, None, None, None, None, None, None),
    ]
    sink = Postgres(table, dsn=PG_DSN, key="id")
    sink.write_batch(spark.createDataFrame(rows, schema), 0)
    sink.close()
    types = dict(pg.execute("SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_name = %s", (table,)).fetchall())
    assert types == {
        "id": "bigint", "s": "text", "i": "integer", "d": "double precision", "b": "boolean",
        "ts": "timestamp with time zone", "day": "date", "raw": "bytea", "amount": "numeric",
        "tags": "jsonb", "attrs": "jsonb", "point": "jsonb",
    }
    got = pg.execute(f"SELECT id, s, i, d::text, b, ts, day, raw, amount, tags, attrs, point "
                     f"FROM {table} ORDER BY id").fetchall()
    assert got[0] == (1, 'a,"quoted"\nline', 7, "NaN", True, when, datetime.date(2024, 1, 2), b"\x00\xff",
                      decimal.Decimal("12.34"), ["x", None], {"k": 1}, {"x": 5})
    assert got[1] == (2, "", None, "-Infinity", None, None, None, b"", None, [], {}, None)
    assert got[2][1] is None and got[2][3] == "1.5"


def test_postgres_cannot_connect_names_the_sink(spark):
    sink = Postgres("events", dsn="postgresql://postgres:s3cret@127.0.0.1:1/test", retries=1,
                    retry_backoff=0.1).bind("to_db")
    with pytest.raises(SinkError) as caught:
        sink.write_batch(words(spark, [("a", 1)]), 0)
    message = str(caught.value)
    assert message.startswith("sink 'to_db': PostgreSQL unreachable after 2 attempts over ")
    assert "127.0.0.1:1" in message and "s3cret" not in message


def test_postgres_key_must_be_a_column(spark, pg, table):
    sink = Postgres(table, dsn=PG_DSN, key=("word", "nope")).bind("keyed")
    with pytest.raises(SinkError, match=r"sink 'keyed'.*\['nope'\] are not in the stream's columns"):
        sink.write_batch(words(spark, [("a", 1)]), 0)


def test_postgres_missing_table_and_unknown_column(spark, pg, table):
    with pytest.raises(SinkError, match="does not exist"):
        Postgres(table, dsn=PG_DSN, create_table=False).bind(table).write_batch(words(spark, [("a", 1)]), 0)
    pg.execute(f"CREATE TABLE {table} (word text)")
    with pytest.raises(SinkError, match=r"no column\(s\) \['n'\]"):
        Postgres(table, dsn=PG_DSN, create_table=False).bind(table).write_batch(words(spark, [("a", 1)]), 0)
    assert commits_of(pg, table) == []  # a failed batch is not recorded as committed


def test_postgres_reconnects_when_its_connection_was_lost(spark, pg, table):
    sink = Postgres(table, dsn=PG_DSN).bind(table)
    sink.write_batch(words(spark, [("a", 1)]), 0)
    pid = sink._conn.info.backend_pid
    pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
    sink.write_batch(words(spark, [("b", 2)]), 1)
    sink.close()
    assert rows_of(pg, table) == [("a", 1), ("b", 2)]


@pytest.mark.fast
def test_postgres_rejects_bad_arguments():
    with pytest.raises(PlanError, match="key"):
        Postgres("t", key=[])
    with pytest.raises(PlanError, match="table"):
        Postgres("")


@pytest.mark.fast
def test_redact_dsn():
    assert redact_dsn("postgresql://u:pw@h:5/db") == "postgresql://u@h:5/db"
    assert redact_dsn("host=h password='a b' user=u") == "host=h user=u"


# -- A real streaming query, with a crash and a restart ---------------------------

def test_streaming_query_with_several_sinks_recovers_exactly_once(spark, pg, table, tmp_path, capsys):
    """foreachBatch into PostgreSQL, files and the console; the query dies after the database
    committed batch 1 but before the files did; the restarted query replays batch 1."""
    batches = [[{"word": "a", "n": 1}], [{"word": "b", "n": 2}, {"word": "c", "n": 3}], [{"word": "d", "n": 4}]]
    write_inputs(tmp_path / "in", batches)
    db = Postgres(table, dsn=PG_DSN).bind(f"{table}-db")
    files = FileSink(str(tmp_path / "out"), format="jsonl")
    console = Console()
    crash = {"armed": True}

    def write_all(df, batch_id):
        db.write_batch(df, batch_id)
        if batch_id == 1 and crash["armed"]:
            crash["armed"] = False
            raise RuntimeError("driver crash between two sinks")
        files.write_batch(df, batch_id)
        console.write_batch(df, batch_id)

    def start():
        writer = (stream_of(spark, tmp_path / "in").writeStream.foreachBatch(write_all)
                  .option("checkpointLocation", str(tmp_path / "ck")))
        return run_to_end(writer)

    db.prepare(str(tmp_path))
    files.prepare(str(tmp_path))
    with pytest.raises(Exception, match="driver crash"):
        start()
    assert rows_of(pg, table) == [("a", 1), ("b", 2), ("c", 3)]
    assert sorted(r["word"] for r in read_rows(str(tmp_path / "out"), "jsonl")) == ["a"]
    query = start()
    assert query.exception() is None
    db.close()
    expected = [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert rows_of(pg, table) == expected
    assert commits_of(pg, f"{table}-db") == [(0,), (1,), (2,)]
    assert sorted((r["word"], r["n"]) for r in read_rows(str(tmp_path / "out"), "jsonl")) == expected
    out = capsys.readouterr().out
    assert out.count("--- batch 1 ---") == 1 and "--- batch 2 ---" in out
