"""A pipeline file's YAML as plain values that remember their lines.

PyYAML's node API (``yaml.compose``) keeps the position of every key and value; this module
turns the nodes into :class:`Located` values (a scalar, a list or a mapping, each with its
line), so that every error about the file can name ``pipeline.yaml:LINE``. It also replaces
``${NAME}`` and ``${NAME:-default}`` in scalars with environment variables.

>>> doc = parse_yaml("pipeline: demo\\nsources:\\n  clicks: {type: Generator}\\n", "p.yaml", {})
>>> doc["sources"]["clicks"]["type"].value, doc["sources"]["clicks"].line
('Generator', 3)
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from headrace.errors import PipelineFileError

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when PyYAML was built with it
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


@dataclass
class Located:
    """One value of the file: ``value`` is a plain scalar, a list of Located, or a dict of key
    (its text) to Located; ``line`` is where it starts (1-based). A mapping also keeps each
    key's line (``key_lines``) and the key as YAML typed it (``typed_keys``: ``1`` an int,
    ``on`` a bool), while ``value`` is keyed by the key's text."""

    value: Any
    line: int
    kind: str  # "scalar", "list" or "map"
    key_lines: dict[str, int] = field(default_factory=dict)
    typed_keys: dict[str, Any] = field(default_factory=dict)
    raw: str | None = None  # a scalar as written (after ${...}): `type: Null` is the text "Null", not None

    @property
    def text(self) -> str | None:
        """A scalar as a name: the text written, whatever YAML makes of it (``on``, ``null``, ``1``)."""
        if self.kind != "scalar":
            return None
        return self.raw if self.raw is not None else str(self.value)

    @property
    def is_map(self) -> bool:
        return self.kind == "map"

    @property
    def is_list(self) -> bool:
        return self.kind == "list"

    @property
    def is_scalar(self) -> bool:
        return self.kind == "scalar"

    def __contains__(self, key: str) -> bool:
        return self.is_map and key in self.value

    def __getitem__(self, key: str) -> Located:
        return self.value[key]  # type: ignore[no-any-return]

    def get(self, key: str) -> Located | None:
        return self.value.get(key) if self.is_map else None

    def keys(self) -> list[str]:
        return list(self.value) if self.is_map else []

    def items(self) -> Iterator[tuple[str, Located]]:
        return iter(self.value.items()) if self.is_map else iter(())

    def line_of(self, key: str) -> int:
        """The line of ``key`` in this mapping (of the mapping itself when the key is absent)."""
        return self.key_lines.get(key, self.line)

    def plain(self) -> Any:
        """The value as plain Python: scalars, lists and dicts."""
        if self.kind == "list":
            return [item.plain() for item in self.value]
        if self.kind == "map":
            return {key: item.plain() for key, item in self.value.items()}
        return self.value

    def describe(self) -> str:
        """How an error quotes the value."""
        if self.kind == "scalar":
            return repr(self.value)
        return "a list" if self.kind == "list" else "a mapping"


def closest(word: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a known word is close to ``word``, else nothing.

    >>> closest("clikcs", ["clicks", "orders"]), closest("zzz", ["clicks"])
    (" (did you mean 'clicks'?)", '')
    """
    match = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def parse_yaml(text: str, path: str, environ: Mapping[str, str]) -> Located:
    """The file's one YAML document, or a PipelineFileError naming the line."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise PipelineFileError(path, line, "", f"not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise PipelineFileError(path, 0, "", f"not valid YAML: {exc}") from None
    if node is None:
        raise PipelineFileError(path, 0, "", "the file is empty; a pipeline file starts with `pipeline: NAME`")
    return _Converter(path, environ).convert(node)


class _Converter:
    """Nodes to Located values, scalars typed by a constructor of this file's own."""

    def __init__(self, path: str, environ: Mapping[str, str]) -> None:
        self.path, self.environ = path, environ
        self.constructor = yaml.constructor.SafeConstructor()

    def convert(self, node: yaml.Node) -> Located:
        return _convert(node, self)

    def scalar(self, node: yaml.ScalarNode) -> tuple[Any, str]:
        return _scalar(node, self)


def _convert(node: yaml.Node, converter: _Converter) -> Located:
    path = converter.path
    line = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        value, text = converter.scalar(node)
        return Located(value, line, "scalar", raw=text)
    if isinstance(node, yaml.SequenceNode):
        return Located([converter.convert(item) for item in node.value], line, "list")
    assert isinstance(node, yaml.MappingNode)
    values: dict[str, Located] = {}
    key_lines: dict[str, int] = {}
    typed: dict[str, Any] = {}
    for key_node, value_node in node.value:
        key_line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise PipelineFileError(path, key_line, "", "a key must be a name, not a list or a mapping")
        key = key_node.value
        if key in values:
            raise PipelineFileError(path, key_line, "", f"the key {key!r} appears twice (first at line "
                                                        f"{key_lines[key]}); keep one")
        values[key] = converter.convert(value_node)
        key_lines[key] = key_line
        typed[key] = converter.scalar(key_node)[0]
    return Located(values, line, "map", key_lines, typed)


def _scalar(node: yaml.ScalarNode, converter: _Converter) -> tuple[Any, str]:
    """The scalar's value as YAML types it, and its text, both after ``${...}`` substitution."""
    if "${" not in node.value:
        return converter.constructor.construct_object(node, deep=True), node.value
    path, environ, line = converter.path, converter.environ, node.start_mark.line + 1

    def variable(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise PipelineFileError(path, line, "", f"the environment variable {name} is not set; set it, or give a "
                                                f"default: ${{{name}:-value}}")

    text = _VARIABLE.sub(variable, node.value)
    if node.style:  # quoted: stays a string (a plain scalar's style is None, or "" from libyaml)
        return text, text
    try:  # plain: typed as YAML types the text it now holds (a port becomes a number)
        value = yaml.load(text, Loader=_LOADER)  # noqa: S506 - the safe loader
    except yaml.YAMLError:
        return text, text
    return (value if not isinstance(value, (list, dict)) else text), text
