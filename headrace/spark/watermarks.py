"""Where a plan's watermarks are declared in Spark, from the node kinds' specs
(``headrace/spark/specs.py``); the compiler declares them there and ``explain`` says where,
and how far each stateful step's watermark trails the event time (``effective_delay``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from headrace.plan.graph import Plan
from headrace.plan.nodes import JOINED, EventTimeNode, Node, PythonStep, SqlNode, StreamJoinNode
from headrace.spark.specs import python_chains, spec_of, walk

DELAY_KEY = "spark.watermarkDelayMs"  # Spark's EventTimeWatermark.delayKey: the mark on an event-time column


class WatermarkPlacement:
    """Where the plan's watermarks are declared in Spark (read by the compiler and ``explain``).

    Spark refuses a second watermark on one lineage, and a Python stage hides the first from
    what follows it, so a Python step carrying event time (or a new event-time declaration)
    declares the watermark again for what follows it. Each window needs one watermark on every
    path from its event-time declarations: the nearest place above the window from which no
    path meets such a step. A branch that reaches no window gets none: its watermark would
    only hold back the windows' (Spark combines watermarks by their minimum)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.chains = {chain[-1]: chain for chain in python_chains(plan)}

    def _downstream(self, names: Iterable[str], goes_past: Callable[[Node], bool]) -> Iterator[Node]:
        """The nodes records entering the nodes ``names`` meet, each once; past a node only where
        ``goes_past(node)``."""
        todo, seen = list(names), set()
        while todo:
            node = self.plan.nodes[todo.pop()]
            if node.name in seen:
                continue
            seen.add(node.name)
            yield node
            if goes_past(node):
                todo.extend(c.name for c in self.plan.consumers(node.name))

    def _reach(self, names: Iterable[str]) -> tuple[bool, bool]:
        """What records entering the nodes ``names`` meet, until a window: (a window, a step
        that declares the watermark again)."""
        def declares_again(node: Node) -> bool:
            return isinstance(node, EventTimeNode) or (isinstance(node, PythonStep) and node.event_time is not None)

        def stops(node: Node) -> bool:
            return spec_of(node).reads_watermark or declares_again(node)

        met = list(self._downstream(names, lambda node: not stops(node)))
        return (any(spec_of(n).reads_watermark for n in met),
                any(declares_again(n) and not spec_of(n).reads_watermark for n in met))

    def _carries_time(self, name: str) -> bool:
        return self.plan.nodes[name].event_time is not None and self.watermark_delay(name) is not None

    def watermark_here(self, node: Node) -> bool:
        """Whether an event-time declaration or a Python stage declares the watermark on its output:
        when no step after it declares it again and a window follows (or, in a pipeline without
        windows, for the progress reports)."""
        if not self._carries_time(node.name):
            return False
        if not isinstance(node, EventTimeNode) and node.name not in self.chains:
            return False
        window, redeclared = self._reach(c.name for c in self.plan.consumers(node.name))
        has_windows = any(spec_of(n).reads_watermark for n in self.plan.nodes.values())
        return not redeclared and (window or not has_windows)

    def watermark_on_edge(self, name: str, consumer: str) -> bool:
        """Whether the watermark goes between ``name`` and ``consumer``: where the paths from a
        declaration part, towards a window, away from the steps that declare it again."""
        if not self._carries_time(name):
            return False
        if not self._reach(c.name for c in self.plan.consumers(name))[1]:
            return False  # declared on this node or above it, or not needed
        window, redeclared = self._reach([consumer])
        return window and not redeclared

    def watermark_delay(self, name: str) -> int | None:
        """The delay of the nearest event-time declaration upstream of ``name``; None below a
        stateful step, whose results carry Spark's watermark on (``headrace/spark/stages.py``)."""
        node = self.plan.nodes[name]
        while True:
            if isinstance(node, EventTimeNode):
                return node.delay_ms
            if not node.inputs or spec_of(node).stateful:
                return None
            node = self.plan.nodes[node.inputs[0]]

    def filters_before_window(self, names: Iterable[str]) -> bool:
        """Whether records entering the nodes ``names`` can meet, before the step that reads the
        watermark, a filter Catalyst would push below the watermark operator (so the records it
        removes would no longer move the watermark): a native filter, a join with a table (its
        inferred not-null filters), an SQL query (WHERE, joins). Then the watermark needs a
        barrier above it (``headrace/spark/stateless.py``, ``with_watermark``)."""
        met = self._downstream(names, lambda node: not spec_of(node).reads_watermark and not spec_of(node).stateful)
        return any(spec_of(node).pushes_filter(node) for node in met)

    def where_taken(self, node: Node) -> str:
        """For ``explain``: where the watermark of the event-time declaration ``node`` is taken."""
        if self.watermark_here(node):
            after = [c.name for c in self.plan.consumers(node.name)]
            kept = (": the filters after it run above it (a barrier stops Catalyst pushing them below), so every "
                    "record moves it" if self.filters_before_window(after) else "")
            return f"watermark taken here{kept}"
        edges = self._edges_below(node.name)
        if edges:
            return ("watermark taken on the way into " + ", ".join(repr(c) for _, c in edges)
                    + " (a Python step with event time declares it again on the other path)")
        return "no watermark taken here: no window reads it, or a step after it declares it again"

    def _edges_below(self, name: str) -> list[tuple[str, str]]:
        """The edges below step ``name`` on which the watermark is declared (``watermark_on_edge``)."""
        edges, todo, seen = [], [name], set()
        while todo:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            for consumer in self.plan.consumers(current):
                if self.watermark_on_edge(current, consumer.name):
                    edges.append((current, consumer.name))
                elif not spec_of(consumer).reads_watermark and not isinstance(consumer, EventTimeNode):
                    todo.append(consumer.name)
        return edges


