"""Defects the differential test found, each as a fixed example with its expected output derived
by hand from the docs (docs/semantics.md, docs/windows.md)."""

from __future__ import annotations

import pytest

import headrace as hr
from headrace.testing import TestSink


def _same(record: dict) -> dict:
    return record


def test_a_map_that_changes_the_event_time_fields_type_is_refused_when_built():
    p = hr.Pipeline("found_event_time_type")
    events = p.source("events", hr.sources.Files("/nonexistent", "jsonl", {"key": "string", "ts": "long"},
                                                 bounded=True), event_time="ts", max_out_of_orderness=500)
    with pytest.raises(hr.PlanError, match="'same'") as refused:
        events.map(_same, schema={"key": "string", "ts": "long"}, name="same").sink("out", TestSink())
        p.validate()
    message = str(refused.value)
    assert "test_found_defects.py:" in message and "'ts'" in message
    assert "timestamp" in message and "long" in message and "datetime.datetime" in message
    # keeping the type, or the field's name for another value, is accepted
    events.map(_same, schema={"key": "string", "ts": "timestamp"}, name="kept")
    events.map(lambda r: {"key": r["key"], "millis": 0}, schema={"key": "string", "millis": "long"}, name="other")
