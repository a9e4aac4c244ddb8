"""The server's REST API from Python, as the CLI's pipeline commands call it: the server found
through ``--server`` / ``HEADRACE_SERVER`` or the state dir's ``server.json``, with the token from
``--token`` / ``HEADRACE_TOKEN`` or the state dir's ``server.token``.

    from headrace.server.client import Client
    server = Client.find()
    server.query("word_counts", "totals", "hello")        # one key's row, with its batch
    for change in server.changes("word_counts", "totals"):  # each batch's changed rows
        ...
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlencode

from headrace import config
from headrace.errors import HeadraceError
from headrace.server.service import ADDRESS_FILE, TOKEN_FILE

WAIT_TIMEOUT_S, WAIT_POLL_S = 600.0, 0.25


class ServerError(HeadraceError):
    """The server could not be reached, or refused the request; the message says which and why."""


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    @classmethod
    def find(cls, state_dir: str | None = None, url: str | None = None, token: str | None = None) -> Client:
        state_dir = state_dir or config.STATE_DIR.get()
        url = url or os.environ.get("HEADRACE_SERVER") or _read_json(os.path.join(state_dir, ADDRESS_FILE)).get("url")
        if not url:
            raise ServerError(f"no server found: start one with `headrace server` (it writes "
                              f"{os.path.join(state_dir, ADDRESS_FILE)}), or give --server URL")
        token = token or os.environ.get("HEADRACE_TOKEN") or _read_text(os.path.join(state_dir, TOKEN_FILE))
        return cls(url, token)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=180) as answer:
                text = answer.read().decode()
                return json.loads(text) if answer.headers.get_content_type() == "application/json" else text
        except urllib.error.HTTPError as refused:
            raise ServerError(f"the server refused it ({refused.code}): {_reason(refused)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"no server answers at {self.url} ({getattr(exc, 'reason', exc)}); is `headrace "
                              "server` running?") from None

    def wait_for(self, operation: str, timeout: float = WAIT_TIMEOUT_S) -> dict[str, Any]:
        """The operation ``operation`` once it has ended (done or failed)."""
        deadline = time.monotonic() + timeout
        while True:
            answer = dict(self.call("GET", f"/api/operations/{quote(operation, safe='')}"))
            if answer["status"] != "running":
                return answer
            if time.monotonic() > deadline:
                raise ServerError(f"operation {operation} ({answer['action']} of {answer['pipeline']}) has not ended "
                                  f"after {timeout:g} s; it waits {answer['detail']}")
            time.sleep(WAIT_POLL_S)

    def pipeline(self, name: str) -> str:
        return f"/api/pipelines/{quote(name, safe='')}"

    def query(self, pipeline: str, view: str, key: str | None = None, *, prefix: str = "", cursor: str | None = None,
              limit: int | None = None, min_batch: int | None = None, timeout: float | None = None) -> dict[str, Any]:
        """A view's row of ``key``, or (no key) a page of its rows whose key starts with ``prefix``
        (the answer's ``next_cursor`` gives the next page); every answer holds the ``batch_id`` and
        ``watermark`` it is as of. ``min_batch`` waits up to ``timeout`` seconds for that batch."""
        options = {"prefix": prefix or None, "cursor": cursor, "limit": limit, "min_batch": min_batch,
                   "timeout": timeout}
        if key is not None:
            options = {"min_batch": min_batch, "timeout": timeout}
        query = urlencode({name: value for name, value in options.items() if value is not None})
        path = f"{self.pipeline(pipeline)}/state/{quote(view, safe='')}"
        path += f"/{quote(key, safe='')}" if key is not None else ""
        return dict(self.call("GET", path + (f"?{query}" if query else "")))

    def changes(self, pipeline: str, view: str, *, after: int = 0,
                until: int | None = None) -> Iterator[dict[str, Any]]:
        """Each batch after ``after`` that changes the view: its ``batch_id``, ``watermark`` and the
        ``rows`` it changed (as they are now), until batch ``until`` (None: for as long as you read)."""
        query = urlencode({"after": after, **({"until": until} if until is not None else {})})
        request = urllib.request.Request(f"{self.url}{self.pipeline(pipeline)}/changes/{quote(view, safe='')}?{query}",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            answer = urllib.request.urlopen(request, timeout=180)
        except urllib.error.HTTPError as refused:
            raise ServerError(f"the server refused it ({refused.code}): {_reason(refused)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"no server answers at {self.url} ({getattr(exc, 'reason', exc)})") from None
        with answer:
            for line in answer:
                if line.startswith(b"data: "):
                    yield json.loads(line[len(b"data: "):])


def _reason(refused: urllib.error.HTTPError) -> str:
    detail = refused.read().decode(errors="replace")
    try:
        return str(json.loads(detail)["error"])
    except (ValueError, KeyError, TypeError):
        return detail


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as kept:
            return dict(json.load(kept))
    except (FileNotFoundError, ValueError):
        return {}


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as kept:
            return kept.read().strip()
    except FileNotFoundError:
        return ""
