"""The server's REST API over HTTP (the standard library's threading server), described by the
OpenAPI document it serves at ``/api/openapi.json``.

Safe by default: bound to 127.0.0.1 unless told otherwise; every state-changing call is a POST
and needs the token (``Authorization: Bearer <token>``), and so does every call when the server
is bound to another address; a request whose Host header names another host is refused (DNS
rebinding; host names compare case-insensitively); bad input gets a 4xx with a one-line reason,
never a 500, and a body that stops short of its ``Content-Length`` gets one after ``BODY_TIMEOUT_S``. A
client that leaves before its answer is written is let go quietly.
"""

from __future__ import annotations

import hmac
import json
import re
import sys
import time
import traceback
from collections.abc import Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from headrace.server import checkpoint_info, views
from headrace.server.config_info import configuration
from headrace.server.metrics import Metrics
from headrace.server.openapi import ACTIONS, MAX_PARTITIONS, OPENAPI
from headrace.server.pipeline_dirs import dag
from headrace.server.registry import Entry, Refused
from headrace.server.supervisor import PROGRESS_FILE, Supervisor

MAX_BODY = 64 * 1024
BODY_TIMEOUT_S = 5.0  # how long a request's body may go without a byte before it is refused
GONE = (BrokenPipeError, ConnectionResetError)  # the client left: nobody to answer
LOOPBACK = ("127.0.0.1", "localhost", "::1")
PIPELINE = re.compile(r"^/api/pipelines/([^/]+)$")
ACTION = re.compile(r"^/api/pipelines/([^/]+)/([a-z]+)$")
LOGS = re.compile(r"^/api/pipelines/([^/]+)/logs$")
STATE = re.compile(r"^/api/pipelines/([^/]+)/state$")
STATE_VIEW = re.compile(r"^/api/pipelines/([^/]+)/state/([^/]+)$")
STATE_KEY = re.compile(r"^/api/pipelines/([^/]+)/state/([^/]+)/(.+)$")
CHANGES = re.compile(r"^/api/pipelines/([^/]+)/changes/([^/]+)$")
FIGURES = re.compile(r"^/api/pipelines/([^/]+)/figures$")
DAG = re.compile(r"^/api/pipelines/([^/]+)/dag$")
EXCEPTIONS = re.compile(r"^/api/pipelines/([^/]+)/exceptions$")
CHECKPOINTS = re.compile(r"^/api/pipelines/([^/]+)/checkpoints$")
CONFIG = re.compile(r"^/api/pipelines/([^/]+)/config$")
OPERATION = re.compile(r"^/api/operations/([0-9a-f]{1,32})$")
# The web UI's files (headrace/server/ui/), by path; they hold no data, so they need no token.
UI_FILES = {"/": ("index.html", "text/html"), "/ui/app.js": ("app.js", "text/javascript"),
            "/ui/style.css": ("style.css", "text/css")}
# Everything the page loads comes from the server itself, and nothing may frame it.
UI_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
             "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
MAX_BATCH = 10**12


class Api:
    """What the handler serves: the supervisor, the token, and the Host names it answers to."""

    def __init__(self, supervisor: Supervisor, token: str, host: str, port: int) -> None:
        self.supervisor, self.token, self.host = supervisor, token, host
        self.metrics = Metrics(PROGRESS_FILE)
        self.bound(port)

    def bound(self, port: int) -> None:
        """The port the server listens on (known once bound, when 0 asked for any)."""
        self.port = port
        self.hosts = {f"{name}:{port}".lower() for name in (*LOOPBACK, "[::1]", self.host)}  # DNS names: any case

    def open_reads(self) -> bool:
        """Whether a GET needs no token: only when the server listens on this machine alone."""
        return self.host in LOOPBACK