def held_back(node: Node) -> int:
    """How far (ms) Spark's watermark after the stateful step ``node`` trails the one before it.
    After an interval join: the state watermark of the side that may wait the longest, Spark's
    ``StreamingJoinHelper`` solving ``lower <= right - left <= upper`` (1 ms less for each bound
    it includes), so ``max(upper, -lower) + 1``. After a window join (judged by the window's end)
    and every other step: nothing."""
    if not isinstance(node, StreamJoinNode) or node.window is not None:
        return 0
    return max(0, node.upper_ms + 1, 1 - node.lower_ms)


def effective_delay(plan: Plan, node: Node) -> tuple[int, int, list[tuple[str, int]]] | None:
    """How far the watermark of the stateful step ``node`` trails the largest event time seen:
    (ms, the max out-of-orderness declared, the steps before it that hold it back and by how
    much); None when its input has no event time. Over several inputs, the largest."""
    def onwards(current: Node) -> Iterable[str]:
        return () if isinstance(current, EventTimeNode) or spec_of(current).stateful else current.inputs

    found: list[tuple[int, int, list[tuple[str, int]]]] = []
    for upstream in walk(plan, node.inputs, onwards):
        if isinstance(upstream, EventTimeNode):
            found.append((upstream.delay_ms, upstream.delay_ms, []))
        elif spec_of(upstream).stateful and upstream.event_time is not None:
            earlier = effective_delay(plan, upstream)
            held = held_back(upstream)
            if earlier is not None:
                found.append((earlier[0] + held, earlier[1], earlier[2] + ([(upstream.name, held)] if held else [])))
    return max(found, key=lambda delay: delay[0]) if found else None


def spell_millis(ms: int) -> str:
    """``3_602_001`` as ``1h 2s 1ms``."""
    parts, rest = [], ms
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return " ".join(parts) or "0s"


def describe_delay(plan: Plan, node: Node) -> str:
    """For ``explain``: how far the stateful step ``node``'s watermark trails the event time, and why."""
    delay = effective_delay(plan, node)
    if delay is None:
        return "none (the stream has no event time)"
    total, declared, held = delay
    text = f"{spell_millis(total)} behind the largest event time seen: max out-of-orderness {spell_millis(declared)}"
    for step, ms in held:
        text += f", + {spell_millis(ms)} held back by join {step!r}"
    if held:
        text += " (after an interval join Spark's watermark trails by the interval's wider bound + 1 ms)"
    if isinstance(node, SqlNode) and node.shape == JOINED:
        text += "; an aggregate after the query's interval join waits the interval's wider bound + 1 ms more"
    return text
