"""What a server pipeline runs with, for ``GET /api/pipelines/{name}/config`` and the web UI's
configuration tab: its file, name, status and restart strategy, and from the plan its driver
recorded beside its checkpoint when it started its query (``plan.json``,
``headrace/runtime/compatibility.py``) its trigger, its guarantee and each source's and sink's
connector settings (their ``describe()``). Never a secret: the settings go through ``redact``.
"""

from __future__ import annotations

import re
from typing import Any

from headrace.durations import describe_millis
from headrace.environment.checkpoints import read_plan
from headrace.runtime.restarts import MAX_BACKOFF_S, RestartPolicy
from headrace.server.pipeline_dirs import pipeline_roots
from headrace.server.registry import Entry

REDACTED = "***"
_SECRET_WORDS = r"password|passwd|passphrase|pwd|secret|token|credential|api_?key|access_?key|private_?key"
SECRET_KEY = re.compile(rf"{_SECRET_WORDS}|jaas|authorization", re.IGNORECASE)  # a setting whose value is one
URL_PASSWORD = re.compile(r"(?P<user>\b[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@/\s]*@")  # scheme://user:secret@
SECRET_SETTING = re.compile(rf"(?P<name>[\w.-]*(?:{_SECRET_WORDS})[\w.-]*)\s*=\s*(\"[^\"]*\"|'[^']*'|[^\s&;,]+)",
                            re.IGNORECASE)  # password=secret in a DSN, a query string, a JAAS line


def redact(value: Any) -> Any:
    """``value`` (JSON: nested settings) with every secret as ``***``: the value of a key that names
    one (password, secret, token, ...), a URL's password, a ``password=...`` setting in text.

    >>> redact("postgresql://user:secret@host/db")
    'postgresql://user:***@host/db'
    >>> redact("host=db user=app password=secret dbname=shop")
    'host=db user=app password=*** dbname=shop'
    >>> redact({"url": "amqp://guest:guest@rabbit:5672/", "api_token": "t0k", "key": ["id"], "port": 5672})
    {'url': 'amqp://guest:***@rabbit:5672/', 'api_token': '***', 'key': ['id'], 'port': 5672}
    >>> redact(['PlainLoginModule required username="app" password="s3cret";', "http://host:8080/x?token=abc&a=1"])
    ['PlainLoginModule required username="app" password=***;', 'http://host:8080/x?token=***&a=1']
    """
    if isinstance(value, dict):
        return {key: REDACTED if SECRET_KEY.search(str(key)) and value[key] is not None else redact(value[key])
                for key in value}
    if isinstance(value, list):
        return [redact(item) for item in value]
    if isinstance(value, str):
        return SECRET_SETTING.sub(rf"\g<name>={REDACTED}", URL_PASSWORD.sub(rf"\g<user>:{REDACTED}@", value))
    return value


def configuration(entry: Entry, policy: RestartPolicy) -> dict[str, Any]:
    """The pipeline's configuration; its trigger, guarantee, sources and sinks once a driver has
    recorded its plan (``plan_recorded``), else None and empty."""
    plan = next((found for root in pipeline_roots(entry) if (found := read_plan(root)) is not None), None)
    nodes = plan.get("nodes", []) if plan else []
    return {
        "pipeline": entry.name, "name_in_file": plan.get("pipeline") if plan else None, "file": entry.file,
        "status": entry.status, "state_dir": entry.state_dir, "restart_strategy": restart_strategy(policy),
        "plan_recorded": plan is not None, "trigger": plan.get("trigger") if plan else None,
        "trigger_interval": plan.get("trigger_interval") if plan else None,
        "guarantee": plan.get("guarantee") if plan else None,
        "sources": [_connector(node) for node in nodes if node.get("kind") == "source"],
        "sinks": [_connector(node) for node in nodes if node.get("kind") == "sink"],
    }


def restart_strategy(policy: RestartPolicy) -> dict[str, Any]:
    """The strategy the server restarts the pipeline's driver under, with a line saying it.

    >>> restart_strategy(RestartPolicy(attempts=3, window_s=600, backoff_s=1))["description"]
    '3 restarts within 10m, waiting 1s, then twice as long for each restart in the window (at most 60 s)'
    """
    return {"attempts": policy.attempts, "window_s": policy.window_s, "backoff_s": policy.backoff_s,
            "description": f"{policy.describe()}, waiting {describe_millis(int(policy.backoff_s * 1000))}, then "
                           f"twice as long for each restart in the window (at most {MAX_BACKOFF_S:g} s)"}


def _connector(node: dict[str, Any]) -> dict[str, Any]:
    described = dict(node.get("connector") or {})
    kind = described.pop("type", None)
    return {"name": node.get("name"), "type": kind, "defined_at": node.get("defined_at"),
            "guarantee": node.get("guarantee"), "settings": redact(described)}
