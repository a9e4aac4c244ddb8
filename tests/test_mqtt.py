"""The MQTT source and sink against a real broker (scripts/mosquitto.sh, 127.0.0.1:1883): messages
published while a pipeline runs and while it is stopped (persistent session) arrive once when
nothing fails, a batch replayed after its driver died reads the same spooled messages and the
broker's resend of them is dropped, the sink's messages reach a subscriber, the exactly-once
refusal, and the errors a user can cause. Every test uses topics of its own."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip

import headrace as hr
from headrace.connectors.mqtt import probe
from headrace.connectors.spark_readers.mqtt import MqttStreamReader
from headrace.errors import PlanError, SinkError, SourceError
from headrace.runtime.runner import PipelineRun
from headrace.testing import TestSink, TestSource

mqtt = pytest.importorskip("paho.mqtt.client")

URL = "mqtt://127.0.0.1:1883"
ROOT = Path(__file__).resolve().parent.parent
SCHEMA = "n long, who string"


def _answers() -> bool:
    try:
        probe(URL)
        return True
    except (OSError, ConnectionError):
        return False


@pytest.fixture(scope="module")
def broker() -> Iterator[Any]:
    """A connected publishing client of the running broker (started with scripts/mosquitto.sh
    when none answers), or a skip saying why."""
    if not _answers():
        try:
            started = subprocess.run(["bash", str(ROOT / "scripts" / "mosquitto.sh"), "start"], capture_output=True,
                                     text=True, timeout=300)
            why = started.stderr.strip()[-500:] or f"scripts/mosquitto.sh start exited {started.returncode}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            why = f"scripts/mosquitto.sh start: {exc}"
        service_or_skip("Mosquitto", _answers(), why)
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    yield client
    client.disconnect()
    client.loop_stop()


def new_topic() -> str:
    return f"hr_test/{uuid.uuid4().hex[:10]}"


def publish(broker: Any, topic: str, payloads: list[Any]) -> None:
    """Each payload (a dict as JSON, bytes as such) at QoS 1, waiting for the broker's acks."""
    infos = [broker.publish(topic, json.dumps(p) if isinstance(p, dict) else p, qos=1) for p in payloads]
    for info in infos:
        info.wait_for_publish(30)
        assert info.is_published()


def records(first: int, count: int) -> list[dict[str, Any]]:
    return [{"n": i, "who": f"w{i % 3}"} for i in range(first, first + count)]


def run_until(pipeline: hr.Pipeline, state_dir: str, done: Callable[[], bool], then: Callable[[], None] | None = None,
              timeout: float = 120) -> Any:
    """Run ``pipeline``; call ``then()`` once its query runs; stop it between batches when ``done()`` holds."""
    run = PipelineRun(pipeline, state_dir=state_dir, progress="quiet").start()
    deadline = time.time() + timeout
    try:
        if then is not None:
            then()
        while True:
            run.settle()
            if done():
                break
            assert time.time() < deadline, f"the pipeline did not finish within {timeout:.0f} s"
            time.sleep(0.2)
    finally:
        run.request_stop("test done")
    return run.wait(until_exhausted=False)


def test_messages_while_running_and_while_stopped_arrive_once(spark: Any, broker: Any, tmp_path: Path) -> None:
    topic, state = new_topic(), str(tmp_path / "state")

    def pipeline(out: TestSink, dead: TestSink) -> hr.Pipeline:
        p = hr.Pipeline("mqtt_orders")
        p.source("readings", hr.sources.Mqtt(f"{topic}/#", schema=SCHEMA, max_records_per_batch=40)).sink("out", out)
        p.dead_letters().sink("dead", dead)
        return p

    out1, dead1 = TestSink(), TestSink()
    explained = pipeline(out1, dead1).explain()
    assert "guarantee: at-least-once (readings: at-least-once; out: exactly-once; dead: exactly-once)" in explained
    first = records(0, 100)
    run_until(pipeline(out1, dead1), state, lambda: len(out1.rows()) >= 100 and len(dead1.rows()) >= 2,
              then=lambda: publish(broker, f"{topic}/a", [*first[:50], b"not json", *first[50:], b"[1]"]))
    assert sorted(r["n"] for r in out1.rows()) == list(range(100))  # nothing failed: each once
    assert {r["mqtt_topic"] for r in out1.rows()} == {f"{topic}/a"}
    assert [(d["raw"], d["position"].startswith(f"{topic}/a#")) for d in dead1.rows()] == \
        [("not json", True), ("[1]", True)]
    assert "expected a JSON object" in dead1.rows()[1]["error"]

    later = records(100, 60)  # published while no pipeline runs: the broker keeps them for the session
    publish(broker, f"{topic}/b", later)
    out2, dead2 = TestSink(), TestSink()
    run_until(pipeline(out2, dead2), state, lambda: len(out2.rows()) >= 60)
    time.sleep(1)
    assert sorted(r["n"] for r in out2.rows()) == list(range(100, 160))  # none of the first run's again
    assert not dead2.rows()


