"""A server in this process (the API over a registry, a supervisor that starts no driver), on a
free port, for tests of what it answers and draws about a pipeline's state dir written by the test."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from headrace.runtime.restarts import RestartPolicy
from headrace.server.http_api import Api, serve
from headrace.server.operations import Operations
from headrace.server.registry import STOPPED, Entry, Registry
from headrace.server.supervisor import Supervisor

TOKEN = "token"


class Server:
    """A server (the API, a supervisor that starts no driver) in this process, on a free port."""

    def __init__(self, folder: Path) -> None:
        database = str(folder / "server.sqlite")
        self.registry = Registry(database)
        supervisor = Supervisor(self.registry, Operations(database), str(folder), [str(folder)],
                                policy=lambda: RestartPolicy(attempts=2, window_s=60, backoff_s=0.5))
        api = Api(supervisor, TOKEN, "127.0.0.1", 0)
        self.http = serve(api)
        api.bound(self.http.server_address[1])
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def pipeline(self, name: str, folder: Path) -> Path:
        """A stopped pipeline whose state dir is ``folder``; its root (checkpoint and plan record)."""
        self.registry.put(Entry(name, str(folder / f"{name}.py"), str(folder), STOPPED, False))
        return folder / name

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read())

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()
