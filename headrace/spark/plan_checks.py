"""``check_plan``: whether a plan can run as headrace runs it, as one Spark query."""

from __future__ import annotations

from headrace.errors import step_error
from headrace.plan.graph import Plan
from headrace.plan.nodes import LateRecordsNode, Node
from headrace.spark.batch_roots import check_operators
from headrace.spark.real_time_obstacles import check_real_time
from headrace.spark.specs import check_sink_takes_updates, late_records_of_joins, spec_of
from headrace.spark.stages import check_stages


def check_plan(plan: Plan) -> None:
    """The plan's own checks, then those of running it as one Spark query: stateful steps that
    read others' results as Spark can chain them, one output mode, and an operator that runs
    alone shares the query with no other stateful step."""
    plan.validate()
    check_real_time(plan)
    check_operators(plan)
    check_stages(plan)
    for sink in plan.sinks():
        check_sink_takes_updates(plan, sink.name, sink.defined_at, sink.connector, sink.inputs[0])
    stateful = [n for n in plan.nodes.values() if spec_of(n).stateful]
    _check_late_records_of_joins(plan, stateful)
    appending = [n for n in stateful if spec_of(n).output_mode(n) == "append"]
    updating = [n for n in stateful if spec_of(n).output_mode(n) == "update"]
    if appending and updating:
        first, other = appending[0], updating[0]
        raise step_error(first.name, first.defined_at,
                         f"{spec_of(first).appending} cannot share pipeline {plan.name!r} with step {other.name!r} "
                         f"({other.defined_at}), which emits updates: the pipeline runs as one Spark query with "
                         "one output mode; use emit='updates' on windows, or a pipeline for each")
    alone = [n for n in stateful if spec_of(n).runs_alone(n)]
    if alone and len(stateful) > 1:
        step = alone[0]
        other = next(n for n in stateful if n is not step)
        what = "a reduce" if getattr(step, "reduce_fn", None) else "a rolling aggregate with a ttl"
        raise step_error(step.name, step.defined_at,
                         f"{what} cannot share pipeline {plan.name!r} with the stateful step "
                         f"{other.name!r} ({other.defined_at}): Spark runs a pipeline as one query, and its per-key "
                         "Python state cannot run beside another aggregate; give it a pipeline of its own")



def _check_late_records_of_joins(plan: Plan, stateful: list[Node]) -> None:
    """A join's late records come from its raw output in each micro-batch; a stateful step that
    reads the join's results would make the query plan the join a second time, with state of its own."""
    for join in late_records_of_joins(plan):
        later = [n for n in stateful if join.name in plan.upstream(n.name)]
        if later:
            late = next(n for n in plan.consumers(join.name) if isinstance(n, LateRecordsNode))
            raise step_error(late.name, late.defined_at,
                             f"the late records of join {join.name!r} ({join.defined_at}) cannot be taken while the "
                             f"stateful step {later[0].name!r} ({later[0].defined_at}) reads the join's results in "
                             "the same pipeline: Spark would run the join twice; sink the join's results and go on "
                             "from that sink in another pipeline, or take no late records")