@pytest.mark.fast
def test_a_replayed_batch_reads_its_spooled_messages_and_the_resend_is_dropped(broker: Any, tmp_path: Path) -> None:
    """The reader as Spark drives it, without Spark: a batch is planned, then its process dies before
    the commit; the next process replays it from the spool, and the broker's resend of its
    unacknowledged messages (DUP) is not handed out again; after the commit nothing comes back."""
    topic = new_topic()
    source = hr.sources.Mqtt(topic, schema=SCHEMA, client_id=f"hr-test-{uuid.uuid4().hex[:8]}")
    options = {**source.options(), "hr_source": "readings", "hr_run_dir": str(tmp_path)}
    first = MqttStreamReader(options)
    start = first.initialOffset()
    publish(broker, topic, records(0, 30))
    end = wait_offset(first, start, 30)
    planned = [m["payload"] for p in first.partitions(start, end) for m in p.messages]
    first._client.loop_stop()  # the process dies: no ack, no disconnect
    first._client._sock_close()

    second = MqttStreamReader(options)
    replay = second.partitions(start, end)
    assert [m["payload"] for p in replay for m in p.messages] == planned
    rows = [row for part in replay for batch in second.read(part) for row in batch.to_pylist()]
    assert [r["n"] for r in rows] == list(range(30))
    assert second.latestOffset(end) == end  # starts the subscriber: the resend arrives...
    time.sleep(2)
    assert second.latestOffset(end) == end  # ...and is dropped
    second.commit(end)
    publish(broker, topic, records(30, 5))
    later = wait_offset(second, end, 5)
    assert [r["n"] for p in second.partitions(end, later) for b in second.read(p) for r in b.to_pylist()] == \
        list(range(30, 35))
    second.commit(later)
    second.stop()
    third = MqttStreamReader(options)
    time.sleep(2)
    assert third.latestOffset(later) == later  # every message was acknowledged
    third.stop()


def wait_offset(reader: MqttStreamReader, start: dict, count: int, timeout: float = 30) -> dict:
    deadline = time.time() + timeout
    end = start
    while end["seq"] - start["seq"] < count:
        assert time.time() < deadline, f"{end['seq'] - start['seq']} of {count} messages after {timeout} s"
        time.sleep(0.1)
        end = reader.latestOffset(start)
    return end


def test_the_sink_publishes_each_row_to_its_topic(spark: Any, broker: Any, tmp_path: Path) -> None:
    topic = new_topic()
    received: list[tuple[str, dict[str, Any]]] = []
    subscribed = threading.Event()
    listener = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    listener.on_message = lambda _c, _u, m: received.append((m.topic, json.loads(m.payload)))
    listener.on_subscribe = lambda *_args: subscribed.set()
    listener.connect("127.0.0.1", 1883)
    listener.loop_start()
    listener.subscribe(f"{topic}/#", qos=1)
    assert subscribed.wait(10)
    try:
        rows = records(0, 30)
        p = hr.Pipeline("mqtt_sink")
        (p.source("readings", TestSource([rows[:15], rows[15:]], schema=SCHEMA))
         .sink("to_mqtt", hr.sinks.Mqtt(topic + "/{who}", key="n")))
        assert "to_mqtt: at-least-once" in p.explain()
        hr.run(p, state_dir=str(tmp_path / "state"), progress="quiet")
        deadline = time.time() + 30
        while len(received) < len(rows) and time.time() < deadline:
            time.sleep(0.1)
    finally:
        listener.disconnect()
        listener.loop_stop()
    assert sorted(received, key=lambda m: m[1]["n"]) == [(f"{topic}/{r['who']}/{r['n']}", r) for r in rows]