class Handler(BaseHTTPRequestHandler):
    server_version = "headrace"
    api: Api  # set on the class the server makes (see ``serve``)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # requests are not logged: the token could be in them

    def do_GET(self) -> None:  # noqa: N802 - the base class's name
        self._answer("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._answer("POST")

    def __getattr__(self, name: str) -> Any:
        """Any other method (PUT, DELETE, HEAD, TRACE, ...): 405, where the base class answers 501."""
        if name.startswith("do_"):
            return lambda: self._send(405, {"error": "the API takes GET and POST only"})
        raise AttributeError(name)

    def _answer(self, method: str) -> None:
        try:
            status, body = self._route(method)
        except Refused as refused:
            status, body = refused.status, {"error": str(refused)}
        except Exception as exc:  # noqa: BLE001 - a bug must not leave the client without an answer
            status, body = 500, {"error": f"internal error: {type(exc).__name__}: {exc}"}
            print(f"headrace server: internal error answering {method} {urlsplit(self.path).path}:\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)  # the path alone: no token
        try:
            self._send(status, body)
        except GONE:
            self.close_connection = True

    def handle(self) -> None:
        """Requests until the connection closes; a client that resets it ends them without a word."""
        try:
            super().handle()
        except GONE:
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        except GONE:
            pass  # what was left to flush had nobody to go to

    def _route(self, method: str) -> tuple[int, Any]:
        api = self.api
        if (self.headers.get("Host") or "").lower() not in api.hosts:
            raise Refused(403, "the Host header names another host (DNS rebinding?); use the URL the server printed")
        url = urlsplit(self.path)
        if method == "GET" and url.path in UI_FILES:
            return 200, _ui_file(url.path)
        if method == "POST":
            self._check_origin()
        if method == "POST" or not api.open_reads():
            self._check_token()
        query = {key: values[-1] for key, values in parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        if path == "/api/openapi.json" and method == "GET":
            return 200, OPENAPI
        if path == "/metrics" and method == "GET":
            registry = api.supervisor.registry
            entries = registry.all()
            errors = {entry.name: registry.exception_count(entry.name) for entry in entries}
            return 200, api.metrics.exposition(entries, errors)
        if path == "/api/pipelines":
            if method == "GET":
                return 200, [entry.public() for entry in api.supervisor.registry.all()]
            body = self._json_body()
            unknown = set(body) - {"file", "name", "fresh"}
            if unknown:
                raise Refused(400, f"unknown field(s) {', '.join(sorted(unknown))}: give file and, if you like, name "
                                   "and fresh")
            name = body.get("name")
            if name is not None and (not isinstance(name, str) or not name):
                raise Refused(400, f"name must be the pipeline's name on the server, got {name!r}: leave it out to "
                                   "use the name in its file")
            file = body.get("file")
            if not isinstance(file, str) or not file:
                raise Refused(400, "give the pipeline's file as \"file\": a path on the server's machine")
            fresh = body.get("fresh", False)
            if not isinstance(fresh, bool):
                raise Refused(400, f"fresh must be true or false, got {fresh!r}")
            asked_at = time.time()
            entry, started = api.supervisor.submit(file, name, fresh=fresh)
            return (201, self._operation(entry, "submit", asked_at)) if started else (200, entry.public())
        if method == "GET" and (match := FIGURES.match(path)):
            return 200, api.metrics.figures(api.supervisor.existing(match.group(1)))
        if method == "GET" and (match := DAG.match(path)):
            return 200, dag(api.supervisor.existing(match.group(1)))
        if method == "GET" and (match := EXCEPTIONS.match(path)):
            name = api.supervisor.existing(match.group(1)).name
            return 200, {"pipeline": name, "exceptions": api.supervisor.registry.exceptions(name)}
        if method == "GET" and (match := CHECKPOINTS.match(path)):
            limit = _integer(query.get("limit", str(checkpoint_info.DEFAULT_LIMIT)), "limit", 1,
                             checkpoint_info.MAX_LIMIT)
            entry = api.supervisor.existing(match.group(1))
            reports = api.metrics.figures(entry, checkpoint_info.MAX_LIMIT)["recent"]
            return 200, checkpoint_info.checkpoints(entry, reports, limit)
        if method == "GET" and (match := CONFIG.match(path)):
            entry = api.supervisor.existing(match.group(1))
            return 200, configuration(entry, api.supervisor.restart_policy(entry.name))
        if method == "GET" and (answer := self._state(path, query)) is not None:
            return answer
        if (match := LOGS.match(path)) and method == "GET":
            lines = _integer(query.get("lines", "200"), "lines", 1, 10_000)
            return 200, api.supervisor.logs(match.group(1), lines)
        if (match := OPERATION.match(path)) and method == "GET":
            operation = api.supervisor.operations.get(match.group(1))
            if operation is None:
                raise Refused(404, f"no operation {match.group(1)!r}")
            return 200, operation.public()
        if (match := PIPELINE.match(path)) and method == "GET":
            return 200, api.supervisor.existing(match.group(1)).public()
        if (match := ACTION.match(path)) and method == "POST":
            name, action = match.groups()
            if action not in ACTIONS:
                raise Refused(404, f"no action {action!r}: the actions are {', '.join(ACTIONS)}")
            asked_at = time.time()
            if action == "stop":
                now, drain = (_boolean(query.get(flag, "false"), flag) for flag in ("now", "drain"))
                if now and drain:
                    raise Refused(400, "now and drain exclude each other: a drain stops at a batch boundary")
                if drain:
                    return 200, self._operation(api.supervisor.drain(name), "drain", asked_at)
                return 200, self._operation(api.supervisor.stop(name, now=now), action, asked_at)
            if action == "restart":
                fresh = _boolean(query.get("fresh", "false"), "fresh")
                return 200, self._operation(api.supervisor.restart(name, fresh=fresh), action, asked_at)
            if action in ("pause", "resume"):
                return 200, self._operation(getattr(api.supervisor, action)(name), action, asked_at)
            if action == "upgrade":
                file = self._json_body().get("file")
                if not isinstance(file, str) or not file:
                    raise Refused(400, "give the new file as \"file\": a path on the server's machine")
                return 200, self._operation(api.supervisor.upgrade(name, file), action, asked_at)
            if action == "rescale":
                partitions = self._json_body().get("partitions")
                if not isinstance(partitions, int) or isinstance(partitions, bool) or not (
                        1 <= partitions <= MAX_PARTITIONS):
                    raise Refused(400, f"give the number of state partitions as \"partitions\": a whole number "
                                       f"from 1 to {MAX_PARTITIONS}")
                return 200, self._operation(api.supervisor.rescale(name, partitions), action, asked_at)
            api.supervisor.remove(name)
            return 200, {"removed": name}
        raise Refused(404, f"no {method} {url.path}: see /api/openapi.json")

    def _operation(self, entry: Entry, action: str, asked_at: float) -> dict[str, Any]:
        """The pipeline, with the operation its request began (``GET /api/operations/{id}`` follows it)."""
        operation = self.api.supervisor.operations.begin(entry.name, action, asked_at)
        return {**entry.public(), "operation": operation.public()}

    def _state(self, path: str, query: dict[str, str]) -> tuple[int, Any] | None:
        """The answer of a GET on a pipeline's queryable state, or None for another path."""
        supervisor = self.api.supervisor
        if match := STATE.match(path):
            return 200, views.views(supervisor.existing(match.group(1)))
        min_batch = _integer(query["min_batch"], "min_batch", 0, MAX_BATCH) if "min_batch" in query else None
        wait_s = _number(query.get("timeout", str(views.DEFAULT_WAIT_S)), "timeout", 0.0, views.MAX_WAIT_S)
        if match := STATE_KEY.match(path):
            name, view, key = match.group(1), unquote(match.group(2)), unquote(match.group(3))
            return views.lookup(supervisor.existing(name), view, key, min_batch, wait_s)
        if match := STATE_VIEW.match(path):
            limit = _integer(query.get("limit", str(views.DEFAULT_LIMIT)), "limit", 1, views.MAX_LIMIT)
            return 200, views.scan(supervisor.existing(match.group(1)), unquote(match.group(2)),
                                   query.get("prefix", ""), query.get("cursor"), limit, min_batch, wait_s)
        if match := CHANGES.match(path):
            after = _integer(query.get("after", self.headers.get("Last-Event-ID") or "0"), "after", 0, MAX_BATCH)
            until = _integer(query["until"], "until", 0, MAX_BATCH) if "until" in query else None
            entry = supervisor.existing(match.group(1))
            return 200, views.changes(entry, unquote(match.group(2)), after, until)
        return None

    def _check_origin(self) -> None:
        """A browser says which page a POST comes from: only the server's own pages may make one."""
        origin = self.headers.get("Origin")
        if origin is not None and urlsplit(origin).netloc.lower() not in self.api.hosts:
            raise Refused(403, f"a POST from another site ({origin}) is refused")

    def _check_token(self) -> None:
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.api.token}".encode()):
            raise Refused(401, "this call needs the server's token: Authorization: Bearer <token> (it is in "
                               "<state dir>/server.token)")

    def _json_body(self) -> dict[str, Any]:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise Refused(400, "Content-Length is not a number") from None
        if length > MAX_BODY:
            raise Refused(413, f"the body is {length} bytes, more than {MAX_BODY}")
        if length < 0:
            raise Refused(400, f"Content-Length must not be negative, got {length}")
        try:
            body = json.loads(self._read_body(length) or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise Refused(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object")
        return body

    def _read_body(self, length: int) -> bytes:
        """The body's ``length`` bytes; refused when it stops short (the client closed, or sent nothing
        more for ``BODY_TIMEOUT_S``), and the connection is closed after the answer."""
        data = b""
        self.connection.settimeout(BODY_TIMEOUT_S)
        try:
            while len(data) < length:
                chunk = self.rfile.read1(length - len(data))
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
        finally:
            self.connection.settimeout(None)
        if len(data) < length:
            self.close_connection = True
            raise Refused(400, f"the body ended after {len(data)} of the {length} bytes its Content-Length gives "
                               f"(nothing more came for {BODY_TIMEOUT_S:g} s); send the whole body")
        return data

    def _send(self, status: int, body: Any) -> None:
        if isinstance(body, Iterator):
            self._send_events(body)
            return
        if isinstance(body, UiFile):
            data, content_type = body.data, f"{body.content_type}; charset=utf-8"
        else:
            data = (body if isinstance(body, str) else json.dumps(body, indent=1)).encode()
            content_type = "text/plain; charset=utf-8" if isinstance(body, str) else "application/json"
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", content_type)
        if isinstance(body, UiFile):
            self.send_header("Content-Security-Policy", UI_POLICY)
            self.send_header("Cache-Control", "no-cache")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(data)


    def _send_events(self, events: Iterator[str]) -> None:
        """Server-sent events, written as they come, until they end or the client leaves."""
        self.send_response(200, "OK")
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(event.encode())
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left
        finally:
            close = getattr(events, "close", None)
            if close is not None:
                close()


class UiFile:
    def __init__(self, data: bytes, content_type: str) -> None:
        self.data, self.content_type = data, content_type


def _ui_file(path: str) -> UiFile:
    name, content_type = UI_FILES[path]
    return UiFile(resources.files("headrace.server").joinpath("ui", name).read_bytes(), content_type)


def _integer(text: str, name: str, low: int, high: int) -> int:
    if not re.fullmatch(r"\d{1,13}", text) or not low <= int(text) <= high:
        raise Refused(400, f"{name} must be a whole number from {low} to {high}, got {text!r}")
    return int(text)


def _number(text: str, name: str, low: float, high: float) -> float:
    if not re.fullmatch(r"\d{1,6}(\.\d{1,6})?", text) or not low <= float(text) <= high:
        raise Refused(400, f"{name} must be a number from {low:g} to {high:g}, got {text!r}")
    return float(text)


def _boolean(text: str, name: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise Refused(400, f"{name} must be true or false, got {text!r}")
    return text.lower() in ("true", "1")


def serve(api: Api) -> ThreadingHTTPServer:
    """The HTTP server for ``api``, bound and ready (``serve_forever`` runs it)."""
    handler = type("BoundHandler", (Handler,), {"api": api})
    server = ThreadingHTTPServer((api.host, api.port), handler)
    server.daemon_threads = True
    return server
