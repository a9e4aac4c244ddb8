"""Why a pipeline's query failed, in one line that names the step, and whether starting it
again from its checkpoint can help.

Spark reports a failed query as one exception whose text nests the real cause: a Python
worker's traceback, a Py4J error raised in ``foreachBatch``, a Java exception several
``Caused by`` deep. ``classify`` reads Spark's whole account (``spark_trace``) and returns the
headrace error the user sees, with that account attached as ``error.trace`` (printed by
``headrace run --verbose``; Spark's log has it too), and whether the failure is worth a restart.

Worth a restart (the machinery failed, not the data or the code, so a new attempt from the
checkpoint can get past it):

* a Python worker that crashed (exited unexpectedly: killed, out of memory, a fault in native code);
* the Python streaming source runner lost: the process serving a source's offsets died or its
  connection broke (Spark's ``STREAM_FAILED`` with the runner in its trace);
* a Python worker that did not start: it failed to connect back to Spark in time, or another
  process reached its socket first (``Authentication failed``: on a busy machine, a worker Spark
  gave up on may reach a later worker's port);
* a lost connection: Python's ``ConnectionError`` family and ``TimeoutError``, PostgreSQL's
  ``OperationalError``, Java's socket and connect exceptions, the Kafka client's timeout and
  network exceptions (Spark's Kafka source whose brokers are out of reach), in a source, a sink
  or a user function;
* a source's or a sink's server out of reach past the connector's own retries (its error says
  ``... unreachable after N attempts``, ``headrace/connectors/retry.py``), also when the server
  is still out of reach as a restart starts the query again.

Not worth one: a user function that raised anything else (it raises again on the same records
when the batch is replayed), a source's or a sink's own error, a class Spark cannot load, and
any failure headrace cannot tell is transient. Errors found before Spark starts (``PlanError``,
``IncompatibleCheckpoint``, ``SetupError``) never reach a running query.

The error's ``refusal`` (``headrace/errors.py``) follows: a failure worth a restart is no
refusal; one headrace knows no restart can cure (a class Spark cannot load, an unfinished
rescale, a result behind the watermark) is one, and so is a user function's or a connector's
own error; a failure headrace cannot tell keeps ``PipelineFailed``'s (no refusal: the server
may try a new driver).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from headrace.connectors.retry import UNREACHABLE
from headrace.errors import HeadraceError, PipelineFailed, SinkError, SourceError, python_worker_crashed, raised_inside
from headrace.plan.graph import Plan
from headrace.plan.nodes import Node

SOURCE_RUNNER = "PythonStreamingSourceRunner"
STATEFUL_PROCESSOR = "TransformWithStateInPySpark"
WORKER_NOT_STARTED = "Python worker failed to connect back"  # Spark's words for a worker that never got going
_RUNNER_LOST = re.compile(r"java\.io\.EOFException|java\.net\.Socket\w*Exception|exited unexpectedly")
_CONNECTION_LOST = re.compile(
    r"\b(?:ConnectionError|ConnectionResetError|ConnectionRefusedError|ConnectionAbortedError|BrokenPipeError"
    r"|TimeoutError|OperationalError|java\.net\.(?:Connect|Socket|SocketTimeout|NoRouteToHost)Exception"
    r"|org\.apache\.kafka\.common\.errors\.(?:Timeout|Network|Disconnect)Exception)\b")  # brokers out of reach
_UNREACHABLE = re.compile(re.escape(UNREACHABLE) + r" \d+ attempts?\b")
_NO_DATA_SOURCE = re.compile(r"Failed to find the data source: (\S+?)\.?\s")
_NO_CLASS = re.compile(r"(?:ClassNotFoundException|NoClassDefFoundError): ([\w.$/]+)")
_HEADLINE = re.compile(r"^(?:Caused by: )?((?:[a-z_]\w*\.)+[A-Z]\w*(?:Exception|Error)\b.*"  # java.io.EOFException
                       r"|[A-Z]\w*(?:Exception|Error): .*)$")  # ValueError: ...
UNFINISHED_RESCALE = "STREAMING_UNFINISHED_REPARTITION_DETECTED"
OLDER_THAN_WATERMARK = "EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED"
_OLDER = re.compile(r"eventTime=(\d+) which is older than current_watermark_value=(\d+)")
_STREAM_FAILED = re.compile(r"^\[STREAM_FAILED\].*?terminated with exception:\s*")


@dataclass(frozen=True)
class Failure:
    error: HeadraceError  # one line, naming the step where the failure says which
    restartable: bool

    def giving_up(self, attempts: int, policy: str) -> HeadraceError:
        """The error to end the run with when the restart policy (``attempts`` restarts, as
        ``policy`` describes them) allows no further restart."""
        if not attempts:
            return self.error
        error = type(self.error)(f"{self.error} (not restarted again: the restart policy allows {policy})",
                                 refusal=self.error.refusal)
        error.trace = self.error.trace
        return error


def classify(plan: Plan, exc: BaseException, java: Any = None) -> Failure:
    """The headrace error for ``exc`` (a failure of ``plan``'s query; ``java``: the JVM's exception
    behind it, when the caller has it) and whether a restart can help."""
    if isinstance(exc, HeadraceError):  # raised on the driver: a connector's before the query (re)starts
        transient = not exc.refusal or _server_lost(str(exc))
        return _settled(Failure(exc, restartable=isinstance(exc, (SinkError, SourceError)) and transient))
    trace = spark_trace(exc, java)
    failure = _classify(plan, trace)
    failure.error.trace = trace
    return _settled(failure)


def _settled(failure: Failure) -> Failure:
    """The failure, its error no refusal when a restart can help."""
    if failure.restartable:
        failure.error.refusal = False
    return failure


def _classify(plan: Plan, text: str) -> Failure:
    if OLDER_THAN_WATERMARK in text:  # before raised_inside: a sink's write is where Spark noticed it
        return Failure(PipelineFailed(_older_than_watermark(plan, text), refusal=True), restartable=False)
    inner = raised_inside(text)
    if inner is not None:  # a user function, a source or a sink said what went wrong (the record aside)
        return Failure(inner, restartable=_server_lost(str(inner).split(" (record: ")[0]))
    if python_worker_crashed(text):
        steps = _task_steps(plan)
        return Failure(PipelineFailed(
            f"{_who(plan, steps)}: a Python worker crashed while running {_it(steps)} (the process exited "
            "unexpectedly: killed, out of memory or a fault in native code)"), restartable=True)
    if SOURCE_RUNNER in text and _RUNNER_LOST.search(text):
        sources = plan.sources()
        whose = "its offsets" if len(sources) == 1 else "the offsets of one of them"
        return Failure(PipelineFailed(
            f"{_who(plan, sources)}: Spark lost the Python process that serves {whose} (the streaming source runner "
            "died or its connection broke)"), restartable=True)
    if WORKER_NOT_STARTED in text:
        steps = _worker_of(plan, text)
        return Failure(PipelineFailed(
            f"{_who(plan, steps)}: a Python worker for {_it(steps)} did not start (it failed to connect back to "
            f"Spark: {root_cause(text)})"), restartable=True)
    if UNFINISHED_RESCALE in text:
        return Failure(PipelineFailed(
            f"pipeline {plan.name!r}: its checkpoint ends with a state rescale that did not finish; run headrace "
            "rescale again (any number of partitions: it finishes the earlier rescale first), then start the "
            "pipeline", refusal=True), restartable=False)
    missing = _missing_class(plan, text)
    if missing is not None:
        return Failure(PipelineFailed(missing, refusal=True), restartable=False)
    if _CONNECTION_LOST.search(text):
        return Failure(PipelineFailed(f"pipeline {plan.name!r} lost a connection: {root_cause(text)}"),
                       restartable=True)
    return Failure(PipelineFailed(f"pipeline {plan.name!r} failed: {root_cause(text)}"), restartable=False)


def _server_lost(message: str) -> bool:
    """Whether a connector's or a user function's error says a connection was lost or a server
    stayed out of reach past the connector's retries."""
    return bool(_CONNECTION_LOST.search(message) or _UNREACHABLE.search(message))


