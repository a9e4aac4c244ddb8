"""Calls to outside services in the stream (``stream.enrich``, docs/enrich.md), run in Spark's
Python workers: each Arrow batch of a micro-batch's partition at once.

Every record of the batch gets its own call, up to ``concurrency`` of them in flight in the
worker; each call has ``timeout`` seconds and is tried again ``retries`` times, after a backoff
that doubles (with jitter), unless it fails for good (``PermanentError``, such as an HTTP 4xx
answer). The fields a call returns are added to its record; a record whose calls all failed
keeps its place with the reason, for the dead letters. The output keeps the batch's order.
Answers may be cached per worker for ``cache_ttl`` seconds, by the fields named in ``cache_key``.

An async function is awaited on the worker's event loop (one per Python worker, kept between
batches); a plain function runs in a thread of a pool of ``concurrency`` threads.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from headrace.contract import CONTROL_COLUMN
from headrace.errors import StepFunctionError
from headrace.plan.call_policy import CallPolicy
from headrace.schema import arrow_type

ERROR, POSITION, RAW = "_hr_enrich_error", "_hr_enrich_position", "_hr_enrich_raw"
HIDDEN_PREFIX = "_hr_"  # headrace's own columns are not part of the record a call sees


class PermanentError(Exception):
    """A failure another try cannot fix (an HTTP answer 4xx other than 408 and 429): the record
    goes to the dead letters without retries. A function may raise it too."""


class HttpJson:
    """An HTTP service as an enrich function: each record's fields ``send`` (all, by default)
    go as a JSON object (the body of a POST, or the query of a GET); the answer's JSON object
    gives the fields to add. A 5xx, 408 or 429 answer is tried again; another 4xx is not."""

    def __init__(self, url: str, *, send: Sequence[str] | None = None, method: str = "POST",
                 headers: Mapping[str, str] | None = None) -> None:
        if method not in ("POST", "GET"):
            raise ValueError(f"HttpJson: method must be 'POST' or 'GET', got {method!r}")
        self.url, self.method = url, method
        self.send = tuple(send) if send is not None else None
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"HttpJson({self.method} {self.url})"

    def payload(self, record: Mapping[str, Any]) -> dict[str, Any]:
        names = self.send if self.send is not None else tuple(record)
        return {name: _jsonable(record[name]) for name in names}

    async def __call__(self, record: Mapping[str, Any]) -> Any:
        session = await _http_session()
        payload = self.payload(record)
        if self.method == "POST":
            request = session.post(self.url, json=payload, headers=self.headers)
        else:
            request = session.get(self.url, params={k: str(v) for k, v in payload.items()}, headers=self.headers)
        async with request as answer:
            if answer.status >= 400:
                text = (await answer.text())[:200]
                failure = f"HTTP {answer.status} from {self.url}: {text}"
                if answer.status < 500 and answer.status not in (408, 429):
                    raise PermanentError(failure)
                raise ConnectionError(failure)
            return await answer.json(content_type=None)


def _jsonable(value: Any) -> Any:
    return value.isoformat() if hasattr(value, "isoformat") else value


_LOOP: asyncio.AbstractEventLoop | None = None  # this worker's event loop, kept between batches
_SESSION: Any = None  # this worker's aiohttp session (on _LOOP)
_THREADS: dict[int, ThreadPoolExecutor] = {}  # concurrency -> the pool that runs plain functions
_CACHE: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}  # (step, key) -> (expiry, answer)


def _event_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP


async def _http_session() -> Any:
    global _SESSION
    if _SESSION is None or _SESSION.closed:
        import aiohttp  # the enrich extra (pip install 'headrace[enrich]')

        # the step's semaphore bounds the calls in flight: no second limit in the connector
        _SESSION = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return _SESSION


def is_async(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` (a function or a callable object) returns an awaitable."""
    return inspect.iscoroutinefunction(fn) or (callable(fn) and inspect.iscoroutinefunction(type(fn).__call__))


@dataclass(frozen=True)
class Outcome:
    fields: dict[str, Any] | None  # what the call returned (None: every call failed)
    error: str | None = None


