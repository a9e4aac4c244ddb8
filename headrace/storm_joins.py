"""Storm's ``JoinBolt``: a join of the streams of several components in tumbling event-time
windows, declared as Storm declares it, run on Spark's own stream-stream join (a window join,
docs/joins.md) rather than on the operator runtime::

    joiner = (hr.JoinBolt("bids", "auction")                 # the first stream and its key
              .join("auctions", "id", "bids")                # auctions.id = bids.auction
              .select("bids:auction, bids:price, auctions:seller")
              .with_timestamp_field("ts", lag="2s")          # each stream's event time
              .with_tumbling_window("10s"))
    builder.set_bolt("joiner", joiner).fields_grouping("bids", "auction").fields_grouping("auctions", "id")

Its output fields are the selected fields' names (``auction, price, seller``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrace.code_locations import user_location
from headrace.errors import PlanError


@dataclass(frozen=True)
class JoinSpec:
    """One ``join``/``left_join``: ``stream`` (a component id) whose ``key`` equals the key of the
    earlier stream ``prior``."""

    how: str
    stream: str
    key: str
    prior: str


class JoinBolt:
    """Storm's JoinBolt (``org.apache.storm.bolt.JoinBolt``), in Python's spelling: ``join``,
    ``left_join``, ``select``, ``with_timestamp_field``, ``with_tumbling_window``."""

    def __init__(self, source: str, key: str) -> None:
        self.where = user_location()
        self.source, self.key = source, key
        self.joins: list[JoinSpec] = []
        self.selected: list[tuple[str, str]] = []  # (component, field)
        self.timestamp_field: str | None = None
        self.lag: object = 0
        self.window: object = None

    def _fail(self, message: str) -> PlanError:
        return PlanError(f"JoinBolt({self.source!r}, {self.key!r}) ({self.where}): {message}")

    def _join(self, how: str, stream: str, key: str, prior: str) -> JoinBolt:
        if self.joins:
            raise self._fail("joins two streams; join the result with a third in another JoinBolt that reads it")
        if prior != self.source:
            raise self._fail(f"{stream!r} joins {prior!r}, which is not the bolt's first stream {self.source!r}")
        self.joins.append(JoinSpec(how, stream, key, prior))
        return self

    def join(self, stream: str, key: str, prior: str) -> JoinBolt:
        """An inner join of ``stream`` on its field ``key`` with the stream ``prior``'s key."""
        return self._join("inner", stream, key, prior)

    def left_join(self, stream: str, key: str, prior: str) -> JoinBolt:
        """A left join: every tuple of ``prior``, with or without a match in ``stream``."""
        return self._join("left", stream, key, prior)

    def select(self, fields: str) -> JoinBolt:
        """The output fields: ``"component:field, ..."`` (Storm's comma-separated list)."""
        chosen = []
        for item in (part.strip() for part in str(fields).split(",")):
            component, colon, field = item.partition(":")
            if not colon or not component or not field:
                raise self._fail(f"select names each field as component:field, got {item!r}")
            chosen.append((component.strip(), field.strip()))
        names = [f for _, f in chosen]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise self._fail(f"select gives two fields the name {twice[0]!r}; an output field is named after its "
                             "field, so select one of them")
        self.selected = chosen
        return self

    def with_timestamp_field(self, field: str, *, lag: object = 0) -> JoinBolt:
        """Each stream's event-time field, and how far out of order its tuples may come (Storm's
        ``withTimestampField`` and ``withLag``)."""
        self.timestamp_field, self.lag = field, lag
        return self

    def with_tumbling_window(self, length: object) -> JoinBolt:
        """Join the tuples that fall in the same tumbling window of ``length`` (a duration)."""
        self.window = length
        return self

    def check(self) -> None:
        """What ``set_bolt`` checks before building the join."""
        if not self.joins:
            raise self._fail("joins nothing: call join(stream, key, prior) or left_join(...)")
        if not self.selected:
            raise self._fail("selects no field: call select('component:field, ...')")
        if self.window is None:
            raise self._fail("has no window: call with_tumbling_window(length); a join of streams needs a bound in "
                             "event time (sliding and count windows are not offered: in them a pair of tuples "
                             "would meet in several windows)")
        streams = {self.source, self.joins[0].stream}
        unknown = [c for c, _ in self.selected if c not in streams]
        if unknown:
            raise self._fail(f"select names {unknown[0]!r}, which the bolt does not join; it joins "
                             f"{', '.join(sorted(streams))}")

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "key": self.key, "joins": [vars(j) for j in self.joins],
                "select": [f"{c}:{f}" for c, f in self.selected], "window": str(self.window)}