def _older_than_watermark(plan: Plan, text: str) -> str:
    """A stateful step handed a later one a result at or behind the watermark (headrace/spark/stages.py)."""
    from headrace.spark.specs import result_time_needed  # the runtime's failures need Spark only here

    steps = [n for n in plan.nodes.values() if result_time_needed(plan, n)]
    found = _OLDER.search(text)
    when = (f" (event time {int(found.group(1)) // 1000} ms, watermark {found.group(2)} ms)" if found else "")
    return (f"{_who(plan, steps)}: a result was emitted at an event time at or behind the watermark{when}, and "
            "Spark refuses to hand such a row to a later stateful step; a process step must emit with "
            "timestamp= later than ctx.watermark (e.g. max(ctx.timestamp, ctx.watermark + 1))")


def _missing_class(plan: Plan, text: str) -> str | None:
    source = _NO_DATA_SOURCE.search(text)
    cls = _NO_CLASS.search(text)
    if source is None and cls is None:
        return None
    name = cls.group(1).replace("/", ".") if cls else source.group(1)  # type: ignore[union-attr]
    wanted = source.group(1) if source else name
    users = [node for node in plan.nodes.values() if _format_of(node) and wanted.startswith(_format_of(node))]
    what = f"Spark has no data source {wanted!r} (class {name} not found)" if source else \
        f"Spark cannot load class {name}"
    return (f"{_who(plan, users)}: {what}: add the jar that provides it to Spark's classpath "
            "(spark.jars.packages or spark.jars)")


