"""The OpenAPI description of the server's REST API, served at ``/api/openapi.json`` (and fuzzed by
``tests/test_server.py`` with Schemathesis)."""

from __future__ import annotations

from typing import Any

from headrace.server import checkpoint_info, views
from headrace.server.registry import (
    DRAINING,
    FAILED,
    FINISHED,
    PAUSED,
    RESCALING,
    RESTARTING,
    RUNNING,
    STARTING,
    STOPPED,
    STOPPING,
)

MAX_PARTITIONS = 10_000
ACTIONS = ("stop", "pause", "resume", "restart", "upgrade", "rescale", "remove")
STATUSES = [STARTING, RUNNING, RESTARTING, STOPPING, STOPPED, PAUSED, FINISHED, FAILED, DRAINING, RESCALING]


def _json_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, **_json_of({"$ref": "#/components/schemas/Error"})}


def _name_parameter() -> dict[str, Any]:
    return {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,100}$"}}


_VIEW_PARAMETER = {"name": "view", "in": "path", "required": True, "schema": {"type": "string"}}
_WAIT_PARAMETERS = [{"name": "min_batch", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "timeout", "in": "query", "schema": {"type": "number", "minimum": 0,
                                                                   "maximum": views.MAX_WAIT_S}}]
def _object_of_pipeline(summary: str) -> dict[str, Any]:
    """A GET of a pipeline's ``/api/pipelines/{name}/...`` that answers a JSON object."""
    return {"get": {"summary": summary, "parameters": [_name_parameter()],
                    "responses": {"200": {"description": summary, **_json_of({"type": "object"})},
                                  "404": _error("no such pipeline")}}}


