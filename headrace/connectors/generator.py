"""A deterministic generator of synthetic events: YSB ad events, lines of words, clicks.

Every field of event ``i`` is a pure function of ``(seed, i)`` (and of the start
time and rate that fix its event time), computed with numpy and pyarrow over
whole ranges of ``i`` at once, so any range of offsets can be generated again,
bit for bit, on replay: the source is exactly-once.

Offsets count the events produced: ``{"offset": n, "start_ms": s}``, plus
``"flushed": true`` once a bounded generator has produced its ``limit`` events
and its final flush control row. ``start_ms`` (the event time of event 0) is
fixed when the query first starts and carried in every offset, so a query
restarted from its checkpoint regenerates the same records.

Event time of event ``i``::

    rate set:   start_ms + i * 1000 / rate        (ms)
    rate None:  start_ms + i / 100                (ms; a nominal 100 000 events/s)

With a rate, the latest offset is ``min(limit, floor((now - start_ms) * rate / 1000))``,
so the source never runs ahead of the wall clock; each micro-batch is capped at
``rows_per_batch`` events in both modes, so a pipeline that fell behind catches
up in bounded steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.contract import CONTROL_COLUMN, Guarantee, SourceConnector
from headrace.errors import PlanError
from headrace.schema import Schema, arrow_schema, arrow_type

YSB_SCHEMA: Schema = (
    ("user_id", "string"),
    ("page_id", "string"),
    ("ad_id", "string"),
    ("ad_type", "string"),
    ("event_type", "string"),
    ("event_time", "timestamp"),
    ("ip_address", "string"),
)
WORDS_SCHEMA: Schema = (("line", "string"), ("event_time", "timestamp"))
CLICKS_SCHEMA: Schema = (("user_id", "string"), ("url", "string"), ("event_time", "timestamp"))
YSB_ADS_SCHEMA: Schema = (("ad_id", "string"), ("campaign_id", "string"))

SCHEMAS: dict[str, Schema] = {"ysb": YSB_SCHEMA, "words": WORDS_SCHEMA, "clicks": CLICKS_SCHEMA}

DEFAULT_START_MS = 1_700_000_000_000
NOMINAL_RATE = 100_000  # events/s of event time when no rate is set
DEFAULT_ROWS_PER_BATCH = 1_000_000
CHUNK_ROWS = 65_536  # rows per Arrow record batch handed to Spark

YSB_ADS = 1000
YSB_AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
YSB_EVENT_TYPES = ("view", "click", "purchase")
YSB_USERS = 100_000
YSB_PAGES = 100_000

VOCABULARY = (
    "the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "stream", "window",
    "event", "time", "water", "river", "mill", "race", "flow", "spark", "python", "batch",
    "state", "key", "value", "watermark", "late", "early", "fire", "pane", "session", "count",
    "sum", "join", "union", "branch", "sink", "source", "record", "offset", "commit", "replay",
    "apex", "storm", "heron", "flink", "samza", "beam", "kafka", "redis", "nats", "socket",
)

CLICK_USERS = 200
CLICK_URLS = 100
# A clicks user is active for CLICK_BURST_MS out of every CLICK_PERIOD_MS of event time;
# users' phases are staggered, so a burst is followed by an idle gap of at least
# CLICK_PERIOD_MS - CLICK_BURST_MS = 48 s (longer than a 30 s session gap).
CLICK_PERIOD_MS = 60_000
CLICK_BURST_MS = 12_000
_CLICK_CHOICES = CLICK_USERS * CLICK_BURST_MS // CLICK_PERIOD_MS - 1  # active users to pick from

_TS = arrow_type("timestamp")
_U64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


# ----------------------------------------------------------------------------------------
# Hashing: splitmix64, vectorised.

def _mix_int(z: int) -> int:
    z &= _U64
    z = ((z ^ (z >> 30)) * _M1) & _U64
    z = ((z ^ (z >> 27)) * _M2) & _U64
    return z ^ (z >> 31)


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_M1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_M2)
    return z ^ (z >> np.uint64(31))


def _hash(seed: int, salt: int, index: np.ndarray) -> np.ndarray:
    """64 well-mixed bits for each index, a pure function of (seed, salt, index)."""
    key = np.uint64(_mix_int(_mix_int(seed & _U64) + salt * _GOLDEN))
    return _mix(index.astype(np.uint64) * np.uint64(_GOLDEN) + key)


def _bits(h: np.ndarray, shift: int, width: int) -> np.ndarray:
    return ((h >> np.uint64(shift)) & np.uint64((1 << width) - 1)).astype(np.int64)


# ----------------------------------------------------------------------------------------
# String pools (built once per process and seed; rows pick from them with `take`).

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _fixed_width_strings(chars: np.ndarray) -> pa.Array:
    """A string array from an (n, width) uint8 matrix of ASCII characters."""
    n, width = chars.shape
    offsets = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    data = np.ascontiguousarray(chars).tobytes()
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data))


def _uuids(seed: int, salt: int, count: int) -> pa.Array:
    index = np.arange(count, dtype=np.uint64)
    hi, lo = _hash(seed, salt, index), _hash(seed, salt + 1, index)
    shifts = np.arange(15, -1, -1, dtype=np.uint64) * np.uint64(4)
    digits = np.concatenate(
        [_HEX[((hi[:, None] >> shifts) & np.uint64(15)).astype(np.intp)],
         _HEX[((lo[:, None] >> shifts) & np.uint64(15)).astype(np.intp)]], axis=1)
    chars = np.full((count, 36), ord("-"), dtype=np.uint8)
    for src, dst, width in ((0, 0, 8), (8, 9, 4), (12, 14, 4), (16, 19, 4), (20, 24, 12)):
        chars[:, dst:dst + width] = digits[:, src:src + width]
    return _fixed_width_strings(chars)


@lru_cache(maxsize=8)
def _ysb_pools(seed: int) -> dict[str, pa.Array]:
    ip = _hash(seed, 40, np.arange(1 << 16, dtype=np.uint64))
    octets = [pc.cast(pa.array(_bits(ip, shift, 8)), pa.string()) for shift in (0, 8, 16, 24)]
    return {
        "user": _uuids(seed, 10, YSB_USERS),
        "page": _uuids(seed, 20, YSB_PAGES),
        "ad": pa.array([f"ad-{k:04d}" for k in range(YSB_ADS)]),
        "ad_type": pa.array(YSB_AD_TYPES),
        "event_type": pa.array(YSB_EVENT_TYPES),
        "ip": pc.binary_join_element_wise(*octets, "."),
    }


_VOCABULARY = pa.array(VOCABULARY)
_CLICK_USER_IDS = pa.array([f"user-{k:03d}" for k in range(CLICK_USERS)])
_CLICK_URLS = pa.array([f"https://shop.example/item/{k:03d}" for k in range(CLICK_URLS)])


# ----------------------------------------------------------------------------------------
# Event generation.

def event_times_us(start: int, end: int, start_ms: int, rate: float | None) -> np.ndarray:
    """Event times (epoch microseconds) of events [start, end)."""
    index = np.arange(start, end, dtype=np.int64)
    if rate is None:
        return start_ms * 1000 + index * (1_000_000 // NOMINAL_RATE)
    if float(rate).is_integer() and 1_000_000 % int(rate) == 0:
        return start_ms * 1000 + index * (1_000_000 // int(rate))
    return start_ms * 1000 + np.floor(index * (1_000_000.0 / rate)).astype(np.int64)


def _ysb_columns(seed: int, index: np.ndarray, times: np.ndarray) -> list[pa.Array]:
    pools = _ysb_pools(seed)
    h1, h2 = _hash(seed, 1, index), _hash(seed, 2, index)
    return [
        pools["user"].take(_bits(h1, 0, 24) % YSB_USERS),
        pools["page"].take(_bits(h1, 24, 24) % YSB_PAGES),
        pools["ad"].take(_bits(h2, 0, 20) % YSB_ADS),
        pools["ad_type"].take(_bits(h2, 20, 16) % len(YSB_AD_TYPES)),
        pools["event_type"].take(_bits(h2, 36, 16) % len(YSB_EVENT_TYPES)),
        pa.array(times, type=_TS),
        pools["ip"].take(_bits(h1, 48, 16)),
    ]


def _words_columns(seed: int, index: np.ndarray, times: np.ndarray) -> list[pa.Array]:
    h1, h2 = _hash(seed, 3, index), _hash(seed, 4, index)
    count = 3 + _bits(h1, 0, 16) % 6  # 3..8 words
    words = [
        _VOCABULARY.take(pa.array(_bits(h2, 6 * k, 6) % len(VOCABULARY), mask=count <= k))
        for k in range(8)
    ]
    return [pc.binary_join_element_wise(*words, " ", null_handling="skip"), pa.array(times, type=_TS)]


def _clicks_columns(seed: int, index: np.ndarray, times: np.ndarray) -> list[pa.Array]:
    # User u is active while (t + u * period / users) mod period < burst: at time t the
    # active users form a cyclic run starting at `first`; pick one of them by hash.
    h = _hash(seed, 5, index)
    t_ms = times // 1000
    phase_start = (CLICK_PERIOD_MS - t_ms % CLICK_PERIOD_MS) % CLICK_PERIOD_MS
    first = (phase_start * CLICK_USERS + CLICK_PERIOD_MS - 1) // CLICK_PERIOD_MS
    user = (first + _bits(h, 0, 24) % _CLICK_CHOICES) % CLICK_USERS
    url = _bits(h, 24, 24) % CLICK_URLS
    return [_CLICK_USER_IDS.take(user), _CLICK_URLS.take(url), pa.array(times, type=_TS)]


_COLUMNS = {"ysb": _ysb_columns, "words": _words_columns, "clicks": _clicks_columns}


def batch_schema(kind: str) -> pa.Schema:
    """The Arrow schema of the generator's rows (data columns and the control column)."""
    return arrow_schema(SCHEMAS[kind]).append(pa.field(CONTROL_COLUMN, pa.int64()))


