"""The Files sink's ``partition_by`` (Hive-style ``col=value/`` directories, on Spark's own file
writer and on the per-batch writer), what it refuses when the pipeline is built, and the refusal
of update-mode results into an append-only sink through every front door. See docs/connectors.md
("The Files sink", "Sinks and update mode")."""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import headrace as hr
from headrace.connectors.files_sink import read_rows
from headrace.errors import PipelineFileError, PlanError, SinkError
from headrace.sink_step import SinkStep
from headrace.testing import TestSink, TestSource, run_to_completion

ROOT = Path(__file__).resolve().parents[1]
FILE = Path(__file__).name
SCHEMA = {"id": "long", "country": "string", "day": "long", "amount": "double"}
# Two micro-batches: a null country and one Spark escapes in its directory name ('/' and ':').
ORDERS = [[{"id": 1, "country": "fr", "day": 1, "amount": 5.0}, {"id": 2, "country": "pt", "day": 1, "amount": 7.5},
           {"id": 3, "country": None, "day": 2, "amount": 1.0}],
          [{"id": 4, "country": "fr", "day": 2, "amount": 2.0}, {"id": 5, "country": "a/b:c", "day": 2,
                                                                  "amount": 3.5}]]
# What every sink that cannot take updates is told to use instead (each keyed sink's refuses_updates is None).
KEEPING = ("hr.sinks.Delta(..., key=[...]), hr.sinks.Kafka(..., key=[...]) on a compacted topic, "
           "hr.sinks.Postgres(..., key=[...]), hr.sinks.Redis(key_prefix=..., key=[...]) or hr.sinks.View(key=[...])")


