"""Whether a changed pipeline may continue from the checkpoint an earlier version of it left.

Names are state identity. A checkpoint holds, per source, the offsets it read and, per
stateful step, the state it built; beside it, ``plan.json`` holds the plan of the run that
last started from it. Before Spark starts (for a state dir on HDFS or S3, which is read
through Spark's JVM: once the session runs, before the query starts), a restart compares
that stored plan with the new one (:func:`compare`, a pure function over two plan records):

* **Allowed, state kept**: stateless steps may change, appear or go (filters, maps,
  selects, joins with tables, the watermark delay); a stateful step's own code may change
  (the body of its reduce, aggregate or process function); sinks may be added (a new sink
  commits under a fresh identity, so it gets the output of the batches run after the
  restart, not what was emitted before), removed or reconfigured; a source's settings may
  change where they do not change what an offset means (a generator's ``rows_per_batch``,
  ``limit`` or ``partitions``).
* **Refused**: a stateful step (window, rolling aggregate or reduce, process step, operator)
  removed or renamed, or (but for an operator, whose state starts from its constructor) added;
  an operator of another class or with other partitions (each instance owns its state);
  re-keyed (other key fields, or key types); another window shape, event time field,
  emission (``emit``, trigger, allowed lateness, accumulation), window function kind,
  aggregates, late side output (it moves a window from Spark's native operator to a
  stateful processor), the stateful steps whose results it reads (Spark numbers its
  state operators in the order they meet, so a reordered chain would read another's state),
  or layout of what the state keeps (the output fields of
  aggregates and reduces, the input records of reduce and process windows, a process
  step's declared state); a source removed, renamed or added, of another type, with
  another :meth:`~headrace.connectors.base.SourceConnector.offset_identity`, or switched
  between bounded and unbounded, either way (a bounded run ends by firing every window at
  the end of time, so an unbounded continuation would find every record late; an unbounded
  checkpoint's offsets carry no end of input); a sink whose connector is unchanged but
  whose batches would be committed by another writer (Spark's own file writer when it is
  the only sink, per-batch commits when there are several).
* **SQL steps** count as stateful steps when their query aggregates (a windowed
  aggregate or an aggregate); their query may change like a function's code (Spark checks
  the state's layout), its shape may not.

A plan record (:func:`plan_record`) is ``Plan.to_json()`` plus, per source, its offset
identity and whether it is bounded, and per sink, the writer that commits its batches.
Keys a node's JSON may carry but that are not state identity (``defined_at``, function
labels, ``parallelism``) are ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from headrace.environment.checkpoints import has_batches, read_plan, write_plan
from headrace.errors import IncompatibleCheckpoint
from headrace.plan.graph import Plan
from headrace.plan.nodes import LateRecordsNode, SinkNode, SourceNode, WindowAggregateNode
from headrace.spark.specs import native_sink_format, spec_of, spec_of_json, window_needs_processor
from headrace.spark.stages import earlier_stateful
from headrace.spark.state_changes import Change, StateDiff, differences

RECORD_FORMAT = 1
ROLES = ("source", "stateful step", "sink", "step")
WHAT_TO_DO = ("To go ahead, undo the change to continue from the checkpoint, run with --fresh (fresh=True in "
              "Python) to delete the checkpoint and start over from the beginning of the input, or give the "
              "pipeline a new name to start it afresh beside the old checkpoint.")


# -- the record stored beside the checkpoint -------------------------------------------------------

def plan_record(plan: Plan) -> dict[str, Any]:
    """``plan.to_json()`` with what a restart is checked against, as plain JSON values."""
    record = plan.to_json()
    record["record_format"] = RECORD_FORMAT
    for node_json in record["nodes"]:
        node = plan.nodes[node_json["name"]]
        if isinstance(node, SourceNode):
            node_json["offset_identity"] = node.connector.offset_identity()
            node_json["bounded"] = node.connector.bounded
        elif isinstance(node, WindowAggregateNode):
            node_json["operator"] = ("stateful processor" if window_needs_processor(plan, node)
                                     else "Spark's window operator")
        if spec_of(node).stateful:  # Spark numbers its state operators in the order they meet
            node_json["after"] = sorted(n.name for i in node.inputs for n in earlier_stateful(plan, i))
        if isinstance(node, SinkNode):
            # "noop" writes nothing, so it has no commits to continue
            native = native_sink_format(plan, node)
            writer = f"Spark's {native} writer" if native else "per-batch commits"
            node_json["writer"] = None if native == "noop" else writer
    plain: dict[str, Any] = json.loads(json.dumps(record, default=str))
    return plain


# -- the verdict -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepVerdict:
    """What a restart does with one step: ``status`` is kept, changed, new or removed."""

    name: str
    role: str  # source, stateful step, sink or step (stateless)
    kind: str  # e.g. window, Generator, TestSink, filter
    status: str
    refused: bool = False
    changes: tuple[Change, ...] = ()
    why: str = ""  # why it is refused, or a note on an allowed change
    defined_at: str = ""
    in_message: bool = True  # False for the new half of a rename: the removed half tells it

    def describe(self) -> str:
        """One clause for the refusal message."""
        what = f"{self.role} {self.name!r} ({self.kind}{', ' + self.defined_at if self.defined_at else ''})"
        if self.status in ("new", "removed"):
            return f"{what} is {'gone' if self.status == 'removed' else 'new'}: {self.why}"
        return f"{what} changed {', '.join(map(str, self.changes))}: {self.why}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "kind": self.kind, "status": self.status,
                "refused": self.refused, "defined_at": self.defined_at,
                "changes": [{"what": c.what, "old": c.old, "new": c.new} for c in self.changes],
                "note": self.why or None}


@dataclass(frozen=True)
class Compatibility:
    """The verdict on restarting ``pipeline`` from its checkpoint, step by step."""

    pipeline: str
    steps: tuple[StepVerdict, ...]
    checkpoint: str = ""
    problems: tuple[str, ...] = ()  # refusals not tied to a step

    @property
    def refused(self) -> tuple[StepVerdict, ...]:
        return tuple(step for step in self.steps if step.refused)

    @property
    def allowed(self) -> bool:
        return not self.refused and not self.problems

    def message(self) -> str:
        """One paragraph: each refused step, what changed, and what to do."""
        where = f" in {self.checkpoint}" if self.checkpoint else ""
        reasons = "; ".join([*self.problems, *(step.describe() for step in self.refused if step.in_message)])
        return f"pipeline {self.pipeline!r} cannot restart from its checkpoint{where}: {reasons}. {WHAT_TO_DO}"

    def to_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "checkpoint": self.checkpoint,
                "restart": "allowed" if self.allowed else "refused",
                "steps": [step.to_json() for step in self.steps],
                "message": None if self.allowed else self.message()}

    def lines(self) -> list[str]:
        """For ``headrace explain --against-checkpoint``: one line per source, stateful step and
        sink, and per stateless step that changed, then the verdict."""
        shown = [s for s in self.steps if s.role != "step" or s.status != "kept"]
        labels = [f"{s.role} {s.name!r} ({s.kind})" for s in shown]
        width = max(map(len, labels), default=0)
        out = [f"restart of pipeline {self.pipeline!r} from {self.checkpoint or 'its checkpoint'}:"]
        for label, step in zip(labels, shown, strict=True):
            status = ("refused, " if step.refused else "") + step.status
            detail = ", ".join(map(str, step.changes))
            if step.why and (step.refused or step.status != "changed"):
                detail = f"{detail}: {step.why}" if detail else step.why
            out.append(f"  {label.ljust(width)}  {status}{': ' + detail if detail else ''}")
        for problem in self.problems:
            out.append(f"  {problem}")
        if self.allowed:
            out.append("the restart keeps the offsets of every source and the state of every stateful step")
        else:
            out.append(f"the restart would be refused: {self.message()}")
        return out


# -- the rules -------------------------------------------------------------------------------------

def compare(stored: dict[str, Any], new: dict[str, Any]) -> Compatibility:
    """The verdict on continuing, with the plan record ``new``, a checkpoint written under
    the plan record ``stored``."""
    problems: tuple[str, ...] = ()
    if int(stored.get("record_format", 1)) > RECORD_FORMAT:
        problems = (f"the stored plan has record format {stored['record_format']}, newer than this headrace "
                    f"reads ({RECORD_FORMAT}); run it with the headrace that wrote it",)
    old_plan, new_plan = _Nodes(stored), _Nodes(new)
    steps: list[StepVerdict] = []
    for role in ROLES:
        before, after = old_plan.of_role(role), new_plan.of_role(role)
        verdicts = {name: _compare_step(role, before[name], after[name], old_plan, new_plan)
                    for name in after if name in before}
        gone = [_gone(role, before[name]) for name in before if name not in after]
        added = [_added(role, after[name]) for name in after if name not in before]
        gone, added = _pair_renames(role, gone, added)
        steps += [verdicts.get(name) or next(a for a in added if a.name == name) for name in after]
        steps += gone
    return Compatibility(str(new.get("pipeline", stored.get("pipeline", "?"))), tuple(steps), problems=problems)


class _Nodes:
    """A plan record's nodes by name, with the lookups the rules need."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.nodes: dict[str, dict[str, Any]] = {n["name"]: n for n in record.get("nodes", [])}

    def of_role(self, role: str) -> dict[str, dict[str, Any]]:
        return {name: node for name, node in self.nodes.items() if _role(node) == role}

    def input_of(self, node: dict[str, Any]) -> dict[str, Any]:
        inputs = node.get("inputs") or []
        return self.nodes.get(inputs[0], {}) if inputs else {}

    def late_outputs(self, name: str) -> list[str]:
        return [n["name"] for n in self.nodes.values()
                if n.get("kind") == LateRecordsNode.kind and name in (n.get("inputs") or [])]


