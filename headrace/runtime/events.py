"""Spark's streaming-query events, delivered to the run they belong to.

One ``StreamingQueryListener`` per Spark session, registered on first use, receives the events
of every query on Spark's listener bus and routes each progress event, by query id, to the
inbox of the run that follows that query. The query id is kept in the checkpoint, so a run
keeps receiving its events when it restarts its query. A run reads its inbox on its own thread.

Spark posts one progress event per micro-batch it ran; a query waiting for data sends idle
events instead, which run no batch and are not routed. Events arrive a moment after the batch
ends: ``deliver_pending`` waits until every event Spark has posted so far has been handed over.

The router implements Spark's Java listener interface through Py4J itself and asks each event
for its JSON in one call. pyspark's ``StreamingQueryListener`` converts every event field by field
first (some forty calls into the JVM an event, each resolving classes there): about a tenth of the
JVM's CPU in a run of small micro-batches.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

DELIVERY_TIMEOUT_MS = 30_000
LISTENER_INTERFACE = "org.apache.spark.sql.streaming.PythonStreamingQueryListener"


class _Router:
    def __init__(self) -> None:
        self._inboxes: dict[str, queue.SimpleQueue[dict[str, Any]]] = {}
        self._observers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._lock = threading.Lock()

    def inbox(self, query_id: str, observer: Callable[[dict[str, Any]], None] | None = None
              ) -> queue.SimpleQueue[dict[str, Any]]:
        """A new inbox for ``query_id``: a run that follows a query gets its events from now on.
        ``observer`` sees each report as it arrives, on the listener's thread (admission control
        acts before the run reads its inbox)."""
        inbox: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        with self._lock:
            self._inboxes[query_id] = inbox
            self._observers.pop(query_id, None)
            if observer is not None:
                self._observers[query_id] = observer
        return inbox

    def forget(self, query_id: str, inbox: queue.SimpleQueue[dict[str, Any]]) -> None:
        with self._lock:
            if self._inboxes.get(query_id) is inbox:  # not a later run's
                del self._inboxes[query_id]
                self._observers.pop(query_id, None)

    # -- Spark's PythonStreamingQueryListener, called on Spark's listener bus with Java events --

    def onQueryStarted(self, jevent: Any) -> None:
        pass

    def onQueryProgress(self, jevent: Any) -> None:
        try:
            report = json.loads(jevent.progress().json())  # Spark's own JSON: what recentProgress gives
            with self._lock:
                inbox = self._inboxes.get(report["id"])
                observer = self._observers.get(report["id"])
            if inbox is not None:
                if observer is not None:
                    observer(report)
                inbox.put(report)
        except Exception:  # noqa: BLE001 - never fail Spark's listener bus; the run reads what arrived
            pass

    def onQueryIdle(self, jevent: Any) -> None:
        pass  # no batch ran

    def onQueryTerminated(self, jevent: Any) -> None:
        pass  # the run asks its query why it ended

    class Java:
        implements = [LISTENER_INTERFACE]


_routers: dict[int, _Router] = {}
_routers_lock = threading.Lock()


def _router(spark: Any) -> _Router:
    with _routers_lock:
        router = _routers.get(id(spark))
        if router is None:
            router = _Router()
            _register(spark, router)
            _routers[id(spark)] = router
        return router


def _register(spark: Any, router: _Router) -> None:
    """Put ``router`` on the session's listener bus, as ``spark.streams.addListener`` does."""
    from pyspark.java_gateway import ensure_callback_server_started

    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    wrapper = gateway.jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper(router)
    spark._jsparkSession.streams().addListener(wrapper)


def follow(spark: Any, query_id: str, observer: Callable[[dict[str, Any]], None] | None = None
           ) -> queue.SimpleQueue[dict[str, Any]]:
    """The inbox receiving the progress reports (Spark's JSON, as dicts) of query ``query_id``,
    each first shown to ``observer`` when given."""
    return _router(spark).inbox(query_id, observer)


def unfollow(spark: Any, query_id: str, inbox: queue.SimpleQueue[dict[str, Any]]) -> None:
    """Stop routing ``query_id``'s events to ``inbox``."""
    _router(spark).forget(query_id, inbox)


def deliver_pending(spark: Any) -> None:
    """Block until every event Spark has posted so far has reached its inbox."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(DELIVERY_TIMEOUT_MS)
    except Exception:  # noqa: BLE001 - a bus still busy after the timeout: the run reads what arrived
        pass
