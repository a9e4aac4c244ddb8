"""A Kafka sink: each micro-batch in one Kafka transaction, exactly once for ``read_committed`` readers.

**Exactly-once** (the default). The driver writes a batch's records with a transactional
producer (``confluent-kafka``) whose ``transactional.id`` derives from the sink's identity
(step, pipeline and checkpoint, ``headrace/sink_step.py``). In the same
transaction it commits the batch id as the offset of a consumer group of the same name on
partition 0 of the commits topic (``headrace_sink_commits``, which holds no records), so the
records and the batch id become visible together or not at all:

* a batch Spark replays after a crash whose transaction committed is skipped
  (``committed``: the group's offset is past its id);
* a transaction the crashed driver left open is aborted when the next driver starts its
  producer under the same ``transactional.id`` (Kafka fences the old one), so consumers
  reading with ``isolation.level=read_committed`` never see its records.

The rows of a batch pass through the driver (``toArrow``), as the PostgreSQL sink's do.

**At-least-once** (``exactly_once=False``): Spark's own Kafka writer, run by the executors
(its streaming writer when this is the pipeline's only sink, which is also what Spark's
real-time mode writes with); a replayed batch is written again. The pipeline then declares
at-least-once.

Values are JSON objects of the row (Spark's ``to_json``: timestamps as ISO-8601 in UTC),
or, with ``format="raw"``, the row's ``value`` column as is; the key is the ``key`` column(s)
(several are joined as a JSON array), or none.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from typing import Any

from headrace.connectors.base import StepSink
from headrace.connectors.retry import Backoff, RetriesExhausted, retry, unreachable
from headrace.contract import Guarantee
from headrace.environment import jars
from headrace.errors import PlanError, SetupError, SinkError
from headrace.sink_step import SinkStep

DEFAULT_SERVERS = "127.0.0.1:9092"
COMMITS_TOPIC = "headrace_sink_commits"
FORMATS = ("json", "raw")
FLUSH_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 30.0
# How long the transaction coordinator lets a batch's transaction stay open before it aborts
# it and fences the producer. Kafka's default, 60 s, is shorter than a batch can take while a
# replicated cluster loses a broker (acks=all waits until the dead replica leaves the in-sync
# set, up to replica.lag.time.max.ms, 30 s, per request). A transaction a killed driver left
# open does not wait for it: the next run's producer aborts it when it starts.
TRANSACTION_TIMEOUT_MS = 300_000
# How long one operation of the sink (writing a batch, reading its last commit, starting the
# producer) may take over all its attempts before it gives up and the run restarts the query:
# well inside the transaction timeout, so the coordinator never aborts a transaction the sink
# still works on. Each Kafka call waits at most what is left of it.
OPERATION_DEADLINE_S = 120.0


class _OncePerMinute(logging.Filter):
    """Lets through one record per distinct error per minute, with how many like it it held
    back: librdkafka logs each failed connection attempt of each client to each broker,
    hundreds a minute while a broker is down.

    >>> _OncePerMinute.error_of("FAIL [rdkafka#producer-2] [thrd:TxnCoordinator]: TxnCoordinator: "
    ...                         "127.0.0.1:9092: Connect to ipv4#127.0.0.1:9092 failed: Connection refused "
    ...                         "(after 0ms in state CONNECT)")
    'Connection refused'
    """

    def __init__(self, period_s: float = 60.0) -> None:
        super().__init__()
        self.period_s = period_s
        self.seen: dict[str, tuple[float, int]] = {}  # message shape -> (when let through, held back since)

    @staticmethod
    def error_of(message: str) -> str:
        """The error a log line reports, without the client, the broker and the timings."""
        text = re.sub(r"\s*\(.*?\)", "", message)
        if " failed: " in text:
            return text.rsplit(" failed: ", 1)[1]
        return re.sub(r"\[.*?\]|\S+:\d+\S*|\d+", "", text)

    def filter(self, record: logging.LogRecord) -> bool:
        shape = self.error_of(record.getMessage())
        now = time.monotonic()
        last = self.seen.get(shape)
        if last is not None and now - last[0] < self.period_s:
            self.seen[shape] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record.msg, record.args = f"{record.getMessage()} ({last[1]} more like it in the last minute)", None
        self.seen[shape] = (now, 0)
        return True


# librdkafka's own log (connection failures, retries the sink makes anyway): summarised to the
# "headrace.kafka" logger, shown by `--verbose` or the application's logging set-up, never by
# Python's last-resort handler on stderr (a failure that lasts is reported by the sink itself).
CLIENT_LOG = logging.getLogger("headrace.kafka")
CLIENT_LOG.addFilter(_OncePerMinute())
CLIENT_LOG.addHandler(logging.NullHandler())


def _confluent() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise SetupError("the Kafka sink needs the Python package confluent-kafka: pip install "
                         "'headrace[kafka]' (or confluent-kafka)") from None
    return confluent_kafka


# Errors another attempt can get past that librdkafka does not flag retriable where they come
# back from a consumer call: a coordinator that moved, or is still loading or being created
# (a fresh broker creates its offsets and transaction topics on first use), a timeout.
# A producer fenced while the cluster moves its transaction coordinator (the coordinator
# bumped its epoch) is replaced by a new one, whose start takes a newer epoch; the batch is
# then written only if its transaction had not committed (``_write_once``).
_RETRIED_CODES = ("NOT_COORDINATOR", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
                  "REQUEST_TIMED_OUT", "_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN",
                  "_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH")


def retriable(exc: BaseException) -> bool:
    """A Kafka error another attempt can get past (see ``_RETRIED_CODES``)."""
    kafka = _confluent()
    if not isinstance(exc, kafka.KafkaException):
        return False
    error = exc.args[0]
    codes = {getattr(kafka.KafkaError, name) for name in _RETRIED_CODES if hasattr(kafka.KafkaError, name)}
    return bool(error.retriable()) or error.code() in codes


def transactional_id(identity: str) -> str:
    """A Kafka transactional id (and consumer group) for a sink identity.

    >>> transactional_id("out/orders@3274e357-0c1e")
    'headrace-out.orders-3274e357-0c1e'
    """
    return "headrace-" + re.sub(r"[^A-Za-z0-9._-]", lambda m: "." if m.group() == "/" else "-", identity)


class Kafka(StepSink):
    """Write each batch to the Kafka topic ``topic``.

    ``servers``: the bootstrap servers. ``key``: the column(s) whose value is the record's
    key (none: no key). ``format``: "json" (the row as a JSON object) or "raw" (the
    ``value`` column, string or bytes). ``exactly_once``: one transaction per batch (see the
    module's docstring); False uses Spark's own Kafka writer, at-least-once. ``producer``:
    more producer settings (librdkafka's names, e.g. ``{"compression.type": "lz4"}``).
    """

    keyed_updates = "(..., key=[...]) on a compacted topic"  # which keeps each key's last record

    def __init__(self, topic: str, servers: str = DEFAULT_SERVERS, *, key: str | Sequence[str] | None = None,
                 format: str = "json", exactly_once: bool = True, producer: dict[str, Any] | None = None,
                 name: str | None = None) -> None:
        where = f"Kafka sink for topic {topic!r}"
        if not isinstance(topic, str) or not topic.strip():
            raise PlanError(f"Kafka sink: topic must be a topic name, got {topic!r}")
        if format not in FORMATS:
            raise PlanError(f"{where}: unknown format {format!r}; use one of {', '.join(FORMATS)}")
        keys = (key,) if isinstance(key, str) else tuple(key or ())
        if not all(isinstance(k, str) and k for k in keys):
            raise PlanError(f"{where}: key must be a column name or a list of column names, got {key!r}")
        self.topic, self.servers, self.key, self.format = topic, servers, keys, format
        self.exactly_once = bool(exactly_once)
        self.native_format: str | None = None if self.exactly_once else "kafka"  # Spark's writer
        self.backoff = Backoff()
        self.producer_settings = dict(producer or {})
        self._name = name
        self._step: SinkStep | None = None
        self._reset()

    def _reset(self) -> None:
        self._producer: Any = None
        self._group: Any = None
        self._deadline: float | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_producer": None, "_group": None, "_deadline": None}

    # -- identity and declarations --------------------------------------------------------------

    @property
    def guarantee(self) -> Guarantee:  # type: ignore[override]
        return Guarantee.EXACTLY_ONCE if self.exactly_once else Guarantee.AT_LEAST_ONCE

    @property
    def name(self) -> str:
        return self._name or self.topic

    def spark_packages(self) -> list[jars.Package]:
        return [] if self.exactly_once else [jars.KAFKA]

    def native_options(self) -> dict[str, str]:
        """Spark's Kafka writer: the topic, and the producer settings as ``kafka.*`` options."""
        settings = {f"kafka.{k}": str(v) for k, v in self.producer_settings.items()}
        return {**settings, "kafka.bootstrap.servers": self.servers, "topic": self.topic}

    def native_frame(self, df: Any) -> Any:
        return self._records(df)

    def describe(self) -> dict[str, Any]:
        return {"type": "Kafka", "topic": self.topic, "servers": self.servers, "key": list(self.key) or None,
                "format": self.format, "exactly_once": self.exactly_once, "guarantee": self.guarantee.value}

    def __repr__(self) -> str:
        return (f"Kafka({self.topic!r}, servers={self.servers!r}, key={list(self.key) or None!r}, "
                f"format={self.format!r}, exactly_once={self.exactly_once!r})")

    # -- the transactional producer -------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.servers, "logger": CLIENT_LOG, **self.producer_settings}

    def prepare(self, run_dir: str) -> None:
        """Before the query starts: create the commits topic and start the producer, which
        aborts a transaction a killed driver left open."""
        if self.exactly_once:
            self._retrying("start a transactional producer", self._ready)

    def _retrying(self, doing: str, action: Any) -> Any:
        """``action()``, tried again with a new producer after each retriable Kafka error
        (``Backoff()``: six attempts over about 15 s of waits, all within
        ``OPERATION_DEADLINE_S``); a SinkError naming the step otherwise."""
        kafka = _confluent()
        self._deadline = time.monotonic() + OPERATION_DEADLINE_S
        try:
            return retry(action, self.backoff, retriable, on_retry=lambda _exc: self.close(),
                         deadline_s=OPERATION_DEADLINE_S)
        except RetriesExhausted as out:  # the restart strategy restarts the query on these words
            self.close()
            raise SinkError(f"{self._where()}: {unreachable('Kafka', out.attempts, out.elapsed_s)} at {self.servers}: "
                            f"{out.last.args[0]}; gave up trying to {doing}; the run restarts the query from its "
                            "checkpoint under its restart strategy (exactly once); if the brokers stay down longer, "
                            "restart the pipeline once they are back", refusal=False) from None
        except kafka.KafkaException as exc:
            self.close()
            raise SinkError(f"{self._where()}: cannot {doing} at {self.servers}: {exc.args[0]}") from None
        finally:
            self._deadline = None

    def _wait(self, longest_s: float) -> float:
        """The timeout of one blocking Kafka call: ``longest_s``, but not past the operation's deadline."""
        if self._deadline is None:
            return longest_s
        return max(0.1, min(longest_s, self._deadline - time.monotonic()))

    def _ready(self) -> Any:
        """The transactional producer (its start fences an older one and aborts what it left
        open) and the consumer that reads the sink's commits."""
        if self._producer is not None:
            return self._producer
        kafka = _confluent()
        ident = transactional_id(self.name)
        self._ensure_commits_topic(kafka)
        producer = kafka.Producer({"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, **self._settings(),
                                   "transactional.id": ident, "enable.idempotence": True, "linger.ms": 5})
        producer.init_transactions(self._wait(CONNECT_TIMEOUT_S))
        consumer = kafka.Consumer({**self._settings(), "group.id": ident, "enable.auto.commit": False,
                                   "isolation.level": "read_committed"})
        self._producer, self._group = producer, consumer
        return producer

    def _ensure_commits_topic(self, kafka: Any) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self._settings())
        topics = admin.list_topics(timeout=self._wait(CONNECT_TIMEOUT_S)).topics  # unreachable: retried by _retrying
        if COMMITS_TOPIC in topics:
            return
        brokers = len(admin.list_topics(timeout=self._wait(CONNECT_TIMEOUT_S)).brokers)
        topic = NewTopic(COMMITS_TOPIC, num_partitions=1, replication_factor=min(3, brokers),
                         config={"cleanup.policy": "compact"})
        for future in admin.create_topics([topic], request_timeout=self._wait(CONNECT_TIMEOUT_S)).values():
            try:
                future.result()
            except kafka.KafkaException as exc:
                if exc.args[0].code() != kafka.KafkaError.TOPIC_ALREADY_EXISTS:
                    raise SinkError(f"{self._where()}: cannot create the topic {COMMITS_TOPIC}: "
                                    f"{exc.args[0]}") from None

    def _last_committed(self) -> int | None:
        kafka = _confluent()
        self._ready()
        [found] = self._group.committed([kafka.TopicPartition(COMMITS_TOPIC, 0)], timeout=self._wait(CONNECT_TIMEOUT_S))
        return found.offset - 1 if found.offset >= 0 else None

    def last_committed(self) -> int | None:
        """The last batch id this sink committed, or None."""
        return self._retrying("read its last committed batch", self._last_committed)

    def _is_committed(self, batch_id: int) -> bool:
        last = self._last_committed()
        return last is not None and last >= batch_id

    def committed(self, batch_id: int) -> bool:
        if not self.exactly_once:
            return False
        return bool(self._retrying(f"check whether batch {batch_id} is committed",
                                   lambda: self._is_committed(batch_id)))

    # -- writing ------------------------------------------------------------------------------

    def _records(self, df: Any) -> Any:
        """The batch as (key, value) columns computed by Spark."""
        from pyspark.sql import functions as F

        missing = [k for k in self.key if k not in df.columns]
        if missing:
            raise SinkError(f"{self._where()}: the key column(s) {missing} are not among the rows' columns "
                            f"{list(df.columns)}")
        if self.format == "raw":
            if "value" not in df.columns:
                raise SinkError(f"{self._where()}: a raw Kafka sink writes the column 'value'; the rows have "
                                f"{list(df.columns)}")
            value = F.col("value")
        else:
            value = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))
        if not self.key:
            key = F.lit(None).cast("string")
        elif len(self.key) == 1:
            key = F.col(f"`{self.key[0]}`").cast("string")
        else:
            key = F.to_json(F.array(*[F.col(f"`{k}`").cast("string") for k in self.key]))
        return df.select(key.alias("key"), value.alias("value"))

    def write_batch(self, df: Any, batch_id: int) -> None:
        records = self._records(df)
        if not self.exactly_once:
            records.write.format("kafka").options(**self.native_options()).save()
            return
        table = records.toArrow()  # reads the whole batch, so its stateful operators commit
        self._retrying(f"write batch {batch_id} in a transaction", lambda: self._write_once(batch_id, table))

    def _write_once(self, batch_id: int, table: Any) -> None:
        """One attempt. A retry starts a new producer, which completes or aborts the transaction
        the failed attempt left; if that transaction committed, the batch is not written again."""
        if self._is_committed(batch_id):
            return
        kafka = _confluent()
        producer = self._ready()
        try:
            producer.begin_transaction()
            keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
            for key, value in zip(keys, values, strict=True):
                self._produce(producer, key, value)
            offsets = [kafka.TopicPartition(COMMITS_TOPIC, 0, batch_id + 1)]
            producer.send_offsets_to_transaction(offsets, self._group.consumer_group_metadata(),
                                                  self._wait(FLUSH_TIMEOUT_S))
            producer.commit_transaction(self._wait(FLUSH_TIMEOUT_S))
        except kafka.KafkaException as exc:
            self._abandon(producer, exc.args[0])
            raise

    def _produce(self, producer: Any, key: Any, value: Any) -> None:
        deadline = time.monotonic() + self._wait(FLUSH_TIMEOUT_S)
        while True:
            try:
                producer.produce(self.topic, value=value, key=key)
                return
            except BufferError:  # the local queue is full: let it drain, but not without end
                if time.monotonic() > deadline:
                    kafka = _confluent()
                    full = f"the producer's queue stayed full for {FLUSH_TIMEOUT_S:g} s"
                    raise kafka.KafkaException(kafka.KafkaError(kafka.KafkaError._TIMED_OUT, full)) from None
                producer.poll(0.1)

    def _abandon(self, producer: Any, error: Any) -> None:
        """After a failed transaction: abort it when Kafka allows (``_retrying`` then drops the
        producer; the next one's start aborts it in any case)."""
        try:
            if error.txn_requires_abort():
                producer.abort_transaction(self._wait(FLUSH_TIMEOUT_S))
        except Exception:  # noqa: BLE001 - the new producer's init_transactions aborts it anyway
            pass

    def close(self) -> None:
        producer, group = self._producer, self._group
        self._reset()
        if producer is not None:  # drop what it holds, so that destroying it does not wait for the brokers
            try:
                producer.purge()
                producer.flush(0)
            except Exception:  # noqa: BLE001 - closing must not fail
                pass
        if group is not None:
            try:
                group.close()
            except Exception:  # noqa: BLE001 - closing must not fail
                pass
