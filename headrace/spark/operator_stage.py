"""Lowering operators (Apex operators, Storm bolts) in each micro-batch.

An operator runs inside ``foreachBatch``, where the micro-batch's id is known: it is the
streaming window's id. Per operator and micro-batch:

1. its input rows: the rows of each incoming stream, already routed to an instance (a step's
   rows are routed here, in a fused Arrow stage; another operator's rows were routed when
   they were emitted), plus one heartbeat row per instance, so every instance runs every window;
2. ``groupBy(instance).applyInArrow``: each instance runs the window on its rows, ordered by
   stream and position (headrace/engine/instances.py), from the state of the previous window;
3. the result is cached; the instances' state rows are collected (one per instance) and saved
   as the window's version (headrace/environment/operator_snapshots.py) before any sink writes.

A replayed batch starts again from the previous window's state, so it emits the same rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import cloudpickle
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from headrace.code_locations import ship_class_by_value
from headrace.contract import CONTROL_COLUMN, FLUSH_TIME_MS
from headrace.engine.instances import FAILED_EDGE, HEARTBEAT_EDGE, STATE_EDGE, Route, WindowSpec, dumps, run_chain
from headrace.environment import storage
from headrace.environment.operator_snapshots import OperatorStateStore
from headrace.errors import StepFunctionError, raised_inside
from headrace.groupings import Global
from headrace.plan.graph import Plan
from headrace.plan.nodes import Edge, OperatorNode, PortNode
from headrace.schema import arrow_schema, to_ddl
from headrace.spark.clocks import uses_test_clock

if TYPE_CHECKING:
    from headrace.spark.compilation import Compilation

EDGE, TARGET, ORDER, PAYLOAD, FLUSH = "_hr_edge", "_hr_target", "_hr_order", "_hr_payload", "_hr_flush"
ROWS = pa.schema([(EDGE, pa.int32()), (TARGET, pa.int32()), (ORDER, pa.int64()), (PAYLOAD, pa.binary()),
                  (FLUSH, pa.bool_())])
ROWS_DDL = f"{EDGE} int, {TARGET} int, {ORDER} long, {PAYLOAD} binary, {FLUSH} boolean"


def routes_of(plan: Plan, node: OperatorNode) -> dict[str, tuple[Route, ...]]:
    """Output port -> the streams leaving it: edges into other operators, and port streams."""
    routes: dict[str, list[Route]] = {}
    for consumer in plan.consumers(node.name):
        if isinstance(consumer, OperatorNode):
            for edge in consumer.edges:
                if edge.source == node.name:
                    assert edge.port is not None
                    routes.setdefault(edge.port, []).append(Route(edge.id, edge.grouping, consumer.partitions))
        elif isinstance(consumer, PortNode):
            routes.setdefault(consumer.port, []).append(Route(consumer.edge, Global(), 1))
    return {port: tuple(r) for port, r in routes.items()}


def batch_times(checkpoint: str, batch_id: int, test_clock: bool = False) -> int:
    """The micro-batch's time in epoch ms, from Spark's offset log (the same on a replay). On
    the test kit's clock: the clock's time, which the TestSources' offsets carry (0 before any
    ``ProcessingTime`` marker)."""
    lines = storage.read_text(storage.join(checkpoint, "offsets", str(batch_id))).splitlines()
    if test_clock:
        offsets = [json.loads(line) for line in lines[2:] if line.startswith("{")]
        return max((int(o["clock"]) for o in offsets if "clock" in o), default=0)
    return int(json.loads(lines[1]).get("batchTimestampMs", 0))


def fused_into(plan: Plan, node: OperatorNode) -> OperatorNode | None:
    """The operator whose Python stage runs ``node`` (its only input is a thread-local stream
    from it), if any."""
    if len(node.edges) == 1 and node.edges[0].locality == "thread_local":
        sender = plan.nodes[node.edges[0].source]
        assert isinstance(sender, OperatorNode)
        return sender
    return None


def chain_of(plan: Plan, head: OperatorNode) -> list[OperatorNode]:
    """``head`` and the operators fused into its stage, directly or not, in plan order."""
    members = [head]
    for candidate in plan.nodes.values():
        if isinstance(candidate, OperatorNode) and fused_into(plan, candidate) in members:
            members.append(candidate)
    return members


def lower_operator(node: OperatorNode, lowering: Compilation) -> DataFrame:
    if lowering.batch_id is None or lowering.checkpoint is None:
        raise AssertionError(f"operator {node.name!r} is lowered outside a micro-batch")
    sender = fused_into(lowering.plan, node)
    if sender is not None:  # runs in its sender's stage, whose output holds its rows too
        return lowering.frame(sender.name)
    window, checkpoint = lowering.batch_id, lowering.checkpoint
    members = chain_of(lowering.plan, node)
    stores = [OperatorStateStore(checkpoint, m.name) for m in members]
    processing_time = batch_times(checkpoint, window, uses_test_clock(lowering.plan))
    specs = []
    for member, store in zip(members, stores, strict=True):
        ship_class_by_value(type(member.operator))
        specs.append(WindowSpec(member.name, cloudpickle.dumps(member.operator), member.partitions,
                                {e.id: e.target_port for e in member.edges}, routes_of(lowering.plan, member),
                                member.application_window, window, processing_time,
                                store.load_before(window, member.partitions)))
    fused = {m.edges[0].id: position for position, m in enumerate(members) if position}
    spark = lowering.spark
    heartbeats = spark.createDataFrame([(HEARTBEAT_EDGE, i, 0, None, False) for i in range(node.partitions)], ROWS_DDL)
    parts = [heartbeats]
    for edge in node.edges:
        upstream = lowering.plan.nodes[edge.source]
        if isinstance(upstream, OperatorNode):
            parts.append(lowering.frame(upstream.name).filter(F.col(EDGE) == edge.id))
        else:
            parts.append(_routed(lowering.frame(edge.source), edge, node.partitions))
    rows = parts[0]
    for part in parts[1:]:
        rows = rows.unionByName(part)

    def run(key: Any, table: pa.Table) -> pa.Table:
        index = key[0].as_py()
        table = table.sort_by([(EDGE, "ascending"), (ORDER, "ascending")])
        ordered = zip(table.column(EDGE).to_pylist(), table.column(PAYLOAD).to_pylist(),
                      table.column(FLUSH).to_pylist(), strict=True)
        return pa.Table.from_batches([_rows_batch(run_chain(specs, index, ordered, fused))], schema=ROWS)

    output = rows.groupBy(TARGET).applyInArrow(run, ROWS_DDL).persist()
    lowering.cached.append(output)
    try:
        collected = output.filter(F.col(EDGE) <= STATE_EDGE).collect()  # states, and failed tuples
    except Exception as exc:
        upstream_error = raised_inside(str(exc), only=("StepFunctionError",))
        if upstream_error is not None:
            raise upstream_error from None
        raise
    for position, (member, store) in enumerate(zip(members, stores, strict=True)):
        store.save(window, member.partitions, {r[TARGET]: bytes(r[PAYLOAD]) for r in collected
                                               if r[EDGE] == STATE_EDGE and r[ORDER] == position})
    failed = {root for r in collected if r[EDGE] == FAILED_EDGE for root in cloudpickle.loads(bytes(r[PAYLOAD]))}
    if failed:
        from headrace.connectors.spout import record_failures

        record_failures(lowering.run_dir, window, failed)
    return output.filter(F.col(EDGE) >= 0)


def _routed(df: DataFrame, edge: Edge, instances: int) -> DataFrame:
    """A step's rows as operator rows: each routed by the edge's grouping, in the order of the
    micro-batch; a bounded input's flush row becomes a flush row to every instance."""
    columns = [c for c in df.columns if c != CONTROL_COLUMN]
    has_control = CONTROL_COLUMN in df.columns
    grouping = edge.grouping
    ordered = df.withColumn(ORDER, F.monotonically_increasing_id())

    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        emitter = context.partitionId() if context is not None else 0
        sent = [0] * instances
        for batch in batches:
            out: list[tuple[int, int, int, bytes | None, bool]] = []
            data = batch.select(columns).to_pylist()
            orders = batch.column(ORDER).to_pylist()
            controls = batch.column(CONTROL_COLUMN).to_pylist() if has_control else [None] * len(data)
            for record, order, control in zip(data, orders, controls, strict=True):
                if control is not None:
                    if control >= FLUSH_TIME_MS:
                        out.extend((edge.id, target, order, None, True) for target in range(instances))
                    continue
                try:
                    targets = grouping.targets(record, instances, emitter=emitter, sent=sent)
                except Exception as exc:
                    raise StepFunctionError(f"stream '{edge.stream}' into port '{edge.target_port}': grouping "
                                            f"{grouping.describe()} failed on record {record!r:.300}: "
                                            f"{type(exc).__name__}: {exc}") from exc
                payload = dumps(record)
                for target in targets:
                    sent[target] += 1
                    out.append((edge.id, target, order, payload, False))
            yield _rows_batch(out)
    return ordered.mapInArrow(route, ROWS_DDL)


