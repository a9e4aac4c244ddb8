"""Operator state, one version per streaming window, beside the pipeline's checkpoint.

``<checkpoint>/operators/<operator>/<window id>.json`` holds every instance's state after that
window. Window ``n`` always starts from the newest version before ``n``, so a replayed window
(a crash after it wrote its state but before Spark committed the batch) recomputes the same
state and output from the same start, and writes the same version again. Versions older than
``KEEP`` windows are deleted.
"""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

from headrace.environment import storage

KEEP = 3
SUFFIX = ".json"


class OperatorStateStore:
    def __init__(self, checkpoint: str, operator: str) -> None:
        self.folder = storage.join(checkpoint, "operators", quote(operator, safe=""))
        self.operator = operator

    def versions(self) -> list[int]:
        try:
            names = storage.list_names(self.folder)
        except FileNotFoundError:
            return []
        return sorted(int(n[: -len(SUFFIX)]) for n in names if n.endswith(SUFFIX) and n[: -len(SUFFIX)].isdigit())

    def load_before(self, window: int, partitions: int) -> dict[int, bytes]:
        """Each instance's state after the newest window before ``window`` (none: a first run)."""
        older = [v for v in self.versions() if v < window]
        if not older:
            return {}
        saved = json.loads(storage.read_text(storage.join(self.folder, f"{older[-1]}{SUFFIX}")))
        if saved["partitions"] != partitions:
            raise ValueError(f"operator {self.operator!r} has {partitions} partitions, but its state in the "
                             f"checkpoint was saved by {saved['partitions']}: instances own their state, so "
                             "the number of partitions cannot change on restart; keep it, or start afresh "
                             "with a new state directory")
        return {int(i): base64.b64decode(b) for i, b in saved["instances"].items()}

    def save(self, window: int, partitions: int, states: dict[int, bytes]) -> None:
        text = json.dumps({"window": window, "partitions": partitions,
                           "instances": {str(i): base64.b64encode(b).decode() for i, b in sorted(states.items())}})
        storage.write_text(storage.join(self.folder, f"{window}{SUFFIX}"), text)
        for old in self.versions():
            if old <= window - KEEP:
                storage.delete_tree(storage.join(self.folder, f"{old}{SUFFIX}"))
