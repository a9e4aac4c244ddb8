"""The Yahoo Streaming Benchmark pipeline: the demo, an example and the benchmark's subject.

Ad events -> keep the views -> project (ad_id, event_time) -> join ad -> campaign ->
count per campaign per 10 s event-time window.
"""

from __future__ import annotations

from typing import Any

import headrace as hr
from headrace.connectors.generator import ysb_ads
from headrace.contract import SinkConnector


def is_view(event: dict[str, Any]) -> bool:
    return event["event_type"] == "view"


def project(event: dict[str, Any]) -> dict[str, Any]:
    return {"ad_id": event["ad_id"], "event_time": event["event_time"]}


def ysb_pipeline(*, variant: str = "native", limit: int | None = 3_000_000, rate: float | None = None,
                 rows_per_batch: int = 1_000_000, window: str = "10s", max_out_of_orderness: str = "1s",
                 sink: SinkConnector | None = None, name: str = "ysb") -> hr.Pipeline:
    """``variant="native"`` filters and projects with column expressions; ``"python"`` with
    Python functions (one fused Arrow stage)."""
    p = hr.Pipeline(name)
    ads = p.table("ads", ysb_ads())
    # Event time is declared on the views, as the YSB reference implementations take it: the
    # watermark follows the views (the events counted), and the filter runs before it.
    events = p.source("ad_events", hr.sources.Generator("ysb", rate=rate, limit=limit, rows_per_batch=rows_per_batch))
    if variant == "native":
        views = events.filter(hr.col("event_type") == "view", name="views").select("ad_id", "event_time",
                                                                                     name="project")
    elif variant == "python":
        views = events.filter(is_view, name="views").map(project, schema={"ad_id": "string", "event_time": "timestamp"},
                                                          name="project")
    else:
        raise hr.PlanError(f"ysb_pipeline: variant must be 'native' or 'python', got {variant!r}")
    counts = (views.with_event_time("event_time", max_out_of_orderness, name="view_time")
              .join(ads, on="ad_id", name="campaign")
              .key_by("campaign_id")
              .window(hr.Tumbling(window), name="per_window")
              .aggregate(views=hr.count()))
    counts.sink("campaign_counts", sink if sink is not None else hr.sinks.Console(limit=10))
    return p
