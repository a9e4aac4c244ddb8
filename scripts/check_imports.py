"""Checks headrace's imports: none up the layers, no cycles between its modules, no private name
from another module.

Reads ``headrace/**/*.py`` with ``ast`` (nothing is imported) and counts every import of a
headrace module, at module level, inside a function or under ``if TYPE_CHECKING:`` (an import
moved there to dodge a cycle is still a cycle between the two modules' layers).
``from package import name`` imports the submodule ``package.name`` when there is one,
otherwise ``package`` itself.

A private name is one with a leading underscore (not a dunder) imported from another module
(``from headrace.x import _name``) or read off an imported module (``x._name``).

The layers, lowest first, are ``LAYERS`` (the README's "Where the code is" draws them): a
module may import from its own layer and the ones before it, never from a later one.

Prints each import up the layers, each cycle (the shortest through each import that closes one)
and each private import; exits 1 if there is any.

    python scripts/check_imports.py
"""

from __future__ import annotations

import ast
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "headrace"
# (layer, the modules and packages in it), lowest first; "headrace" is the package's __init__ only.
LAYERS = (
    ("vocabulary", ("headrace.schema", "headrace.errors", "headrace.durations", "headrace.config", "headrace.expr",
                    "headrace.code_locations", "headrace.lazy_modules", "headrace.json_kinds")),
    ("public shapes", ("headrace.windows", "headrace.triggers", "headrace.state", "headrace.process",
                       "headrace.aggregates", "headrace.groupings", "headrace.apex_operators", "headrace.sink_step",
                       "headrace.storm_joins")),
    ("connector contract", ("headrace.contract",)),
    ("plan", ("headrace.plan",)),
    ("engine", ("headrace.engine", "headrace.storm", "headrace.ml")),
    ("environment", ("headrace.environment",)),
    ("connectors", ("headrace.connectors", "headrace.sources", "headrace.sinks")),
    ("compiler", ("headrace.spark",)),
    ("driver", ("headrace.runtime",)),
    ("front doors", ("headrace.api", "headrace")),
    ("server", ("headrace.server",)),
    ("top", ("headrace.cli", "headrace.demo", "headrace.scaffold", "headrace.testing", "headrace.standby")),
)


def layer_of(module: str) -> int:
    """The place in ``LAYERS`` of ``module``."""
    for place, (_, members) in enumerate(LAYERS):
        if any(module == m or (m != PACKAGE and module.startswith(m + ".")) for m in members):
            return place
    raise SystemExit(f"{module} is in no layer: add it to LAYERS in scripts/check_imports.py")


def module_names(root: Path) -> dict[str, Path]:
    """``{"headrace.spark.compiler": path}`` for every module of the package."""
    modules = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class ModuleImports:
    """The headrace modules one module imports, and the private names it takes from others."""

    def __init__(self, name: str, path: Path, modules: dict[str, Path]) -> None:
        self.name, self.modules = name, modules
        self.package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        self.imports: dict[str, int] = {}  # imported module -> first line
        self.private: list[tuple[int, str, str]] = []  # (line, module, name)
        module_aliases: dict[str, str] = {}  # local name -> headrace module
        nodes = list(ast.walk(ast.parse(path.read_text(), str(path))))
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if self.is_ours(alias.name):
                        self.add(alias.name, node.lineno)
                        if alias.asname:
                            module_aliases[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = self.resolve(node)
                if not self.is_ours(source):
                    continue
                for alias in node.names:
                    submodule = f"{source}.{alias.name}"
                    if submodule in modules:
                        self.add(submodule, node.lineno)
                        module_aliases[alias.asname or alias.name] = submodule
                    else:
                        self.add(source, node.lineno)
                    if is_private(alias.name) and source != name:
                        self.private.append((node.lineno, source, alias.name))
        for node in nodes:
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in module_aliases and is_private(node.attr)):
                self.private.append((node.lineno, module_aliases[node.value.id], node.attr))

    @staticmethod
    def is_ours(module: str) -> bool:
        return module == PACKAGE or module.startswith(PACKAGE + ".")

    def resolve(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.package.split(".")
        base = base[: len(base) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))

    def add(self, module: str, line: int) -> None:
        while module not in self.modules and "." in module:  # ``import a.b.name`` of a non-module
            module = module.rpartition(".")[0]
        if module != self.name and module in self.modules:
            self.imports.setdefault(module, line)


def shortest_path(graph: dict[str, dict[str, int]], start: str, goal: str) -> list[str] | None:
    """The shortest chain of imports from ``start`` to ``goal``, both included."""
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        if current == goal:
            path: list[str] = []
            node: str | None = current
            while node is not None:
                path.append(node)
                node = previous[node]
            return path[::-1]
        for following in sorted(graph.get(current, {})):
            if following not in previous:
                previous[following] = current
                queue.append(following)
    return None


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The shortest cycle through each import that closes one, each cycle once."""
    found: dict[tuple[str, ...], list[str]] = {}
    for importer in sorted(graph):
        for imported in sorted(graph[importer]):
            back = shortest_path(graph, imported, importer)
            if back is None:
                continue
            cycle = [importer, *back[:-1]]
            first = cycle.index(min(cycle))
            canonical = tuple(cycle[first:] + cycle[:first])
            found.setdefault(canonical, list(canonical))
    return sorted(found.values(), key=lambda cycle: (len(cycle), cycle))


def main() -> int:
    modules = module_names(ROOT)
    scanned = {name: ModuleImports(name, path, modules) for name, path in modules.items()}
    graph = {name: found.imports for name, found in scanned.items()}
    upward = [(importer, line, imported) for importer, imports in sorted(graph.items())
              for imported, line in sorted(imports.items()) if layer_of(imported) > layer_of(importer)]
    for importer, line, imported in upward:
        print(f"up: {importer} (line {line}, {LAYERS[layer_of(importer)][0]}) imports {imported} "
              f"({LAYERS[layer_of(imported)][0]})")
    found_cycles = cycles(graph)
    for cycle in found_cycles:
        steps = [f"{module} (line {graph[module][cycle[(i + 1) % len(cycle)]]})" for i, module in enumerate(cycle)]
        print("cycle: " + " -> ".join([*steps, cycle[0]]))
    private = [(name, *entry) for name, found in sorted(scanned.items()) for entry in found.private]
    for importer, line, source, name in private:
        print(f"private: {importer} (line {line}) uses {source}.{name}")
    in_cycles = sorted({module for cycle in found_cycles for module in cycle})
    print(f"{len(upward)} imports up the layers, {len(found_cycles)} cycles through {len(in_cycles)} modules, "
          f"{len(private)} private imports")
    return 1 if upward or found_cycles or private else 0


if __name__ == "__main__":
    sys.exit(main())
