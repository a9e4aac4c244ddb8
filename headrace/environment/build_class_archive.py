"""Write the JVM class archive (``headrace/environment/class_archive.py``) of this installation
ahead of a first run, so that every driver, the first ones too, starts from it.

    python -m headrace.environment.build_class_archive

Does nothing when the archive exists or is switched off (``HEADRACE_JVM_CLASS_ARCHIVE=0``);
otherwise runs a small pipeline with ``headrace run``, whose driver, having found no archive,
writes it as it exits. Quiet; about 30 s. ``scripts/setup.sh`` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from headrace import config
from headrace.environment.class_archive import class_archive_path
from headrace.environment.session import check_java

# A small pipeline run as a user runs one: a Python source and step, a keyed window on headrace's
# window processor (Spark's transformWithStateInPandas on RocksDB), the late records and two file
# sinks, so that the archive holds what a pipeline's driver loads.
PIPELINE = """
import os

import headrace as hr
from headrace.testing import TestSource, Watermark

readings = TestSource([[{"sensor": "a", "value": 1, "ts": 1_000}, {"sensor": "b", "value": 2, "ts": 2_000}],
                       Watermark(20_000), [{"sensor": "a", "value": 3, "ts": 3_000}]],
                      schema={"sensor": "string", "value": "long", "ts": "timestamp"})
p = hr.Pipeline("class_archive")
doubled = p.source("readings", readings, event_time="ts").map(
    lambda r: {**r, "value": 2 * r["value"]}, schema={"sensor": "string", "value": "long", "ts": "timestamp"})
sums = (doubled.key_by("sensor").window(hr.Tumbling("10s"), trigger=hr.AfterWatermark(early=hr.EveryN(1)))
        .aggregate(total=hr.sum("value")))
sums.sink("panes", hr.sinks.Files(os.path.join(os.environ["HR_ARCHIVE_RUN"], "panes"), format="jsonl"))
sums.late_records().sink("late", hr.sinks.Files(os.path.join(os.environ["HR_ARCHIVE_RUN"], "late"), format="jsonl"))
"""


def _run_a_pipeline() -> subprocess.CompletedProcess[str]:
    """``headrace run`` of ``PIPELINE``; its driver, the first without an archive, writes it as it exits."""
    with tempfile.TemporaryDirectory(prefix="headrace-archive-") as folder:
        script = os.path.join(folder, "class_archive.py")
        with open(script, "w") as handle:
            handle.write(PIPELINE)
        return subprocess.run([sys.executable, "-m", "headrace.cli", "run", script, "--quiet", "--state-dir",
                               os.path.join(folder, "state")], cwd=folder, capture_output=True, text=True,
                              env={**os.environ, "HR_ARCHIVE_RUN": folder}, timeout=600)


def main() -> int:
    try:
        java_banner = check_java()
    except Exception as exc:  # noqa: BLE001 - setup reports a missing Java itself
        print(f"no class archive: {exc}", file=sys.stderr)
        return 0
    archive = class_archive_path(java_banner)
    if not config.JVM_CLASS_ARCHIVE.flag() or os.path.exists(archive):
        return 0
    run = _run_a_pipeline()
    if run.returncode != 0 or not os.path.exists(archive):
        print(f"headrace: no JVM class archive was written (Spark's drivers will start without it): "
              f"{(run.stderr.strip().splitlines() or ['no error shown'])[-1]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