def _rows_batch(rows: list[tuple[int, int, int, bytes | None, bool]]) -> pa.RecordBatch:
    """Operator rows as one Arrow batch, built column by column."""
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(ROWS)
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, ROWS, strict=True)], schema=ROWS)


def lower_port(node: PortNode, lowering: Compilation) -> DataFrame:
    """The records emitted on an output port, as rows of the port's schema."""
    assert node.schema is not None
    schema = arrow_schema(node.schema)
    names = schema.names
    rows = lowering.frame(node.inputs[0]).filter((F.col(EDGE) == node.edge) & ~F.col(FLUSH))

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pickle

        for batch in batches:
            records = [_as_dict(pickle.loads(p), names, node.name) for p in batch.column(PAYLOAD).to_pylist()]
            try:
                yield pa.RecordBatch.from_pylist(records, schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
                raise StepFunctionError(f"output port '{node.name}': a record does not fit the port's schema "
                                        f"({', '.join(f'{n} {t}' for n, t in node.schema or ())}): {exc}") from None
    return rows.select(PAYLOAD).mapInArrow(decode, to_ddl(node.schema))


def _as_dict(record: Any, names: list[str], port: str) -> dict[str, Any]:
    if isinstance(record, dict):
        return record
    if isinstance(record, (tuple, list)) and len(record) == len(names):
        return dict(zip(names, record, strict=True))
    as_row = getattr(record, "_hr_as_dict", None)  # a Storm tuple (headrace/storm.py)
    if as_row is not None:
        return dict(as_row())
    values = getattr(record, "__dict__", None)
    if values is not None:
        return dict(values)
    raise StepFunctionError(f"output port '{port}' got {record!r:.200}; emit a dict, a dataclass instance or a "
                            f"tuple of {len(names)} values ({', '.join(names)})")