def generate(kind: str, start: int, end: int, *, seed: int = 0, start_ms: int = DEFAULT_START_MS,
             rate: float | None = None) -> pa.RecordBatch:
    """Events [start, end) of a generator as one record batch (the control column null).

    The same arguments always give the same rows:

    >>> generate("words", 5, 8, seed=1).equals(generate("words", 0, 8, seed=1).slice(5))
    True
    >>> generate("clicks", 0, 2, rate=4).column("event_time").to_pylist()[1].isoformat()
    '2023-11-14T22:13:20.250000+00:00'
    """
    index = np.arange(start, end, dtype=np.int64)
    times = event_times_us(start, end, start_ms, rate)
    columns = _COLUMNS[kind](seed, index, times)
    return pa.RecordBatch.from_arrays([*columns, pa.nulls(end - start, pa.int64())],
                                      schema=batch_schema(kind))


def ysb_ads(num_campaigns: int = 100, ads_per_campaign: int = 10) -> list[dict[str, str]]:
    """The YSB ad → campaign table: ``ad-0000``... mapped to ``campaign-00``...

    The defaults cover the 1000 ads the ``ysb`` generator emits; ad ``k`` belongs to
    campaign ``k // ads_per_campaign``.

    >>> ads = ysb_ads()
    >>> len(ads), ads[0], ads[-1]["campaign_id"]
    (1000, {'ad_id': 'ad-0000', 'campaign_id': 'campaign-00'}, 'campaign-99')
    """
    if num_campaigns < 1 or ads_per_campaign < 1:
        raise PlanError("ysb_ads: num_campaigns and ads_per_campaign must be at least 1")
    ad_width = max(4, len(str(num_campaigns * ads_per_campaign - 1)))
    campaign_width = max(2, len(str(num_campaigns - 1)))
    return [
        {"ad_id": f"ad-{ad:0{ad_width}d}", "campaign_id": f"campaign-{ad // ads_per_campaign:0{campaign_width}d}"}
        for ad in range(num_campaigns * ads_per_campaign)
    ]


