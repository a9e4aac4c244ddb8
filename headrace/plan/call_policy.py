"""How an enrich step calls its service: one record of the settings, held by the plan's
``EnrichNode`` and followed by the workers' callers (headrace/engine/enrichment.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CallPolicy:
    """At most ``concurrency`` calls in flight per worker, each within ``timeout_s``, tried
    ``retries`` more times after ``backoff_s`` (doubling); answers kept ``cache_ttl_s`` seconds
    (None: not cached) by the fields ``cache_key`` (None: all)."""

    concurrency: int = 16
    timeout_s: float = 10.0
    retries: int = 3
    backoff_s: float = 0.1
    cache_ttl_s: float | None = None
    cache_key: tuple[str, ...] | None = None
