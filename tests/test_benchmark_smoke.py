"""The benchmarks run end to end (``benchmarks/ysb.py --quick``, ``benchmarks/count_window.py
--quick``, ``benchmarks/word_count.py --quick``, ``benchmarks/validate.py --runs 1``,
``benchmarks/nexmark.py --quick`` on four queries and ``--unbounded`` on two, ``benchmarks/ml.py`` on 5,000 rows,
``benchmarks/upgrade_gap.py --upgrades 1``) and end with their closing lines.

This checks that the benchmark works, not that headrace meets its performance targets: on
small data and a shared machine the figures mean little (docs/performance.md has the real ones).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name: str = "ysb") -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_quick_benchmark_ends_with_the_ratio_line(spark, capsys):
    ysb = load_benchmark()
    assert ysb.main(["--quick"]) == 0  # uses the session of the `spark` fixture: get_session() returns it
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"ysb ratio native=\d+\.\d\d python=\d+\.\d\d", lines[-1]), lines[-1]
    assert any(line.startswith("native (events/s)") for line in lines)
    assert any(line.startswith("p99 (ms)") for line in lines)


def test_the_quick_count_window_benchmark_ends_with_the_ratio_line(spark, capsys):
    benchmark = load_benchmark("count_window")
    assert benchmark.main(["--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"count-window ratio=\d+\.\d\d", lines[-1]), lines[-1]
    expected = benchmark.expected_windows(benchmark.QUICK, benchmark.QUICK.events)
    assert expected > 0
    assert any(re.fullmatch(rf"windows written, each run\s+{expected:,}\s+{expected:,}", line) for line in lines)


def test_the_quick_word_count_benchmark_checks_every_form_and_ends_with_the_ratio_line(spark, capsys):
    benchmark = load_benchmark("word_count")
    assert benchmark.main(["--quick"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith("every form's counts equal Python's on 2,000 lines") for line in lines)
    assert re.fullmatch(r"word-count ratio operator=\d+\.\d\d storm=\d+\.\d\d fluent=\d+\.\d\d "
                        r"sql=\d+\.\d\d", lines[-1]), lines[-1]


@pytest.mark.fast
def test_the_validate_benchmark_checks_the_refusal_names_the_line_and_ends_with_its_line(capsys):
    benchmark = load_benchmark("validate")
    assert benchmark.main(["--runs", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(re.fullmatch(r"refused with: headrace: bad\.yaml:14: source 'netcat': unknown source type 'Sockett' "
                            r"\(did you mean 'Socket'\?\).*", line) for line in lines), lines
    assert re.fullmatch(r"validate seconds refused=\d+\.\d\d valid=\d+\.\d\d target=2", lines[-1]), lines[-1]


def test_the_quick_nexmark_benchmark_is_exact_on_its_queries_and_ends_with_its_line(spark, capsys):
    benchmark = load_benchmark("nexmark")
    assert benchmark.main(["--quick", "--queries", "q0,q1,q2,q11"]) == 0  # q11: session windows in SQL
    lines = capsys.readouterr().out.strip().splitlines()
    for query in ("q0", "q1", "q2", "q11"):
        assert any(re.fullmatch(rf"nexmark {query}: exact=yes ratio=\d+\.\d\d", line) for line in lines), lines
    assert not any("NOT the reference" in line for line in lines), lines  # the hand-written pipelines agree too
    assert re.fullmatch(r"nexmark exact=4/4 min_ratio=\d+\.\d\d median_ratio=\d+\.\d\d", lines[-1]), lines[-1]


def test_the_unbounded_nexmark_benchmark_drains_the_stateless_queries_exactly(spark, capsys):
    """``--unbounded``: headrace's sources unbounded, each run drained, still the reference's rows
    (q10: the partitioned Files sink)."""
    benchmark = load_benchmark("nexmark")
    assert benchmark.main(["--quick", "--unbounded", "--queries", "q0,q10"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    for query in ("q0", "q10"):
        assert any(re.fullmatch(rf"nexmark {query}: exact=yes ratio=\d+\.\d\d", line) for line in lines), lines
    assert re.fullmatch(r"nexmark exact=2/2 min_ratio=\d+\.\d\d median_ratio=\d+\.\d\d", lines[-1]), lines[-1]


@pytest.mark.fast
def test_the_unbounded_nexmark_benchmark_refuses_a_stateful_query(capsys):
    benchmark = load_benchmark("nexmark")
    with pytest.raises(SystemExit) as refused:
        benchmark.main(["--unbounded", "--queries", "q0,q5,q11"])
    assert refused.value.code == 2
    assert ("--unbounded runs the stateless queries (q0, q1, q2, q10, q13, q14, q21, q22), not q5, q11: the "
            "hand-written stateful queries end their windows with a flush row") in capsys.readouterr().err


def test_nexmarks_stateless_queries_are_those_whose_pipelines_keep_no_state(spark, tmp_path):
    from headrace.spark.specs import stateful_steps

    benchmark = load_benchmark("nexmark")
    config = benchmark.EventsConfig()
    keep_none = [name for name, query in benchmark.QUERIES.items() if not stateful_steps(
        benchmark.headrace_pipeline(name, query, str(tmp_path), config, str(tmp_path))[0].plan)]
    assert tuple(keep_none) == benchmark.STATELESS


@pytest.mark.fast
def test_nexmark_samples_a_short_query_until_each_side_has_run_long_enough():
    benchmark = load_benchmark("nexmark")
    enough, most = benchmark.SAMPLED_SECONDS, benchmark.MAX_ROUNDS
    assert benchmark._sample_more(2, 2, {"hand": enough - 0.1, "headrace": enough + 5})  # one side ran too little
    assert not benchmark._sample_more(2, 2, {"hand": enough, "headrace": enough})
    assert not benchmark._sample_more(2, most, {"hand": 1.0, "headrace": 1.0})  # at most MAX_ROUNDS
    assert not benchmark._sample_more(1, 1, {"hand": 1.0, "headrace": 1.0})  # --quick: one round, as asked
    assert not benchmark._sample_more(2, 2, {})  # neither side runs (refused, or both failed)


def test_the_ml_benchmark_scores_both_ways_and_ends_with_its_ratio_line(spark, capsys):
    pytest.importorskip("sklearn", reason="the ml extra: pip install -e '.[ml]'")
    benchmark = load_benchmark("ml")
    assert benchmark.main(["--rows", "5000", "--runs", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"ml ratio=\d+\.\d\d mllib_ratio=\d+\.\d\d", lines[-1]), lines[-1]
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["scikit-learn", "Spark MLlib"]


def test_the_upgrade_gap_benchmark_upgrades_through_the_server_and_ends_with_its_line(capsys):
    benchmark = load_benchmark("upgrade_gap")
    assert benchmark.main(["--upgrades", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"upgrade 1: to v1, \d+\.\d s from the old driver's last commit to the new one's first "
                        r"\(a warm standby driver took it; load average \d+\.\d\)", lines[0]), lines[0]
    assert re.fullmatch(r"upgrade upgrades=1 median_gap_s=\d+\.\d max_gap_s=\d+\.\d verify=ok", lines[-1]), lines[-1]
