"""``headrace server``: the registry, the supervisor and the HTTP API, started together.

The server keeps everything under its state dir: ``server.sqlite`` (the registry),
``server.token`` (mode 0600, made once and kept, so that clients keep working across restarts),
``server.json`` (its URL, where the CLI finds it) and ``pipelines/<name>/`` (each pipeline's
checkpoint, lease and driver log).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from collections.abc import Callable

from headrace.server.http_api import Api, serve
from headrace.server.operations import Operations
from headrace.server.registry import Registry
from headrace.server.supervisor import Supervisor

DEFAULT_PORT = 8790
TOKEN_FILE, ADDRESS_FILE = "server.token", "server.json"


def token(state_dir: str) -> str:
    """The server's token: read from ``server.token``, or made and written there (mode 0600)."""
    path = os.path.join(state_dir, TOKEN_FILE)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as kept:
            return kept.read().strip()
    made = secrets.token_urlsafe(24)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(made)
    return made


def run_server(state_dir: str, host: str, port: int, allowed: list[str], standby: bool,
               say: Callable[[str], None] = print) -> None:
    """Serve until SIGTERM or Ctrl-C. The drivers go on running when the server ends. ``standby``:
    keep a warm standby driver ready (``headrace/server/standby_pool.py``)."""
    os.makedirs(state_dir, exist_ok=True)
    database = os.path.join(state_dir, "server.sqlite")
    supervisor = Supervisor(Registry(database), Operations(database), state_dir, allowed, standby=standby)
    api = Api(supervisor, token(state_dir), host, port)
    http = serve(api)
    port = http.server_address[1]
    api.bound(port)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    with open(os.path.join(state_dir, ADDRESS_FILE + ".tmp"), "w", encoding="utf-8") as out:
        json.dump({"url": url, "pid": os.getpid()}, out)
    os.replace(os.path.join(state_dir, ADDRESS_FILE + ".tmp"), os.path.join(state_dir, ADDRESS_FILE))
    supervisor.start()
    say(f"headrace server on {url}/?token={api.token}")
    say(f"  token in {os.path.join(state_dir, TOKEN_FILE)}; pipelines under {os.path.join(state_dir, 'pipelines')}")
    say(f"  runs pipeline files from: {', '.join(supervisor.allowed)}")
    if not standby:
        say("  no warm standby driver (--no-standby): a restart starts a new driver")
    done = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda _number, _frame: done.set())
    serving = threading.Thread(target=http.serve_forever, name="headrace-http", daemon=True)
    serving.start()
    done.wait()
    http.shutdown()
    supervisor.close()
    say("headrace server stopped; its pipelines go on running (headrace server picks them up again)")
