"""Which clock a stateful step reads, decided from the plan alone (no Spark needed): processing
time is the micro-batch's timestamp, or the test kit's clock when a source says so
(``TestSource``); Spark's own state TTL runs only on the former."""

from __future__ import annotations

from typing import Any

from headrace.plan.graph import Plan
from headrace.plan.nodes import KeyedProcessNode
from headrace.process import declared_state


def uses_test_clock(plan: Any) -> bool:
    """Processing time comes from the test kit's clock when a source says so (TestSource)."""
    return any(getattr(source.connector, "test_clock", False) for source in plan.sources())


def spark_ttl(plan: Plan, node: KeyedProcessNode) -> int | None:
    """Spark's TTL for a key's state: the longest declared TTL when every state has one. None
    under the test clock (headrace's own TTL on that clock is the only one) and with event
    time (Spark's TTL needs its processing-time mode, which has no event-time timers): then a
    quiet key's expired state goes when the key next runs."""
    ttls = [state.ttl_ms for state in declared_state(type(node.fn)).values()]
    if uses_test_clock(plan) or plan.nodes[node.inputs[0]].event_time or not ttls or None in ttls:
        return None
    return max(t for t in ttls if t is not None)