def _format_of(node: Node) -> str:
    """The Spark format a source or sink asks for, if any."""
    connector: Any = getattr(node, "connector", None)
    return getattr(connector, "native_format", None) or ""


def _worker_of(plan: Plan, text: str) -> Sequence[Node]:
    """The steps whose Python worker Spark was starting: a source's runner, a stateful
    processor's driver side (``TransformWithStateInPySpark``) or a task's."""
    if SOURCE_RUNNER in text:
        return plan.sources()
    if STATEFUL_PROCESSOR in text:
        from headrace.spark.specs import spec_of  # the runtime's failures need Spark only here

        return [node for node in plan.nodes.values() if spec_of(node).stateful]
    return _task_steps(plan)


def _task_steps(plan: Plan) -> Sequence[Node]:
    """The steps a task's Python worker may be running: those with user functions, else the sources."""
    return _user_code(plan) or plan.sources()


def _user_code(plan: Plan) -> list[Node]:
    """The steps that run user functions in Spark's Python workers."""
    return [node for node in plan.nodes.values()
            if getattr(node, "fn", None) is not None or getattr(node, "reduce_fn", None) is not None]


def _who(plan: Plan, nodes: Sequence[Node]) -> str:
    """``step 'parse' (app.py:12)``, ``sources 'a' (app.py:3), 'b' (app.py:5)`` or the pipeline."""
    if not nodes:
        return f"pipeline {plan.name!r}"
    kinds = {node.kind for node in nodes}
    noun = next(iter(kinds)) if len(kinds) == 1 and kinds <= {"source", "sink"} else "step"
    named = ", ".join(f"'{node.name}' ({node.defined_at})" for node in nodes)
    return f"{noun if len(nodes) == 1 else noun + 's'} {named}"


def _it(nodes: Sequence[Node]) -> str:
    return "it" if len(nodes) <= 1 else "one of them"


def root_cause(text: str) -> str:
    """The innermost exception Spark's account names, in one line."""
    lines = [line.strip() for line in text.splitlines()]
    headlines = [match.group(1) for line in lines if (match := _HEADLINE.match(line))]
    if headlines:
        return headlines[-1]
    first = next((line for line in lines if line), "unknown error")
    return _STREAM_FAILED.sub("", first) or first


def spark_trace(exc: BaseException, java: Any = None) -> str:
    """Spark's whole account of ``exc``: its message, then the JVM's exception (``java``, or the
    one Py4J carried) with every cause and frame."""
    parts = [str(exc)]
    for throwable in (java, getattr(exc, "_origin", None), getattr(exc, "java_exception", None)):
        if throwable is None:
            continue
        try:
            from pyspark import SparkContext

            text = str(SparkContext._jvm.org.apache.spark.util.Utils.exceptionString(throwable))  # type: ignore
        except Exception:  # noqa: BLE001 - the JVM is gone: the message is all there is
            continue
        if text not in parts:
            parts.append(text)
    return "\n".join(parts)