class Caller:
    """One batch's calls for step ``step``: ``run(records)`` gives an ``Outcome`` per record, in order."""

    def __init__(self, step: str, fn: Callable[..., Any], policy: CallPolicy) -> None:
        self.step, self.fn, self.policy = step, fn, policy
        self.asynchronous = is_async(fn)

    def run(self, records: list[dict[str, Any]]) -> list[Outcome]:
        return _event_loop().run_until_complete(self._all(records))

    async def _all(self, records: list[dict[str, Any]]) -> list[Outcome]:
        slots = asyncio.Semaphore(self.policy.concurrency)
        pending: dict[tuple[str, str], asyncio.Task[Outcome]] = {}  # a cached key's call in flight
        return list(await asyncio.gather(*(self._cached(record, slots, pending) for record in records)))

    async def _cached(self, record: dict[str, Any], slots: asyncio.Semaphore,
                      pending: dict[tuple[str, str], asyncio.Task[Outcome]]) -> Outcome:
        """The record's outcome; with a cache, a key's answer kept, or its call in flight, is shared."""
        key = self._cache_key(record)
        if key is None:
            return await self._one(record, slots, None)
        kept = _CACHE.get(key)
        if kept is not None and kept[0] > time.monotonic():
            return Outcome(kept[1])
        if key not in pending:
            pending[key] = asyncio.ensure_future(self._one(record, slots, key))
        return await asyncio.shield(pending[key])

    async def _one(self, record: dict[str, Any], slots: asyncio.Semaphore, key: tuple[str, str] | None) -> Outcome:
        policy, last = self.policy, ""
        for attempt in range(policy.retries + 1):
            if attempt:
                pause = policy.backoff_s * 2 ** (attempt - 1)
                await asyncio.sleep(pause * (0.5 + random.random() / 2))
            async with slots:
                try:
                    answer = await asyncio.wait_for(self._call(record), policy.timeout_s)
                except PermanentError as exc:
                    return Outcome(None, f"call {attempt + 1} failed for good: {exc}")
                except TimeoutError:
                    last = f"no answer within {policy.timeout_s:g} s"
                    continue
                except Exception as exc:  # noqa: BLE001 - any failure of the call is tried again
                    last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    continue
            if not isinstance(answer, Mapping):
                return Outcome(None, f"the call returned {type(answer).__name__} ({str(answer)[:80]}), not a "
                                     "dict of the fields to add")
            fields = dict(answer)
            if key is not None and policy.cache_ttl_s is not None:
                _CACHE[key] = (time.monotonic() + policy.cache_ttl_s, fields)
            return Outcome(fields)
        calls = policy.retries + 1
        return Outcome(None, f"{calls} call{'s' if calls > 1 else ''} failed; the last: {last}")

    async def _call(self, record: dict[str, Any]) -> Any:
        if self.asynchronous:
            return await self.fn(record)
        pool = _THREADS.get(self.policy.concurrency)
        if pool is None:
            pool = _THREADS[self.policy.concurrency] = ThreadPoolExecutor(self.policy.concurrency)
        return await asyncio.get_running_loop().run_in_executor(pool, self.fn, record)

    def _cache_key(self, record: dict[str, Any]) -> tuple[str, str] | None:
        if self.policy.cache_ttl_s is None:
            return None
        names = self.policy.cache_key or tuple(record)
        return self.step, json.dumps([_jsonable(record.get(n)) for n in names], default=str)


@dataclass(frozen=True)
class EnrichBatches:
    """The function given to ``mapInArrow`` for an enrich step in micro-batch ``batch_id``: each
    batch comes back with the added fields and, for the records whose calls failed, the reason,
    their position and the record as JSON (``ERROR``, ``POSITION``, ``RAW``)."""

    step: str
    defined_at: str
    fn: Callable[..., Any]
    policy: CallPolicy
    added: tuple[tuple[str, str], ...]  # (field, type) the calls add
    batch_id: int
    to_dead_letters: bool  # else a record whose calls all failed stops the pipeline

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        caller, index = Caller(self.step, self.fn, self.policy), 0
        for batch in batches:
            shown = [n for n in batch.schema.names if not n.startswith(HIDDEN_PREFIX)]
            records = batch.select(shown).to_pylist()
            outcomes = self._outcomes(caller, batch, records)
            columns, errors = self._columns(records, outcomes)
            positions = [None if e is None else f"batch {self.batch_id}, partition {partition}, record {index + i}"
                         for i, e in enumerate(errors)]
            raws = [None if e is None else json.dumps(r, default=str) for r, e in zip(records, errors)]
            index += len(records)
            failed = next((i for i, e in enumerate(errors) if e is not None), None)
            if failed is not None and not self.to_dead_letters:
                raise StepFunctionError(
                    f"step '{self.step}' ({self.defined_at}): {errors[failed]} (record: {str(raws[failed])[:300]}); "
                    "send such records to the dead letters with p.dead_letters(<this step's stream>)")
            arrays = [*batch.columns, *columns, pa.array(errors, pa.string()), pa.array(positions, pa.string()),
                      pa.array(raws, pa.string())]
            yield pa.RecordBatch.from_arrays(arrays, names=[*batch.schema.names, *(n for n, _ in self.added),
                                                            ERROR, POSITION, RAW])

    @staticmethod
    def _outcomes(caller: Caller, batch: pa.RecordBatch, records: list[dict[str, Any]]) -> list[Outcome]:
        """Each record's outcome; control rows (watermark and end-of-input markers) are not called."""
        if CONTROL_COLUMN not in batch.schema.names:
            return caller.run(records)
        control = batch.column(CONTROL_COLUMN).is_valid().to_pylist()
        called = iter(caller.run([r for r, c in zip(records, control) if not c]))
        return [Outcome({}) if c else next(called) for c in control]

    def _columns(self, records: list[dict[str, Any]], outcomes: list[Outcome]) -> tuple[list[pa.Array], list[Any]]:
        """The added fields' columns, and each record's error (a value that does not fit its
        field's type is one)."""
        errors = [o.error for o in outcomes]
        values = {name: [None if o.fields is None else o.fields.get(name) for o in outcomes]
                  for name, _ in self.added}
        columns = []
        for name, type_name in self.added:
            kind = arrow_type(type_name)
            try:
                columns.append(pa.array(values[name], kind))
                continue
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                pass
            fitted = []
            for i, value in enumerate(values[name]):
                try:
                    pa.array([value], kind)
                    fitted.append(value)
                except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
                    fitted.append(None)
                    if errors[i] is None:
                        errors[i] = (f"the call returned {name!r} = {str(value)[:80]} ({type(value).__name__}), "
                                     f"which does not fit its declared type {type_name}")
            columns.append(pa.array(fitted, kind))
        return columns, errors
