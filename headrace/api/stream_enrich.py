"""Calls to outside services (``Stream.enrich``, docs/enrich.md): the checks an enrich step must
pass as the pipeline is built, and its node."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from headrace.code_locations import user_location
from headrace.durations import to_millis
from headrace.engine.enrichment import HIDDEN_PREFIX, is_async
from headrace.errors import PlanError, step_error
from headrace.plan.call_policy import CallPolicy
from headrace.plan.nodes import EnrichNode, Node
from headrace.schema import schema_of


def enrich_node(node: Node, step: str, fn: Callable[..., Any], fields: Mapping[str, Any] | Any, *,
                concurrency: int, timeout: Any, retries: int, backoff: Any, cache_ttl: Any,
                cache_key: Sequence[str] | None) -> EnrichNode:
    where = user_location()

    def fail(message: str) -> PlanError:
        return step_error(step, where, message)

    if not callable(fn):
        raise fail(f"enrich needs an async function, a function or hr.HttpJson(...) to call, got {fn!r}")
    if fields is None:
        raise fail("enrich needs fields={'name': 'type', ...}: the fields each call returns, which it adds")
    added = schema_of(fields, f"step '{step}' ({where}) fields")
    have = {name for name, _ in node.schema or ()}
    taken = [name for name, _ in added if name in have or name.startswith(HIDDEN_PREFIX)]
    if taken:
        raise fail(f"the stream already has a field {taken[0]!r}, which the call would add; rename one of them "
                   "(select or with_columns), or leave it out of fields=")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise fail(f"concurrency must be a whole number of calls at a time, 1 or more, got {concurrency!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise fail(f"retries must be a whole number, 0 or more, got {retries!r}")
    timeout_s = _seconds(timeout, f"step '{step}' ({where}) timeout", fail)
    backoff_s = _seconds(backoff, f"step '{step}' ({where}) backoff", fail, zero=True)
    cache_ttl_s = None if cache_ttl is None else _seconds(cache_ttl, f"step '{step}' ({where}) cache_ttl", fail)
    key = None
    if cache_key is not None:
        key = (cache_key,) if isinstance(cache_key, str) else tuple(cache_key)
        missing = [k for k in key if node.schema is not None and k not in have]
        if missing:
            raise fail(f"cache_key names {missing[0]!r}, which the stream does not have "
                       f"(it has {', '.join(sorted(have))})")
        if cache_ttl_s is None:
            raise fail("cache_key= needs cache_ttl= (how long an answer is kept)")
    if not is_async(fn) and concurrency > 256:
        raise fail(f"a plain function runs in a thread per call in flight; concurrency={concurrency} would start "
                   "that many threads in each worker: make the function async, or ask for 256 or fewer")
    schema = None if node.schema is None else (*node.schema, *added)
    return EnrichNode(step, (node.name,), where, schema, node.event_time, node.keys, fn=fn, added=added,
                      calls=CallPolicy(concurrency, timeout_s, retries, backoff_s, cache_ttl_s, key))


def _seconds(value: Any, what: str, fail: Callable[[str], PlanError], zero: bool = False) -> float:
    """Seconds in ``value``: a number of seconds, or a duration such as '500ms' or '2s'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        seconds = to_millis(value, what) / 1000
    if seconds < 0 or (seconds == 0 and not zero):
        raise fail(f"{what.split(') ', 1)[-1]} must be more than 0{' or 0' if zero else ''} seconds, got {value!r}")
    return seconds