def _role(node: dict[str, Any]) -> str:
    return spec_of_json(node).role


def _verdict(role: str, node: dict[str, Any], status: str, **rest: Any) -> StepVerdict:
    return StepVerdict(node["name"], role, spec_of_json(node).restart_label(node), status,
                       defined_at=str(node.get("defined_at", "")), **rest)


def _compare_step(role: str, old: dict[str, Any], new: dict[str, Any], old_plan: _Nodes,
                  new_plan: _Nodes) -> StepVerdict:
    if role == "source":
        return _compare_source(old, new)
    if role == "stateful step":
        return _compare_stateful(old, new, old_plan, new_plan)
    if role == "sink":
        return _compare_sink(old, new)
    changes = differences(old, new, ignore=("defined_at", "name"))
    return _verdict(role, new, "changed" if changes else "kept", changes=changes)


def _gone(role: str, node: dict[str, Any]) -> StepVerdict:
    why = {
        "source": "the checkpoint's offset log has an entry for each source, and Spark cannot restart the query "
                  "without it",
        "stateful step": "its saved state would be lost, and Spark cannot restart a query without a stateful step "
                         "it had",
    }.get(role, "")
    why = spec_of_json(node).state_lost or why
    return _verdict(role, node, "removed", refused=role in ("source", "stateful step"), why=why)