@pytest.mark.fast
def test_exactly_once_is_refused_naming_the_source() -> None:
    p = hr.Pipeline("strict_mqtt", guarantee="exactly-once")
    p.source("readings", hr.sources.Mqtt("t", schema=SCHEMA)).sink("out", TestSink())
    with pytest.raises(PlanError, match=r"pipeline 'strict_mqtt' asks for exactly-once but can only give "
                                        r"at-least-once: source 'readings' \(Mqtt at test_mqtt.py:\d+\) is "
                                        r"at-least-once"):
        p.explain()


def test_bad_arguments_and_an_unreachable_broker_say_what_is_wrong(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"Mqtt\(\): give at least one topic"):
        hr.sources.Mqtt([], schema=SCHEMA)
    with pytest.raises(PlanError, match=r"Mqtt\(t\): unknown format 'xml'; use one of json, raw"):
        hr.sources.Mqtt("t", schema=SCHEMA, format="xml")
    with pytest.raises(PlanError, match=r"Mqtt\(t\): needs schema="):
        hr.sources.Mqtt("t")
    with pytest.raises(PlanError, match=r"url 'tcp://x:1883' is not an mqtt://host:port URL"):
        hr.sources.Mqtt("t", schema=SCHEMA, url="tcp://x:1883")
    with pytest.raises(PlanError, match=r"max_records_per_batch must be between 1 and 65535, got 0"):
        hr.sources.Mqtt("t", schema=SCHEMA, max_records_per_batch=0)
    with pytest.raises(PlanError, match=r"mqtt_topic clash with the source's own columns"):
        hr.sources.Mqtt("t", schema="mqtt_topic string")
    with pytest.raises(PlanError, match=r"Mqtt sink: topic must be a topic name without wildcards"):
        hr.sinks.Mqtt("a/#")
    with pytest.raises(PlanError, match=r"Mqtt sink for topic 'a': qos must be 0 or 1"):
        hr.sinks.Mqtt("a", qos=2)

    p = hr.Pipeline("mqtt_nowhere")
    p.source("readings", hr.sources.Mqtt("t", schema=SCHEMA, url="mqtt://app:secret@127.0.0.1:1")).sink(
        "out", TestSink())
    with pytest.raises(SourceError, match=r"source 'readings': MQTT broker at mqtt://app@127.0.0.1:1: cannot connect"):
        PipelineRun(p, state_dir=str(tmp_path / "nowhere"), progress="quiet").start()
    p = hr.Pipeline("mqtt_sink_nowhere")
    p.source("readings", TestSource([records(0, 3)], schema=SCHEMA)).sink(
        "to_mqtt", hr.sinks.Mqtt("t", url="mqtt://127.0.0.1:1"))
    with pytest.raises(SinkError, match=r"sink 'to_mqtt' \(test_mqtt.py:\d+\): MQTT broker at mqtt://127.0.0.1:1: "
                                        r"cannot connect"):
        PipelineRun(p, state_dir=str(tmp_path / "sink_nowhere"), progress="quiet").start()
    p = hr.Pipeline("mqtt_sink_no_column")
    p.source("readings", TestSource([records(0, 3)], schema=SCHEMA)).sink("to_mqtt", hr.sinks.Mqtt("t/{room}"))
    with pytest.raises(Exception, match=r"sink 'to_mqtt' \(test_mqtt.py:\d+\): the topic's placeholders or key name "
                                        r"column\(s\) \['room'\] that are not in the stream's columns"):
        hr.run(p, state_dir=str(tmp_path / "no_column"), progress="quiet")
