"""How long ``headrace validate FILE`` takes to refuse a pipeline file with a mistake, and to
accept the file without it, as a user runs it: a new Python process each time, from its start
to its exit.

    .venv/bin/python benchmarks/validate.py             # 7 runs of each
    .venv/bin/python benchmarks/validate.py --runs 1    # a smoke run

The file is ``examples/flume_netcat.yaml`` (a source, a multiplexing selector, three sinks, a
failover group); the mistake is its source's type spelt ``Sockett``. The refusal must name the
file and the line of the mistake and exit with status 1, the valid file must exit with 0; the
benchmark fails otherwise. Validation never starts Spark (``tests/test_pipeline_files.py``
checks that), so no Spark session is needed here. The closing line is
``validate seconds refused=<median> valid=<median> target=2``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "flume_netcat.yaml"
TARGET_S = 2.0
CLI = "import sys; from headrace.cli import main; sys.exit(main(sys.argv[1:]))"


def with_mistake(folder: Path) -> tuple[Path, int]:
    """The example with its source's type misspelt, and the line of the mistake."""
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    number = next(n for n, line in enumerate(lines, 1) if line.strip().startswith("type: Socket"))
    lines[number - 1] = lines[number - 1].replace("type: Socket", "type: Sockett")
    path = folder / "bad.yaml"
    path.write_text("".join(lines))
    return path, number


def validate(path: Path) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds and CPU seconds of one ``headrace validate path`` in a new process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", CLI, "validate", str(path)], capture_output=True, text=True,
                            cwd=path.parent, timeout=120)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each file (default 7)")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="headrace-validate-"))
    try:
        bad, line = with_mistake(folder)
        good = folder / "good.yaml"
        shutil.copy(EXAMPLE, good)
        print(f"headrace validate, {os.cpu_count()} cores; the mistake is on line {line} of bad.yaml", flush=True)
        walls: dict[str, list[float]] = {"refused": [], "valid": []}
        refusal = ""
        for number in range(args.runs):
            for name, path, status in (("refused", bad, 1), ("valid", good, 0)):
                wall, cpu, result = validate(path)
                if result.returncode != status:
                    raise RuntimeError(f"{name}: exit status {result.returncode}, not {status}: {result.stderr}")
                if name == "refused":
                    refusal = result.stderr.strip()
                    if f"bad.yaml:{line}:" not in refusal:
                        raise RuntimeError(f"the refusal does not name bad.yaml:{line}: {refusal}")
                walls[name].append(wall)
                print(f"  run {number + 1}  {name:8} {wall:5.2f} s wall  {cpu:5.2f} s CPU  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"refused with: {refusal}", flush=True)
        medians = {name: statistics.median(values) for name, values in walls.items()}
        for name, values in walls.items():
            verdict = "met" if max(values) < TARGET_S else "MISSED"
            print(f"  {name:8} median {medians[name]:.2f} s, max {max(values):.2f} s: target < {TARGET_S:g} s: "
                  f"{verdict}", flush=True)
        print(f"validate seconds refused={medians['refused']:.2f} valid={medians['valid']:.2f} "
              f"target={TARGET_S:g}", flush=True)
        return 0
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