def _added(role: str, node: dict[str, Any]) -> StepVerdict:
    why = {
        "source": "Spark cannot add a source to a query that has already run",
        "stateful step": "Spark cannot add a stateful step to a query that has already run (it would find no state "
                         "for it)",
        "sink": "it commits under a fresh identity, so it gets the output of the batches run after the restart, "
                "not what was emitted before",
    }.get(role, "")
    fresh = spec_of_json(node).starts_fresh
    if fresh:
        return _verdict(role, node, "new", why=fresh)
    return _verdict(role, node, "new", refused=role in ("source", "stateful step"), why=why)


def _pair_renames(role: str, gone: list[StepVerdict], added: list[StepVerdict]
                  ) -> tuple[list[StepVerdict], list[StepVerdict]]:
    """One source or stateful step gone and one of the same kind new: most likely a rename."""
    if role not in ("source", "stateful step") or len(gone) != 1 or len(added) != 1:
        return gone, added
    old, new = gone[0], added[0]
    if old.kind != new.kind:
        return gone, added
    what = "offsets in the checkpoint, so a rename would lose them" if role == "source" else \
        "saved state, so a rename would lose it"
    old = replace(old, why=f"{role} {new.name!r} took its place, but a {role}'s name is the identity of its "
                           f"{what}; keep the name {old.name!r}")
    new = replace(new, why=f"in place of {role} {old.name!r}", in_message=False)
    return [old], [new]


# Sources.

def _compare_source(old: dict[str, Any], new: dict[str, Any]) -> StepVerdict:
    old_connector, new_connector = old.get("connector") or {}, new.get("connector") or {}
    refused: list[Change] = []
    reasons: list[str] = []
    if old_connector.get("type") != new_connector.get("type"):
        refused.append(Change("type", str(old_connector.get("type")), str(new_connector.get("type"))))
    else:
        identity = differences(old.get("offset_identity") or {}, new.get("offset_identity") or {})
        refused += identity
    if refused:
        reasons.append("the offsets in the checkpoint would point at other records")
    old_bounded, new_bounded = old.get("bounded"), new.get("bounded")
    if old_bounded is not None and new_bounded is not None and bool(old_bounded) != bool(new_bounded):
        refused.append(Change("input", _bounded(old_bounded), _bounded(new_bounded)))
        reasons.append("a bounded run and an unbounded one cannot share a checkpoint (a bounded run ends by "
                       "firing every window at the end of time, after which every new record would be late)")
    if refused:
        return _verdict("source", new, "changed", refused=True, changes=tuple(refused), why="; ".join(reasons))
    allowed = differences(old_connector, new_connector, ignore=("guarantee", "bounded"))
    return _verdict("source", new, "changed" if allowed else "kept", changes=allowed,
                    why="the offsets keep their meaning" if allowed else "")


