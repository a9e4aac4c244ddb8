"""scripts/check_imports.py on a copy of the package with one import added: it names an import up
the layers and a private name, and passes the package as it is."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast  # needs no JVM and no service

ROOT = Path(__file__).resolve().parent.parent


def check(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(tree / "scripts" / "check_imports.py")], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check_imports.py", tmp_path / "scripts")
    shutil.copytree(ROOT / "headrace", tmp_path / "headrace", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def add_line(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")


def test_the_package_as_it_is_passes(tree: Path) -> None:
    done = check(tree)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == "0 imports up the layers, 0 cycles through 0 modules, 0 private imports"


def test_an_import_up_the_layers_is_named_even_inside_a_function(tree: Path) -> None:
    add_line(tree / "headrace" / "plan" / "graph.py", "from headrace.runtime import runner")
    done = check(tree)
    assert done.returncode == 1
    assert "up: headrace.plan.graph (line" in done.stdout
    assert "plan) imports headrace.runtime.runner (driver)" in done.stdout


def test_a_private_name_of_another_module_is_named(tree: Path) -> None:
    add_line(tree / "headrace" / "spark" / "writer.py", "from headrace.spark.stages import _private_thing")
    done = check(tree)
    assert done.returncode == 1
    assert "private: headrace.spark.writer (line" in done.stdout
    assert "uses headrace.spark.stages._private_thing" in done.stdout