_PIPELINE_REF = _json_of({"$ref": "#/components/schemas/Pipeline"})
OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "headrace server", "version": "1"},
    "components": {
        "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}},
            "Pipeline": {"type": "object", "properties": {
                "name": {"type": "string"}, "file": {"type": "string"}, "state_dir": {"type": "string"},
                "status": {"type": "string", "enum": STATUSES},
                "wanted": {"type": "boolean"}, "pid": {"type": "integer"}, "restarts": {"type": "integer"},
                "last_exit": {"type": "integer", "nullable": True}, "reason": {"type": "string"},
                "submitted_at": {"type": "number"}, "updated_at": {"type": "number"},
                "operation": {"$ref": "#/components/schemas/Operation"}}},
            "Operation": {"type": "object", "properties": {
                "id": {"type": "string"}, "pipeline": {"type": "string"}, "action": {"type": "string"},
                "status": {"type": "string", "enum": ["running", "done", "failed"]}, "detail": {"type": "string"},
                "started_at": {"type": "number"}, "ended_at": {"type": "number", "nullable": True}}},
            "Submit": {"type": "object", "required": ["file"], "additionalProperties": False, "properties": {
                "file": {"type": "string", "minLength": 1}, "name": {"type": "string", "minLength": 1},
                "fresh": {"type": "boolean", "description": "delete its checkpoint first and start over from the "
                                                            "beginning of its input"}}},
        },
    },
    "security": [{"token": []}],
    "paths": {
        "/api/pipelines": {
            "get": {"summary": "the pipelines", "responses": {"200": {"description": "each pipeline", **_json_of(
                {"type": "array", "items": {"$ref": "#/components/schemas/Pipeline"}})}}},
            "post": {"summary": "submit a pipeline file (idempotent: the same name and file give the running one)",
                     "requestBody": {"required": True, "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/Submit"}}}},
                     "responses": {"201": {"description": "started", **_PIPELINE_REF},
                                   "200": {"description": "already running", **_PIPELINE_REF},
                                   "400": _error("bad input, or a pipeline that does not build"),
                                   "401": _error("no token"), "403": _error("a file outside the allowed directories"),
                                   "409": _error("the name runs another file, or its checkpoint cannot be "
                                                 "continued (drained, or changed in a way it cannot follow)"),
                                   "422": _error("loading the file did not finish in time")}}},
        "/api/operations/{id}": {"get": {
            "summary": "an operation a request began (submit, stop, pause, resume, restart, upgrade): running until "
                       "what it asked for has happened, then done, or failed saying why",
            "parameters": [{"name": "id", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^[0-9a-f]{1,32}$"}}],
            "responses": {"200": {"description": "the operation",
                                  **_json_of({"$ref": "#/components/schemas/Operation"})},
                          "404": _error("no such operation")}}},
        "/metrics": {"get": {"summary": "every pipeline's figures, in Prometheus's text format", "responses": {
            "200": {"description": "the metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
        "/api/pipelines/{name}": {"get": {
            "summary": "one pipeline", "parameters": [_name_parameter()],
            "responses": {"200": {"description": "the pipeline", **_PIPELINE_REF}, "404": _error("no such pipeline")}}},
        "/api/pipelines/{name}/logs": {"get": {
            "summary": "the end of its driver's log", "parameters": [_name_parameter(), {
                "name": "lines", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 10000}}],
            "responses": {"200": {"description": "the log's last lines", "content": {"text/plain": {
                "schema": {"type": "string"}}}}, "400": _error("bad input"), "404": _error("no such pipeline")}}},
        "/api/pipelines/{name}/figures": _object_of_pipeline(
            "its totals (each batch once), its last batch's figures and its recent batches'"),
        "/api/pipelines/{name}/dag": _object_of_pipeline(
            "the steps of the plan its driver runs: name, kind, inputs, where defined, connector type"),
        "/api/pipelines/{name}/exceptions": _object_of_pipeline(
            "the errors its drivers ended with, each once with its count, its first and last time, the latest first"),
        "/api/pipelines/{name}/checkpoints": {"get": {
            "summary": "its checkpoint: location, committed batches, size on disk, state per stateful operator, and "
                       "its last committed batches (limit, 100 by default), newest first, each with when it "
                       "committed, its duration, input rows and watermark",
            "parameters": [_name_parameter(), {"name": "limit", "in": "query", "schema": {
                "type": "integer", "minimum": 1, "maximum": checkpoint_info.MAX_LIMIT}}],
            "responses": {"200": {"description": "the checkpoint and its batches", **_json_of({"type": "object"})},
                          "400": _error("bad input"), "404": _error("no such pipeline")}}},
        "/api/pipelines/{name}/config": _object_of_pipeline(
            "what it runs with: file, status, restart strategy, trigger, and each source's and sink's settings "
            "(secrets as ***)"),
        "/api/pipelines/{name}/state": _object_of_pipeline(
            "the pipeline's queryable views, each with the batch and watermark it is as of"),
        "/api/pipelines/{name}/state/{view}": {"get": {
            "summary": "a page of a view's rows by key, those whose key starts with prefix, after cursor",
            "parameters": [_name_parameter(), _VIEW_PARAMETER,
                           {"name": "prefix", "in": "query", "schema": {"type": "string"}},
                           {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                           {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1,
                                                                       "maximum": views.MAX_LIMIT}},
                           *_WAIT_PARAMETERS],
            "responses": {"200": {"description": "the rows and the next page's cursor", **_json_of({"type": "object"})},
                          "400": _error("bad input"), "404": _error("no such pipeline or view"),
                          "409": _error("min_batch not reached in time")}}},
        "/api/pipelines/{name}/state/{view}/{key}": {"get": {
            "summary": "a view's row of one key (its columns' values as text, joined by |)",
            "parameters": [_name_parameter(), _VIEW_PARAMETER,
                           {"name": "key", "in": "path", "required": True, "schema": {"type": "string"}},
                           *_WAIT_PARAMETERS],
            "responses": {"200": {"description": "the row", **_json_of({"type": "object"})},
                          "400": _error("bad input"), "404": _error("no such pipeline, view or key"),
                          "409": _error("min_batch not reached in time")}}},
        "/api/pipelines/{name}/changes/{view}": {"get": {
            "summary": "server-sent events, one per batch that changes the view (its id: the batch id), from "
                       "after (or Last-Event-ID) on, until the batch until when given",
            "parameters": [_name_parameter(), _VIEW_PARAMETER,
                           {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                           {"name": "until", "in": "query", "schema": {"type": "integer", "minimum": 0}}],
            "responses": {"200": {"description": "the events", "content": {"text/event-stream": {
                "schema": {"type": "string"}}}}, "400": _error("bad input"),
                "404": _error("no such pipeline or view")}}},
        "/api/pipelines/{name}/{action}": {"post": {
            "summary": "stop (at a batch boundary; ?now=true at once; ?drain=true reads what the sources hold, "
                       "fires every window and ends the pipeline for good), pause (at a batch boundary) and resume, "
                       "restart from the checkpoint (?fresh=true: with the checkpoint deleted, from the "
                       "beginning of the input), upgrade to another file (body {\"file\": ...}; refused with "
                       "the reasons when its checkpoint cannot be kept), rescale its keyed state (body "
                       "{\"partitions\": N}), or remove a stopped pipeline",
            "parameters": [_name_parameter(), {"name": "action", "in": "path", "required": True,
                                               "schema": {"type": "string", "enum": list(ACTIONS)}},
                           {"name": "now", "in": "query", "schema": {"type": "boolean"}},
                           {"name": "drain", "in": "query", "schema": {"type": "boolean"}},
                           {"name": "fresh", "in": "query", "schema": {"type": "boolean"}}],
            "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "properties": {"file": {"type": "string"},
                                                 "partitions": {"type": "integer", "minimum": 1,
                                                                "maximum": MAX_PARTITIONS}}}}}},
            "responses": {"200": {"description": "done", **_PIPELINE_REF}, "400": _error("bad input"),
                          "401": _error("no token"), "404": _error("no such pipeline or action"),
                          "409": _error("not in a state for it, or refused with the reason (a drained "
                                        "checkpoint, no keyed state to rescale)"),
                          "422": _error("loading the file did not finish in time")}}},
    },
}
