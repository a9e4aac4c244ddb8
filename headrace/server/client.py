"""What the CLI's pipeline commands call: the server's REST API, found through ``--server`` /
``HEADRACE_SERVER`` or the state dir's ``server.json``, with the token from ``--token`` /
``HEADRACE_TOKEN`` or the state dir's ``server.token``."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

from headrace.errors import HeadraceError
from headrace.server.service import ADDRESS_FILE, TOKEN_FILE


class ServerError(HeadraceError):
    """The server could not be reached, or refused the request; the message says which and why."""


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    @classmethod
    def find(cls, state_dir: str, url: str | None, token: str | None) -> Client:
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
            detail = refused.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]
            except (ValueError, KeyError, TypeError):
                pass
            raise ServerError(f"the server refused it ({refused.code}): {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServerError(f"no server answers at {self.url} ({getattr(exc, 'reason', exc)}); is `headrace "
                              "server` running?") from None

    def pipeline(self, name: str) -> str:
        return f"/api/pipelines/{quote(name, safe='')}"


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
