"""The server's checkpoints and configuration answers without a driver: a server in this process over
a pipeline's state dir written here (Spark's commit and offset logs, the driver's progress file, the
plan record a driver writes), its batches newest first, paged, and its settings without a secret."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_server import Server

import headrace as hr
from headrace.contract import SourceConnector
from headrace.runtime.compatibility import record_plan
from headrace.runtime.progress import summarise
from headrace.schema import Schema
from headrace.server.config_info import redact

pytestmark = pytest.mark.fast  # needs no JVM and no service

END_OF_INPUT_WATERMARK_MS = 253402214400000  # Spark's watermark once a bounded input ended (9999-12-31)


class Broker(SourceConnector):
    """A source whose options carry secrets: the default describe() lists every option."""

    def schema(self) -> Schema:
        return (("id", "long"),)

    def options(self) -> dict[str, str]:
        return {"url": "amqp://guest:guest@rabbit:5672/%2f", "password": "hunter2", "queue": "orders"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path)
    yield running
    running.close()


def write(path: Path, text: str, modified_at: float | None = None) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if modified_at is not None:
        os.utime(path, (modified_at, modified_at))
    return len(text.encode())


def offsets_entry(watermark_ms: int, partitions: int) -> str:
    metadata = {"batchWatermarkMs": watermark_ms, "batchTimestampMs": 1_700_000_000_000,
                "conf": {"spark.sql.shuffle.partitions": str(partitions)}}
    return f"v1\n{json.dumps(metadata)}\n{{\"files\": 3}}"


def test_the_checkpoints_answer_lists_the_committed_batches_newest_first_with_their_reports(server: Server,
                                                                                           tmp_path: Path):
    state_dir = tmp_path / "state" / "orders"
    checkpoint = server.pipeline("orders", state_dir) / "checkpoint"
    written = write(checkpoint / "metadata", '{"id": "q"}\n')
    watermarks = {0: 0, 1: 1_700_000_000_000, 2: END_OF_INPUT_WATERMARK_MS}
    for batch, watermark in watermarks.items():
        written += write(checkpoint / "commits" / str(batch), 'v1\n{"nextBatchWatermarkMs":0}',
                         modified_at=1_700_000_100.25 + batch)
        written += write(checkpoint / "commits" / f".{batch}.crc", "crc")
        written += write(checkpoint / "offsets" / str(batch), offsets_entry(watermark, 4 if batch < 2 else 2))
    written += write(checkpoint / "offsets" / "3", offsets_entry(END_OF_INPUT_WATERMARK_MS, 2))  # in flight
    state = write(checkpoint / "state" / "0" / "0" / "1.changelog", "x" * 100)
    # each operator's state by partition: a window's three partitions (the second holds nothing yet), and a
    # join's two, its stores in folders of their own and no metadata file
    state += write(checkpoint / "state" / "0" / "_metadata" / "metadata", 'v1\n{"operatorInfo":{"operatorId":0,'
                   '"operatorName":"stateStoreSave"},"stateStoreInfo":[{"storeName":"default","numPartitions":3}]}')
    state += write(checkpoint / "state" / "0" / "0" / "_metadata" / "schema", "s" * 50)  # no state: not counted
    state += write(checkpoint / "state" / "0" / "2" / "1.changelog", "x" * 20)
    state += write(checkpoint / "state" / "0" / "2" / "SSTs" / "1-a.sst", "x" * 380)
    state += write(checkpoint / "state" / "1" / "0" / "left-keyToNumValues" / "1.changelog", "y" * 10)
    state += write(checkpoint / "state" / "1" / "1" / "right-keyToNumValues" / "1.changelog", "y" * 30)
    write(checkpoint.parent / "state_operators.json", '{"0": "per_minute"}\n')  # as its driver noted it
    # the driver's reports: batch 1's with its stateful operator; batch 2 committed, its report lost with its driver
    operators = [{"operatorName": "stateStoreSave", "numRowsTotal": 2, "memoryUsedBytes": 900}]
    reports = [summarise({"batchId": 0, "numInputRows": 5, "durationMs": {"triggerExecution": 300}}),
               summarise({"batchId": 1, "numInputRows": 7, "durationMs": {"triggerExecution": 120},
                          "stateOperators": operators})]
    write(state_dir / "progress.jsonl", "".join(json.dumps(line) + "\n" for line in [{"started": True}, *reports]))

    status, answer = server.get("/api/pipelines/orders/checkpoints")
    assert status == 200, answer
    assert {name: answer[name] for name in ("checkpoint", "committed_batches", "last_committed", "retained_batches",
                                            "size_bytes", "state_size_bytes", "state_operators")} == {
        "checkpoint": str(checkpoint), "committed_batches": 3, "last_committed": 2, "retained_batches": 3,
        "size_bytes": written + state, "state_size_bytes": state,
        "state_operators": [{"operator": "stateStoreSave", "rows": 2, "memory_bytes": 900}]}
    assert answer["state_on_disk"] == [
        {"operator_id": 0, "operator": "stateStoreSave", "step": "per_minute", "partition_bytes": [100, 0, 400],
         "skew": 4.0},
        {"operator_id": 1, "operator": None, "step": None, "partition_bytes": [10, 30], "skew": 1.5}]
    assert answer["batches"] == [
        {"batch": 2, "committed_at": 1_700_000_102.25, "duration_ms": None, "input_rows": None,
         "watermark_ms": END_OF_INPUT_WATERMARK_MS, "watermark": "end of input", "state_partitions": 2},
        {"batch": 1, "committed_at": 1_700_000_101.25, "duration_ms": 120, "input_rows": 7,
         "watermark_ms": 1_700_000_000_000, "watermark": "2023-11-14T22:13:20.000Z", "state_partitions": 4},
        {"batch": 0, "committed_at": 1_700_000_100.25, "duration_ms": 300, "input_rows": 5, "watermark_ms": 0,
         "watermark": None, "state_partitions": 4}]
    status, page = server.get("/api/pipelines/orders/checkpoints?limit=2")
    assert status == 200 and [batch["batch"] for batch in page["batches"]] == [2, 1]
    assert page["committed_batches"] == 3


def test_an_operator_folder_gone_while_the_state_is_read_is_left_out(server: Server, tmp_path: Path):
    """A rescale rewrites the state while the UI reads it: an operator listed in the state folder
    whose own folder is gone a moment later (here a link to nowhere) is left out, not a 500."""
    checkpoint = server.pipeline("rescaled", tmp_path / "state" / "rescaled") / "checkpoint"
    write(checkpoint / "commits" / "0", 'v1\n{"nextBatchWatermarkMs":0}')
    write(checkpoint / "state" / "0" / "0" / "1.changelog", "x" * 10)
    (checkpoint / "state" / "1").symlink_to(tmp_path / "gone")
    status, answer = server.get("/api/pipelines/rescaled/checkpoints")
    assert status == 200, answer
    assert [operator["operator_id"] for operator in answer["state_on_disk"]] == [0]


def test_a_pipeline_without_a_committed_batch_answers_an_empty_list(server: Server, tmp_path: Path):
    server.pipeline("fresh", tmp_path / "state" / "fresh")
    status, answer = server.get("/api/pipelines/fresh/checkpoints")
    assert status == 200 and (answer["checkpoint"], answer["committed_batches"], answer["batches"]) == (None, 0, [])
    status, config = server.get("/api/pipelines/fresh/config")
    assert status == 200 and (config["plan_recorded"], config["sources"], config["sinks"]) == (False, [], [])


def test_an_unknown_pipeline_is_404_and_a_bad_limit_400_each_with_its_reason(server: Server, tmp_path: Path):
    server.pipeline("orders", tmp_path / "state" / "orders")
    assert server.get("/api/pipelines/nope/checkpoints") == (404, {"error": "no pipeline 'nope' (the server has: "
                                                                           "orders)"})
    assert server.get("/api/pipelines/nope/config") == (404, {"error": "no pipeline 'nope' (the server has: orders)"})
    for limit in ("0", "1001", "ten", "-1"):
        assert server.get(f"/api/pipelines/orders/checkpoints?limit={limit}") == (
            400, {"error": f"limit must be a whole number from 1 to 1000, got '{limit}'"})


def test_the_configuration_shows_each_source_and_sink_and_never_a_secret(server: Server, tmp_path: Path):
    root = server.pipeline("orders", tmp_path / "state" / "orders")
    p = hr.Pipeline("orders_in_file")
    p.source("orders", Broker()).sink("db", hr.sinks.Postgres("orders", dsn="postgresql://app:s3cret@db:5432/shop"))
    write(root / "checkpoint" / "metadata", '{"id": "q"}\n')  # the driver makes the checkpoint, then records the plan
    record_plan(p.plan, str(root), "1 second")

    status, config = server.get("/api/pipelines/orders/config")
    assert status == 200, config
    text = json.dumps(config)
    assert "hunter2" not in text and "s3cret" not in text and "guest:guest" not in text
    assert {name: config[name] for name in ("pipeline", "name_in_file", "file", "status", "plan_recorded", "trigger",
                                            "trigger_interval", "guarantee")} == {
        "pipeline": "orders", "name_in_file": "orders_in_file",
        "file": str(tmp_path / "state" / "orders" / "orders.py"), "status": "stopped", "plan_recorded": True,
        "trigger": "micro-batch", "trigger_interval": "1 second", "guarantee": "exactly-once"}
    assert config["restart_strategy"]["description"] == ("2 restarts within 1m, waiting 500ms, then twice as long for "
                                                         "each restart in the window (at most 60 s)")
    [source], [sink] = config["sources"], config["sinks"]
    assert (source["name"], source["type"]) == ("orders", "Broker")
    assert source["settings"] == {"url": "amqp://guest:***@rabbit:5672/%2f", "password": "***", "queue": "orders"}
    assert (sink["name"], sink["type"], sink["settings"]["dsn"], sink["settings"]["table"]) == (
        "db", "Postgres", "postgresql://app@db:5432/shop", "orders")


def test_redact_finds_secrets_in_nested_settings_and_leaves_the_rest():
    settings = {"servers": "kafka:9092", "key": ["id"], "options": {"sasl.jaas.config": "x", "ssl.key.password": "p",
                                                                   "retries": 3, "token": None},
                "sinks": [{"dsn": "host=db password='a b' user=app", "url": "redis://:pw@cache:6379/0"}]}
    assert redact(settings) == {
        "servers": "kafka:9092", "key": ["id"], "options": {"sasl.jaas.config": "***", "ssl.key.password": "***",
                                                           "retries": 3, "token": None},
        "sinks": [{"dsn": "host=db password=*** user=app", "url": "redis://:***@cache:6379/0"}]}