def _bounded(value: Any) -> str:
    return "bounded" if value else "unbounded"


# Stateful steps.

def _compare_stateful(old: dict[str, Any], new: dict[str, Any], old_plan: _Nodes, new_plan: _Nodes) -> StepVerdict:
    old_input, new_input = old_plan.input_of(old), new_plan.input_of(new)
    diff = StateDiff(old, new, old_input, new_input, old_plan.late_outputs(old["name"]),
                     new_plan.late_outputs(new["name"]))
    diff.check("kind", spec_of_json(old).restart_label(old), spec_of_json(new).restart_label(new))
    diff.check_key("key fields", "keys", _names)
    if old.get("keys") == new.get("keys"):
        old_types, new_types = _types(old_input), _types(new_input)
        for key in old.get("keys") or []:
            if key in old_types and key in new_types:
                diff.check(f"type of key field {key!r}", old_types[key], new_types[key])
    # earlier versions refused a stateful step after another, so a record without it has none
    diff.check_key("stateful steps it reads the results of", "after", lambda after: _names(after or []))
    compare_state = spec_of_json(new).compare_state
    if new.get("kind") == old.get("kind") and compare_state is not None:
        compare_state(diff)
    if diff.refused:
        return _verdict("stateful step", new, "changed", refused=True, changes=tuple(diff.refused),
                        why="its saved state was built for the old settings")
    return _verdict("stateful step", new, "changed" if diff.allowed else "kept", changes=tuple(diff.allowed),
                    why="its code changed; the state it saved must still suit it" if diff.allowed else "")


# Sinks.

def _compare_sink(old: dict[str, Any], new: dict[str, Any]) -> StepVerdict:
    changes = differences(old.get("connector") or {}, new.get("connector") or {}, ignore=("guarantee",))
    old_writer, new_writer = old.get("writer"), new.get("writer")
    if not changes and old_writer and new_writer and old_writer != new_writer:
        return _verdict("sink", new, "changed", refused=True, changes=(Change("writer", old_writer, new_writer),),
                        why="the batches it committed one way cannot be continued the other way (Spark's writer "
                            "is used only for a pipeline's only sink); keep the sinks as they were, or point this "
                            "sink somewhere new")
    return _verdict("sink", new, "changed" if changes else "kept", changes=changes)


# -- rendering -------------------------------------------------------------------------------------

def _names(values: Any) -> str:
    return ", ".join(map(str, values)) if values else "none"


def _types(node: dict[str, Any]) -> dict[str, str]:
    return {str(pair[0]): str(pair[1]) for pair in node.get("schema") or []}


# -- the runtime's entry points --------------------------------------------------------------------

def check_restart(plan: Plan, root: str) -> Compatibility | None:
    """The verdict on restarting ``plan`` from the checkpoint under ``root``; None when there is
    nothing to continue (no batch ran yet) or nothing to compare with (no stored plan: a
    checkpoint written before plans were stored)."""
    checkpoint = f"{root}/checkpoint"
    stored = read_plan(root)
    if stored is None or not has_batches(checkpoint):
        return None
    return replace(compare(stored, plan_record(plan)), checkpoint=checkpoint)


def verify_restart(plan: Plan, root: str) -> None:
    """Raise :class:`IncompatibleCheckpoint` when ``plan`` cannot continue the checkpoint under ``root``."""
    verdict = check_restart(plan, root)
    if verdict is not None and not verdict.allowed:
        raise IncompatibleCheckpoint(verdict.message())


def record_plan(plan: Plan, root: str, interval: str | None = None) -> None:
    """Store ``plan`` beside its checkpoint: the plan the next restart is checked against, with the
    trigger interval its query runs at (None: as fast as it can; not compared at a restart)."""
    write_plan(root, {**plan_record(plan), "trigger_interval": interval})
