"""The state-scaling benchmark (``benchmarks/state_scaling.py --quick``) runs end to end and ends
with its ratio line.

This checks that the benchmark works, not that headrace meets its target: on small sizes and
a shared machine the figures mean little (docs/performance.md, "State scaling", has the real ones).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parent.parent / "benchmarks" / "state_scaling.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("state_scaling_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_quick_state_scaling_benchmark_ends_with_the_ratio_line(spark, capsys):
    benchmark = load_benchmark()
    assert benchmark.main(["--quick"]) == 0  # uses the session of the `spark` fixture: get_session() returns it
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"state-scaling ratio=\d+\.\d\d", lines[-1]), lines[-1]
    assert re.fullmatch(r"target >= 0\.8: (met|MISSED)", lines[-2]), lines[-2]
    for kind in benchmark.KINDS:  # each step kind's own ratio is printed above
        assert any(re.match(rf"{kind} ratio \(2,000 / 100 keys held\) = \d+\.\d\d", line) for line in lines), kind
