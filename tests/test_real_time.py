"""Spark's real-time mode (``Pipeline(..., trigger="real-time")``): which pipelines can run in it,
the reasons ``explain()`` gives when one cannot, and a Kafka -> filter -> join with a static
table -> Kafka pipeline run in it for real against the test broker (see tests/test_kafka.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_kafka import broker, consume, new_topic, produce  # noqa: F401 - broker is a fixture

import headrace as hr
from headrace.errors import PlanError
from headrace.runtime.runner import PipelineRun

SCHEMA = "order_id long, user string, amount long"


def kafka_pipeline(trigger: str = "real-time", servers: str = "127.0.0.1:9092", topic: str = "orders",
                   out: str = "big_orders") -> hr.Pipeline:
    p = hr.Pipeline("fast_orders", trigger=trigger)
    tiers = p.table("tiers", rows=[{"user": f"u{i}", "tier": "gold" if i == 0 else "basic"} for i in range(3)])
    orders = p.source("orders", hr.sources.Kafka(topic, schema=SCHEMA, servers=servers))
    (orders.filter(hr.col("amount") >= 3).join(tiers, on="user").select("order_id", "user", "amount", "tier")
     .sink("out", hr.sinks.Kafka(out, servers=servers, key="user", exactly_once=False)))
    return p


@pytest.mark.fast
def test_explain_says_a_native_kafka_pipeline_can_run_in_real_time_mode() -> None:
    text = kafka_pipeline(trigger="micro-batch").explain()
    assert "real-time mode: possible (Pipeline(..., trigger='real-time'))" in text
    assert "lowered as: Spark's own Kafka source" in text
    text = kafka_pipeline().explain()
    assert "trigger: real-time (Spark's real-time mode" in text
    assert "guarantee: at-least-once" in text
    assert "output mode update" in text


@pytest.mark.fast
def test_explain_gives_every_reason_a_pipeline_cannot_run_in_real_time_mode(tmp_path: Path) -> None:
    p = hr.Pipeline("slow")
    clicks = p.source("clicks", hr.sources.Files(str(tmp_path), schema="user string, t timestamp"),
                      event_time="t")
    orders = p.source("orders", hr.sources.Kafka("orders", schema=SCHEMA))
    clicks.map(lambda r: r, name="tidy", schema="user string, t timestamp").sink("tidied", hr.sinks.Kafka("tidied"))
    orders.sink("copy", hr.sinks.Kafka("copy", exactly_once=False))
    text = p.explain()
    reasons = text.split("real-time mode: not possible:\n")[1].split("\n\n")[0]
    assert "source 'clicks' reads FileSource: Spark's real-time mode reads only Kafka" in reasons
    assert "step 'tidy' (test_real_time.py:" in reasons and "is a Python step" in reasons
    assert "the pipeline has 2 sinks ('tidied', 'copy')" in reasons


@pytest.mark.fast
def test_a_real_time_pipeline_spark_would_refuse_is_refused_when_built() -> None:
    p = hr.Pipeline("alerts", trigger="real-time")
    orders = p.source("orders", hr.sources.Kafka("orders", schema=SCHEMA))
    orders.filter(hr.col("amount") > 3).sink("out", hr.sinks.Kafka("alerts"))
    with pytest.raises(PlanError) as refused:
        p.validate()
    message = str(refused.value)
    assert message.startswith("pipeline 'alerts' cannot run in Spark's real-time mode:")
    assert "sink 'out' (test_real_time.py:" in message
    assert "the exactly-once Kafka sink writes each batch in one transaction from the driver; use " \
           "exactly_once=False" in message


@pytest.mark.fast
def test_a_window_emitting_final_results_cannot_run_in_real_time_mode() -> None:
    p = hr.Pipeline("counts", trigger="real-time")
    orders = p.source("orders", hr.sources.Kafka("orders", schema=f"{SCHEMA}, t timestamp"), event_time="t")
    (orders.key_by("user").window(hr.Tumbling("1s")).count()
     .sink("out", hr.sinks.Kafka("counts", exactly_once=False)))
    with pytest.raises(PlanError, match="emits final results \\(append mode\\); real-time mode runs in update "
                                        "mode: use emit='updates'"):
        p.validate()


@pytest.mark.fast
def test_an_unknown_trigger_is_refused() -> None:
    with pytest.raises(PlanError, match="pipeline 'p': unknown trigger 'continuous'; use 'micro-batch' or "
                                        "'real-time'"):
        hr.Pipeline("p", trigger="continuous")


def test_kafka_to_kafka_runs_in_spark_real_time_mode(spark: Any, broker: str, tmp_path: Path) -> None:  # noqa: F811
    source, target = new_topic(partitions=1), new_topic(partitions=1)
    p = kafka_pipeline(servers=broker, topic=source, out=target)
    run = PipelineRun(p, state_dir=str(tmp_path / "state"), progress="quiet").start()
    try:
        assert run.query._jsq.streamingQuery().trigger().toString().startswith("RealTimeTrigger")
        orders = [{"order_id": i, "user": f"u{i % 3}", "amount": i % 5} for i in range(60)]
        produce(source, [(o["user"], o, 0) for o in orders])  # while the long-running batch runs
        expected = sorted(json.dumps({**o, "tier": "gold" if o["user"] == "u0" else "basic"}, sort_keys=True)
                          for o in orders if o["amount"] >= 3)
        deadline = time.time() + 60
        while time.time() < deadline:
            found = consume(target, committed_only=False)
            if len(found) >= len(expected):
                break
            time.sleep(0.5)
        assert sorted(json.dumps(value, sort_keys=True) for _, value in found) == expected
        assert {key for key, _ in found} == {f"u{i}" for i in range(3)}
    finally:
        last = run.query.lastProgress
        in_flight = last["batchId"] + 1 if last else 0
        run.request_stop("test done")
        run.wait(until_exhausted=False)
    ran = [report["batchId"] for report in run.query.recentProgress]
    assert max(ran, default=0) <= in_flight, ("a stop waits for the running long batch, not for batches after it", ran)