def next_line() -> int:
    """The line after the caller's."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def ids_by(rows: list[dict[str, Any]], *columns: str) -> dict[tuple[Any, ...], list[int]]:
    """The ids of ``rows``, grouped by the values of ``columns``."""
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[c] for c in columns)].append(row["id"])
    return {key: sorted(ids) for key, ids in groups.items()}


def directory_value(folder: Path) -> str | None:
    """The value a ``col=value`` directory holds, unescaped by hand as the Hive layout escapes it."""
    value = folder.name.split("=", 1)[1]
    return None if value == "__HIVE_DEFAULT_PARTITION__" else value.replace("%2F", "/").replace("%3A", ":")


# -- writing ------------------------------------------------------------------------------------------------------

def test_the_partitioned_files_of_docs_connectors_md_print_what_it_shows(spark: Any, tmp_path: Path, capsys: Any,
                                                                        monkeypatch: Any) -> None:
    """The one-sink example (Spark's own streaming file writer, its manifest), run as written."""
    doc = (ROOT / "docs" / "connectors.md").read_text()
    code = next(block for block in doc.split("```python\n")[1:] if 'hr.Pipeline("orders_by_country")' in block)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(compile(code.split("```", 1)[0], "docs/connectors.md", "exec"), namespace)
    shown = doc.split("<!-- orders_by_country output -->\n```\n", 1)[1].split("```", 1)[0]
    assert capsys.readouterr().out == shown
    rows = [row for batch in namespace["orders"].steps for row in batch]
    written = {(directory_value(folder),): sorted(pq.read_table(folder).column("id").to_pylist())
               for folder in (tmp_path / "orders_out").glob("country=*")}
    assert written == ids_by(rows, "country")
    assert "country" not in pq.read_table(tmp_path / "orders_out" / "country=fr").column_names
    assert (tmp_path / "orders_out" / "_spark_metadata").is_dir()  # Spark's own streaming file writer wrote them


def test_several_sinks_write_partitioned_batches_in_both_formats(spark: Any, tmp_path: Path) -> None:
    """Beside another sink, each batch goes to its own directory, partitioned inside it."""
    p = hr.Pipeline("files_partitioned_per_batch")
    orders = p.source("orders", TestSource(ORDERS, schema=SCHEMA))
    orders.sink("by_country", hr.sinks.Files(str(tmp_path / "parquet"), partition_by="country"))
    orders.sink("by_day", hr.sinks.Files(str(tmp_path / "jsonl"), format="jsonl", partition_by=["country", "day"]))
    orders.sink("all", TestSink())
    run_to_completion(p, state_dir=str(tmp_path / "state"))
    rows = [row for batch in ORDERS for row in batch]

    parquet = [folder for batch in sorted((tmp_path / "parquet").glob("batch-*")) for folder in batch.iterdir()
               if folder.is_dir()]
    assert {folder.name for folder in parquet} == {
        "country=fr", "country=pt", "country=__HIVE_DEFAULT_PARTITION__", "country=a%2Fb%3Ac"}
    written: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for folder in parquet:
        table = pq.read_table(folder)
        assert table.column_names == ["id", "day", "amount"]
        written[(directory_value(folder),)] += table.column("id").to_pylist()
    assert {key: sorted(ids) for key, ids in written.items()} == ids_by(rows, "country")

    lines: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for file in (tmp_path / "jsonl").glob("batch-*/country=*/day=*/*.json"):
        key = (directory_value(file.parent.parent), int(file.parent.name.split("=", 1)[1]))
        lines[key] += [json.loads(line)["id"] for line in file.read_text().splitlines()]
    assert {key: sorted(ids) for key, ids in lines.items()} == ids_by(rows, "country", "day")

    # read_rows puts the partition columns back, last, as the text of their directory names
    as_text = sorted((r["id"], r["country"], None if r["day"] is None else str(r["day"]), r["amount"]) for r in rows)
    for path, fmt in ((tmp_path / "parquet", "parquet"), (tmp_path / "jsonl", "jsonl")):
        back = read_rows(str(path), fmt)
        assert sorted((r["id"], r["country"], str(r["day"]), r["amount"]) for r in back) == as_text
    assert list(read_rows(str(tmp_path / "jsonl"), "jsonl")[0])[-2:] == ["country", "day"]


# -- refused when the pipeline is built ---------------------------------------------------------------------------

def orders_stream(name: str) -> hr.Stream:
    return hr.Pipeline(name).source("orders", TestSource(ORDERS, schema=SCHEMA))


@pytest.mark.fast
def test_partition_by_is_refused_when_the_pipeline_is_built(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    with pytest.raises(PlanError) as error:
        hr.sinks.Files(out, partition_by=[])
    assert str(error.value) == (f"FileSink({out!r}): partition_by=[] names no column; give one or more column "
                                "names, or leave partition_by out")
    with pytest.raises(PlanError, match=r"FileSink\(.*\): partition_by \['day', 'day'\] names a column twice"):
        hr.sinks.Files(out, partition_by=["day", "day"])
    with pytest.raises(PlanError, match=r"partition_by must be a column name or a list of column names, got 3"):
        hr.sinks.Files(out, partition_by=3)  # type: ignore[arg-type]

    orders = orders_stream("partition_refusals")
    with pytest.raises(PlanError) as error:
        line = next_line()
        orders.sink("files", hr.sinks.Files(out, partition_by=["contry"]))
    assert str(error.value) == (
        f"sink 'files' ({FILE}:{line}): partition_by column(s) ['contry'] are not in the stream's columns "
        "['id', 'country', 'day', 'amount']; fix partition_by= or add the columns")
    with pytest.raises(PlanError) as error:
        line = next_line()
        orders.sink("files", hr.sinks.Files(out, partition_by=["id", "country", "day", "amount"]))
    assert str(error.value) == (
        f"sink 'files' ({FILE}:{line}): partition_by ['id', 'country', 'day', 'amount'] names every column of the "
        "stream ['id', 'country', 'day', 'amount'], which would leave the files no column (Spark refuses it); leave "
        "at least one column out")
    with pytest.raises(PlanError, match=r"sink 'group' \(.*\): its member 'backup': partition_by column\(s\) "
                                        r"\['contry'\] are not in the stream's columns"):
        orders.sink("group", hr.sinks.Failover(hr.sinks.Console(), hr.sinks.Files(out, partition_by="contry")))
    orders.sink("files", hr.sinks.Files(out, partition_by=["country", "day"]))
    orders.pipeline.validate()


@pytest.mark.fast
def test_a_stream_whose_columns_are_unknown_is_checked_when_it_starts(tmp_path: Path) -> None:
    from pyspark.sql.types import LongType, StringType, StructField, StructType  # types only: no Spark session

    p = hr.Pipeline("partition_unknown_columns")
    p.source("orders", TestSource(ORDERS, schema=SCHEMA))
    sink = hr.sinks.Files(str(tmp_path / "out"), partition_by="contry")
    p.sql("SELECT id, country FROM orders", name="picked").sink("files", sink)
    p.validate()  # an SQL step's columns are known once Spark plans it
    schema = StructType([StructField("id", LongType()), StructField("country", StringType())])
    with pytest.raises(SinkError, match=r"^sink 'files' \(app.py:3\): partition_by column\(s\) \['contry'\] are not "
                                        r"in the stream's columns \['id', 'country'\]"):
        sink.check_schema(schema, SinkStep("files", "app.py:3"))


def write_pipeline_file(tmp_path: Path, sink: str, steps: str = "") -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text(textwrap.dedent("""\
        pipeline: words_to_files
        sources:
          lines:
            type: Generator
            kind: words
            limit: 10
        """) + textwrap.dedent(steps) + "sinks:\n" + textwrap.indent(textwrap.dedent(sink), "  "))
    return path


@pytest.mark.fast
def test_a_pipeline_file_passes_partition_by_to_a_files_sink(tmp_path: Path) -> None:
    out = tmp_path / "out"
    p = hr.load_pipeline_file(write_pipeline_file(tmp_path, f"""\
        files:
          type: Files
          from: lines
          path: {out}
          partition_by: [line]
        """))
    (sink,) = p.plan.sinks()
    assert sink.connector.partition_by == ("line",)
    with pytest.raises(PipelineFileError, match=r"^pipeline.yaml:8: sink 'files': partition_by column\(s\) "
                                                r"\['country'\] are not in the stream's columns \['line', "
                                                r"'event_time'\]; fix partition_by= or add the columns$"):
        hr.load_pipeline_file(write_pipeline_file(tmp_path, f"""\
            files:
              type: Files
              from: lines
              path: {out}
              partition_by: [country]
            """))
    with pytest.raises(PipelineFileError, match=r"^pipeline.yaml:8: sink 'files': FileSink\(.*\): partition_by=\[\] "
                                                r"names no column"):
        hr.load_pipeline_file(write_pipeline_file(tmp_path, f"""\
            files:
              type: Files
              from: lines
              path: {out}
              partition_by: []
            """))


# -- update-mode results into an append-only sink -----------------------------------------------------------------

def refusal(step: str, step_at: str) -> str:
    """What a Files sink below ``step`` is told, after the sink's name."""
    return (f"a Files sink cannot take the updates of step {step!r} ({step_at}), which emits "
            "updates (Spark's update mode: each micro-batch emits again every group it changed): files keep every "
            "row they are given, so each group's updates would pile up as rows; write the updates to a sink that "
            f"keeps each group's last update by its key: {KEEPING}; or emit each result once (a window with "
            "emit='final')")


@pytest.mark.fast
def test_updates_into_files_are_refused_at_every_front_door(tmp_path: Path) -> None:
    out = hr.sinks.Files(str(tmp_path / "out"), partition_by="country")
    orders = orders_stream("fluent_updates_into_files")
    count_line = next_line()
    counts = orders.key_by("country").count()
    with pytest.raises(PlanError) as error:
        line = next_line()
        counts.sink("files", out)
    assert str(error.value) == f"sink 'files' ({FILE}:{line}): " + refusal("count", f"{FILE}:{count_line}")

    sql = orders_stream("sql_updates_into_files").pipeline
    sql_line = next_line()
    totals = sql.sql("SELECT country, count(*) AS n FROM orders GROUP BY country", name="per_country")
    with pytest.raises(PlanError) as error:
        line = next_line()
        totals.sink("files", out)
    assert str(error.value) == f"sink 'files' ({FILE}:{line}): " + refusal("per_country", f"{FILE}:{sql_line}")

    with pytest.raises(PipelineFileError) as file_error:
        hr.load_pipeline_file(write_pipeline_file(tmp_path, f"""\
            files:
              type: Files
              from: counts
              path: {tmp_path / "out"}
            """, steps="""\
            steps:
              - name: by_line
                from: lines
                key_by: line
              - name: counts
                from: by_line
                aggregate: {count: count}
            """))
    assert str(file_error.value) == "pipeline.yaml:15: sink 'files': " + refusal("counts", "pipeline.yaml:13")

    builder = hr.TopologyBuilder("storm_updates_into_files")
    builder.set_spout("orders", TestSource(ORDERS, schema=SCHEMA))
    spout_line = next_line()
    spout_counts = builder.stream("orders").key_by("country").count(name="per_country")
    with pytest.raises(PlanError) as error:
        line = next_line()
        spout_counts.sink("files", out)
    assert str(error.value) == f"sink 'files' ({FILE}:{line}): " + refusal("per_country", f"{FILE}:{spout_line}")

    # the sinks the message names take the updates
    counts.sink("delta", hr.sinks.Delta(str(tmp_path / "delta"), key="country"))
    counts.sink("kafka", hr.sinks.Kafka("per_country", key="country"))
    counts.sink("postgres", hr.sinks.Postgres("per_country", key="country"))
    counts.sink("redis", hr.sinks.Redis(key_prefix="per_country", key="country"))
    orders.pipeline.validate()


@pytest.mark.fast
def test_the_refusal_docs_connectors_md_shows_is_the_one_a_user_sees(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "connectors.md").read_text()
    shown = doc.split("**Sinks and update mode.**", 1)[1].split("```\n", 2)[1].strip()
    p = hr.Pipeline("docs_updates_into_files")
    counts = p.source("events", TestSource([], schema={"user": "string"})).key_by("user").count(name="per_user")
    with pytest.raises(PlanError) as error:
        counts.sink("files", hr.sinks.Files(str(tmp_path / "out")))
    assert re.sub(r"\(\S+:\d+\)", "(...)", str(error.value)) == re.sub(r"\(\S+:\d+\)", "(...)", shown)