@dataclass(frozen=True)
class Generator(SourceConnector):
    """Synthetic events: ``kind`` is "ysb" (Yahoo Streaming Benchmark ad events),
    "words" (lines of 3-8 words) or "clicks" (bursty clickstream of 200 users).

    ``rate`` events per second of wall clock (None: as fast as the pipeline goes,
    at most ``rows_per_batch`` per micro-batch); ``limit`` total events (None:
    unbounded; set: bounded, ends with a flush row); ``partitions`` Spark tasks per
    micro-batch; ``seed`` picks the event sequence; ``start_ms`` the event time of
    event 0 (default: the wall clock when the query first starts if ``rate`` is
    set, else 1 700 000 000 000). Exactly-once: offsets replay exactly.
    """

    kind: str = "ysb"
    rate: float | None = None
    limit: int | None = None
    rows_per_batch: int = DEFAULT_ROWS_PER_BATCH
    partitions: int = 2
    seed: int = 0
    start_ms: int | None = None

    guarantee = Guarantee.EXACTLY_ONCE
    emits_dead_letters = False
    spark_data_source = "headrace.connectors.spark_readers.generator:GeneratorDataSource"

    def __post_init__(self) -> None:
        if self.kind not in SCHEMAS:
            raise PlanError(f"Generator: unknown kind {self.kind!r}; use one of {', '.join(SCHEMAS)}")
        if self.rate is not None and not self.rate > 0:
            raise PlanError(f"Generator: rate must be a positive number of events per second, got {self.rate!r}")
        if self.limit is not None and self.limit < 0:
            raise PlanError(f"Generator: limit must be zero or more events, got {self.limit!r}")
        if self.rows_per_batch < 1:
            raise PlanError(f"Generator: rows_per_batch must be at least 1, got {self.rows_per_batch!r}")
        if self.partitions < 1:
            raise PlanError(f"Generator: partitions must be at least 1, got {self.partitions!r}")

    @property
    def bounded(self) -> bool:
        return self.limit is not None

    def schema(self) -> Schema:
        return SCHEMAS[self.kind]

    def options(self) -> dict[str, str]:
        options = {
            "kind": self.kind,
            "rows_per_batch": str(self.rows_per_batch),
            "partitions": str(self.partitions),
            "seed": str(self.seed),
        }
        for key in ("rate", "limit", "start_ms"):
            value = getattr(self, key)
            if value is not None:
                options[key] = str(value)
        return options

    def offset_identity(self) -> dict[str, Any]:
        """Event ``i`` is a function of kind, seed, rate and start time: these fix what offset
        ``i`` yields. ``limit`` (only where the input ends; a change between bounded and
        unbounded is checked apart), ``rows_per_batch`` and ``partitions`` do not."""
        return {"kind": self.kind, "seed": self.seed, "rate": self.rate, "start_ms": self.start_ms}

    def describe(self) -> dict[str, Any]:
        return {
            "type": "Generator", "kind": self.kind, "rate": self.rate, "limit": self.limit,
            "rows_per_batch": self.rows_per_batch, "partitions": self.partitions, "seed": self.seed,
            "start_ms": self.start_ms, "bounded": self.bounded, "guarantee": self.guarantee.value,
        }
