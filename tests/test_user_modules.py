"""The user's own modules reach Spark's Python workers (headrace/environment/user_modules.py): a
script run from another directory whose steps live in a module beside it, a test kit run whose
steps call a helper package, and the rule that decides what travels by value."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from headrace.environment import user_modules
from headrace.environment.user_modules import importable_on_workers, is_users, ship_user_modules

ROOT = Path(__file__).resolve().parent.parent
ROWS = [{"key": "ab"[i % 2], "v": i} for i in range(12)]

STEPS = """\
import headrace as hr
from helpers.arith import twice

def double(record):
    return {"key": record["key"], "v": twice(record["v"])}

class RunningTotal(hr.KeyedProcessFunction):
    total = hr.ValueState(default=0)

    def process(self, record, ctx):
        self.total.set(self.total.get() + record["v"])
        ctx.emit({"key": ctx.key, "total": self.total.get()})
"""

MAIN = """\
import json
import sys

import headrace as hr
from mysteps import RunningTotal, double

out, state, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
p = hr.Pipeline("user_modules")
(p.source("numbers", hr.testing.TestSource([rows[:6], rows[6:]], schema={"key": "string", "v": "long"}))
  .map(double, schema={"key": "string", "v": "long"})
  .key_by("key")
  .process(RunningTotal(), schema={"key": "string", "total": "long"})
  .sink("out", hr.sinks.Files(out, format="jsonl")))
p.run(state_dir=state, progress="quiet")
"""


def write_app(folder: Path, steps_module: str = "mysteps", helpers: str = "helpers") -> None:
    """``main.py`` importing ``steps_module`` beside it, which imports the package ``helpers``."""
    (folder / helpers).mkdir(parents=True)
    (folder / helpers / "__init__.py").write_text("")
    (folder / helpers / "arith.py").write_text("def twice(n):\n    return 2 * n\n")
    (folder / f"{steps_module}.py").write_text(STEPS.replace("helpers.arith", f"{helpers}.arith"))
    (folder / "main.py").write_text(MAIN)


def running_totals(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """Plain Python: each record's key and the running total of its key's doubled values."""
    totals: dict[str, int] = {}
    out = []
    for row in rows:
        totals[row["key"]] = totals.get(row["key"], 0) + 2 * row["v"]
        out.append((row["key"], totals[row["key"]]))
    return sorted(out)


def test_a_script_run_from_another_directory_ships_the_modules_beside_it(tmp_path):
    """``python app/main.py`` from another directory: its steps, a map function and a
    KeyedProcessFunction, live in ``app/mysteps.py``, which calls a package of ``app/``."""
    from headrace.connectors.files_sink import read_rows

    write_app(tmp_path / "app")
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(Path("..") / "app" / "main.py"), str(out), str(tmp_path / "state"),
                           json.dumps(ROWS)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted((r["key"], r["total"]) for r in read_rows(str(out), "jsonl")) == running_totals(ROWS)


def test_the_test_kit_ships_a_helper_package_its_steps_call(spark, tmp_path, monkeypatch):
    """run_to_completion with steps from a module outside the workers' path, which call a package
    of their own folder (not a step's module: only the steps' modules used to travel)."""
    import headrace as hr
    from headrace.testing import TestSink, TestSource, run_to_completion

    tag = uuid.uuid4().hex[:8]
    write_app(tmp_path, steps_module=f"kit_steps_{tag}", helpers=f"kit_helpers_{tag}")
    monkeypatch.syspath_prepend(str(tmp_path))
    steps = importlib.import_module(f"kit_steps_{tag}")
    p = hr.Pipeline("kit_user_modules")
    out = TestSink()
    (p.source("numbers", TestSource([ROWS[:6], ROWS[6:]], schema={"key": "string", "v": "long"}))
     .map(steps.double, schema={"key": "string", "v": "long"}).key_by("key")
     .process(steps.RunningTotal(), schema={"key": "string", "total": "long"}).sink("out", out))
    run_to_completion(p)
    assert sorted((r["key"], r["total"]) for r in out.rows()) == running_totals(ROWS)


# -- what travels (no JVM) -----------------------------------------------------------------------

def a_module_in(folder: Path, source: str) -> Any:
    """A new module of ``source`` imported from ``folder`` (on the driver's path only)."""
    name = f"own_{uuid.uuid4().hex[:10]}"
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder))


def local_session(python: str = sys.executable) -> Any:
    """What ship_user_modules reads of a Spark session of a local master."""
    return SimpleNamespace(sparkContext=SimpleNamespace(master="local[2]", pythonExec=python))


@pytest.mark.fast
def test_a_module_the_workers_cannot_import_is_pickled_by_value(tmp_path, monkeypatch):
    """A module beside the script, on the driver's path only: after ship_user_modules, its function
    unpickles in a Python that cannot import it (as Spark's worker does)."""
    from pyspark import cloudpickle

    module = a_module_in(tmp_path, "def greet(name):\n    return 'hello ' + name\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(user_modules, "jvm_directory", lambda: str(elsewhere))
    assert module.__name__ in ship_user_modules(local_session())
    load = "import sys, pickle; print(pickle.loads(sys.stdin.buffer.read())('ada'))"
    done = subprocess.run([sys.executable, "-c", load], input=cloudpickle.dumps(module.greet), cwd=elsewhere,
                          capture_output=True, timeout=60)
    assert done.stdout.decode().strip() == "hello ada", done.stderr.decode()[-2000:]


@pytest.mark.fast
def test_a_module_the_workers_import_from_the_same_file_stays_pickled_by_reference(tmp_path):
    """Workers started in the module's folder find it there: it is not shipped. Started elsewhere,
    or finding another file of that name, they cannot import it: it is."""
    module = a_module_in(tmp_path, "VALUE = 1\n")
    name, elsewhere = module.__name__, tmp_path / "elsewhere"
    elsewhere.mkdir()
    modules = {name: module}
    assert importable_on_workers(modules, sys.executable, str(tmp_path)) == {name}
    assert importable_on_workers(modules, sys.executable, str(elsewhere)) == set()
    (elsewhere / f"{name}.py").write_text("VALUE = 2\n")  # a namesake the workers would import instead
    other = elsewhere / "other"
    other.mkdir()
    (other / f"{name}.py").write_text("VALUE = 2\n")
    assert importable_on_workers(modules, sys.executable, str(other)) == set()


@pytest.mark.fast
def test_only_the_users_own_modules_are_candidates(tmp_path):
    """Neither the standard library's, an installed package's, headrace's nor pyspark's modules
    travel; a module of the user's own folder, a package of it and a namespace package do."""
    import json as standard

    import pyspark

    import headrace

    assert not is_users("json", user_modules.location(standard))
    assert not is_users("headrace", user_modules.location(headrace))
    assert not is_users("pyspark", user_modules.location(pyspark))
    assert not is_users("yaml", ("/venv/lib/python3.12/site-packages/yaml/__init__.py",))
    assert not is_users("sys", user_modules.location(sys))
    assert not is_users("app.steps", (str(tmp_path / "app" / "steps.py"),))  # its top-level package decides
    assert is_users("mysteps", (str(tmp_path / "mysteps.py"),))
    assert is_users("app", (str(tmp_path / "app"), str(tmp_path / "more" / "app")))
    module = a_module_in(tmp_path, "X = 1\n")
    assert module.__name__ in user_modules.user_modules()
    assert "headrace" not in user_modules.user_modules()
