"""What every connector declares, and the contract between headrace and its Python data sources.

Sources are Spark Python data sources (``pyspark.sql.datasource``). Besides the
columns of their schema, every headrace source emits:

* ``_hr_ctl`` (long, nullable): null on data rows. A *control row* has every
  data column null and ``_hr_ctl`` set to an event time in epoch milliseconds
  that only the watermark sees: the compiler turns it into the row's event time
  (plus the declared out-of-orderness) and drops the row right after the
  watermark operator. A bounded source ends with one control row at
  ``FLUSH_TIME_MS`` so that the next micro-batch fires every open window.
* when ``emits_dead_letters`` is true, ``_hr_dead_raw``, ``_hr_dead_error`` and
  ``_hr_dead_position`` (strings, null on good rows): a record that could not
  be parsed (its data columns are not read: the row goes to the dead letters only).

Every source takes the Spark options ``hr_run_dir`` and ``hr_source``. When the
file ``<hr_run_dir>/stop`` exists, ``latestOffset`` must return the offset it
returned last (the runtime is draining the pipeline to a batch boundary). A
bounded source writes ``<hr_run_dir>/exhausted/<hr_source>`` once the offset it
returns covers all its input, flush row included. A source Spark reads itself, whose end the
query cannot see (``Files`` read by Spark's file source), does both through
``SourceConnector.between_batches``, which the runner calls between micro-batches.

Spark counts control rows among a batch's input rows; headrace's progress takes them off
(``headrace/runtime/progress.py``). A source's flush row is counted from its offsets: the
end offset of the batch that carries it is the first to hold ``"flushed": true``
(``flush_rows``). A source that emits other control rows (the test kit's watermark and clock
rows) sets ``other_control_rows``: the compiler then counts its control rows in each batch
with an observed metric, which costs a little per row.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from headrace.schema import Schema
from headrace.sink_step import SinkStep

CONTROL_COLUMN = "_hr_ctl"
# The names of the metrics a query observes (Spark's observe()), read back by the progress report.
DEAD_LETTER_METRIC_PREFIX = "hr_dead_letters_"  # + source: records a source sent to its dead letters
LATE_METRIC_PREFIX = "hr_late_"  # + step: late records a window processor dropped
CONTROL_METRIC_PREFIX = "hr_control_"  # + source: control rows a source emitted (not records)
REPEAT_METRIC_PREFIX = "hr_repeat_"  # + source: rows Spark counted again, the query scanning it per branch
DRIFT_METRIC_PREFIX = "hr_drift_"  # + step: the records a learn step flagged as drift
STEP_METRIC_PREFIX = "hr_step_"  # + step: the records a step of the query handed on (control rows not counted)
RECORDS_FIELD = "records"  # the field of a step's (or a source's) records in its observed metric
DEAD_COLUMNS = ("_hr_dead_raw", "_hr_dead_error", "_hr_dead_position")
# what a source read strictly (``SourceContext.strict``) fails a batch with on a bad record, beside
# Spark's own parse error in FAILFAST mode (``strict_read_failed``)
STRICT_READ_FAILED = "headrace: a record a strict read cannot take"
_FAILFAST_PARSE = "MALFORMED_RECORD_IN_PARSING"

# 9999-12-31: raises the watermark past every real window at the end of a bounded input.
FLUSH_TIME_MS = 253_402_214_400_000
# A watermark past this (the year 5984) is the end of a bounded input: Spark holds a stream-stream
# join's output watermark back by the join's bound in event time, so a step after it sees less.
END_OF_INPUT_MS = FLUSH_TIME_MS // 2
FLUSHED = "flushed"  # the offset key of a source whose flush row has been handed out


def strict_read_failed(trace: str) -> bool:
    """Whether a query failed (Spark's whole account in ``trace``) on a bad record of a source read strictly."""
    return STRICT_READ_FAILED in trace or _FAILFAST_PARSE in trace


def flush_rows(start: Any, end: Any) -> int:
    """The flush rows a batch from offset ``start`` to ``end`` carries (0 or 1): one when ``end``
    is the first offset marked flushed. Offsets come as dicts, or as Spark's JSON text.

    >>> flush_rows({"offset": 5}, {"offset": 9, "flushed": True}), flush_rows('{"flushed": true}', '{"flushed": true}')
    (1, 0)
    """
    def flushed(offset: Any) -> bool:
        if isinstance(offset, str):
            try:
                offset = json.loads(offset)
            except ValueError:
                return False
        return isinstance(offset, dict) and bool(offset.get(FLUSHED))
    return int(flushed(end) and not flushed(start))


def clock_control(time_ms: int) -> int:
    """The ``_hr_ctl`` value of a control row that moves the test clock of processing-time
    triggers to ``time_ms``: negative, so that the watermark reads it as time 0."""
    return -(time_ms + 1)


class Guarantee(Enum):
    """Delivery guarantees, strongest first."""

    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    AT_MOST_ONCE = "at-most-once"

    @property
    def rank(self) -> int:
        return list(Guarantee).index(self)

    @staticmethod
    def weakest(guarantees: list[Guarantee]) -> Guarantee:
        return max(guarantees, key=lambda g: g.rank, default=Guarantee.EXACTLY_ONCE)


@dataclass(frozen=True)
class SourceContext:
    """Where a running source keeps its run-time files, the query's checkpoint ("" when the
    query is compiled without one), whether a step reads the source's control rows (an
    event-time step: a source may leave out its flush row otherwise), and of the fields the
    source converts and checks (``checked_fields``) those some step reads (None: all). A
    probe (``probe_fields``) marks each such conversion instead, unchecked, so that the
    compiler can see which ones Spark keeps (``headrace/spark/fields_read.py``)."""

    run_dir: str
    source_name: str
    checkpoint: str = ""
    control_read: bool = True
    fields_read: frozenset[str] | None = None
    probe_fields: bool = False
    # a pipeline with several sources: the source counts its records (rows that are not control
    # rows) in the observed metric it keeps anyway (``count_dead_letters``)
    count_records: bool = False
    # the query counts the source's dead letters itself, as its input rows less its good rows
    # (``headrace/spark/step_counts.py``): the source keeps no observed metric for them
    dead_letters_counted: bool = False
    # nothing reads the source's dead letters but their count: a source that ``reads_strictly``
    # keeps none, and fails the batch on a bad record (``STRICT_READ_FAILED`` or Spark's
    # FAILFAST parse error); the runner then reads the batch again with this off
    strict: bool = False

    def options(self) -> dict[str, str]:
        return {"hr_run_dir": self.run_dir, "hr_source": self.source_name}


class SourceConnector:
    """A source: a Spark Python data source plus what headrace needs to know about it."""

    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    emits_dead_letters: bool = False
    # its read_stream calls count_dead_letters itself, where that costs least (the compiler
    # otherwise counts the rows of its output with an _hr_dead_error)
    counts_dead_letters: bool = False
    reads_strictly: bool = False  # can read with ``SourceContext.strict`` (see there)
    test_clock: bool = False  # processing time is the test kit's clock, moved by control rows
    other_control_rows: bool = False  # control rows besides the flush row (see the module's docstring)
    drains_on_stop: bool = True  # hands out no new data once the stop file exists (see the module's docstring)
    real_time: bool = False  # read by Spark's real-time mode (headrace/spark/real_time.py)
    lowered_as: str = "Python data source"  # for explain
    # The pyspark DataSource that reads for this source, as "module:Class", imported when a
    # query starts (so that building a plan never loads pyspark); or override data_source().
    spark_data_source: str = ""

    @property
    def bounded(self) -> bool:
        """True when the input ends: the pipeline then runs to completion and flushes its windows."""
        return False

    def schema(self) -> Schema:
        raise NotImplementedError

    def data_source(self) -> type:
        """The ``pyspark.sql.datasource.DataSource`` subclass to register."""
        if not self.spark_data_source:
            raise NotImplementedError(f"{type(self).__name__} names no Spark data source")
        module, _, name = self.spark_data_source.partition(":")
        return getattr(importlib.import_module(module), name)

    def options(self) -> dict[str, str]:
        """Spark options describing this source (strings only)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-able description for explain and the plan's JSON."""
        return {"type": type(self).__name__, **self.options()}

    def offset_identity(self) -> dict[str, Any]:
        """The settings that fix what an offset means: which records a range of offsets
        yields. A checkpoint's offsets are only valid for a source with the same identity
        (``headrace/runtime/compatibility.py``). Default: every option; a connector narrows
        it to what changes the records, leaving out knobs such as batch sizes."""
        return dict(self.options())

    def checked_fields(self) -> tuple[str, ...]:
        """The fields this source converts and checks in the query (a dead letter when one does
        not convert), only when a step reads them (``SourceContext.fields_read``)."""
        return ()

    def prepare(self, context: SourceContext) -> None:  # noqa: B027 - optional hook
        """Called on the driver before the query starts (write fixtures, check paths)."""

    def spark_packages(self) -> list[Any]:
        """The Spark packages (``headrace.environment.jars.Package``) this source needs."""
        return []

    def between_batches(self, context: SourceContext) -> None:
        """Called by the runner between micro-batches, for a source whose query cannot see the
        end of its input by itself (a bounded ``Files`` source read by Spark's file source)."""

    def read_stream(self, spark: Any, context: SourceContext) -> Any:
        """The source's streaming DataFrame: its data columns and the control column (and the
        dead-letter columns, when it emits dead letters). By default, the Python data source."""
        data_source: Any = self.data_source()
        spark.dataSource.register(data_source)
        return spark.readStream.format(data_source.name()).options(**self.options(), **context.options()).load()


class SinkConnector:
    """A sink. It writes each micro-batch through ``write_batch`` (Spark's foreachBatch),
    or, when it is a pipeline's only sink and ``native_format`` is set, through Spark's
    own streaming writer of that format.

    ``write_batch`` must read the whole batch (every row of every partition): Spark commits
    the state of a batch's stateful operators only when the batch is run to its end, and
    fails it otherwise (``STATE_STORE_COMMIT_VALIDATION_FAILED``). A sink that skips a batch
    it committed before says so in ``committed``; the dispatcher then runs the batch itself
    (``run_batch``) instead of calling ``write_batch``."""

    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    native_format: str | None = None
    # the columns whose values name the directories rows are written into (Hive style,
    # col=value/), passed to Spark's own writer as partitionBy when the sink writes through it
    partition_by: tuple[str, ...] = ()
    # how a user makes this sink keep each group's last update by its key: what follows
    # hr.sinks.<Name> ("(..., key=[...])"), named by the refusal of a sink that cannot take
    # updates; empty when it cannot
    keyed_updates: str = ""
    # ``write_batch`` reads its frame in one pass (one Spark action): a pipeline's only sink that
    # does so gets the micro-batch as it comes, not cached first (headrace/spark/writer.py)
    reads_batch_once: bool = False

    def committed(self, batch_id: int) -> bool:
        """Whether this sink has already committed ``batch_id`` (Spark replays the batch that
        was running when a query died): then ``write_batch`` is not called for it."""
        return False

    def write_batch(self, df: Any, batch_id: int) -> None:
        raise NotImplementedError

    def native_options(self) -> dict[str, str]:
        return {}

    def native_frame(self, df: Any) -> Any:
        """The rows as Spark's own writer of ``native_format`` takes them."""
        return df

    def describe(self) -> dict[str, Any]:
        return {"type": type(self).__name__}

    def prepare(self, run_dir: str) -> None:  # noqa: B027 - optional hook
        """Called on the driver before the query starts."""

    def locate_checkpoint(self, checkpoint: str) -> None:  # noqa: B027 - optional hook
        """Called on the driver before the query starts with the query's checkpoint, for a sink
        that records what Spark keeps there of each batch (a view: the batch's watermark)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Called on the driver when a run ends, once its query has stopped: release what
        ``write_batch`` opened (connections, clients). A later run opens them again."""

    def spark_packages(self) -> list[Any]:
        """The Spark packages (``headrace.environment.jars.Package``) this sink needs."""
        return []

    def check_schema(self, schema: Any, step: SinkStep) -> None:  # noqa: B027 - optional hook
        """Called on the driver when the pipeline starts, before the first micro-batch, with the
        Spark schema of the rows this sink will get; ``step`` names the sink step for every
        message. A sink whose target has a schema of its own checks it here."""

    def for_keys(self, keys: tuple[str, ...]) -> SinkConnector:
        """This sink for a stream whose rows are named by ``keys`` (a keyed aggregate's, a window's:
        ``headrace/api/view_keys.py``), asked when the pipeline is built: a sink whose key defaults
        to them returns a copy keyed so; others return themselves."""
        return self

    def refuses_columns(self, columns: list[str]) -> str | None:
        """Why this sink cannot write a stream of ``columns`` (their names), or None: asked when
        the pipeline is built, when the stream's columns are known then."""
        return None

    def refuses_updates(self) -> str | None:
        """Why this sink cannot take the rows of Spark's update mode (a group's new value each
        micro-batch that changes it), or None: it takes each update as a record (a log, a
        topic, the console), or replaces a row by its key."""
        return None
