"""What a pipeline file's step kind gets to build its step (``StepContext``), the kind itself
(``StepKind``), and the key check both the file builder and the kinds use. The file builder
(``headrace/api/pipeline_file.py``) is seen here only as the ``FileBuilder`` protocol, so the
step kinds (``headrace/api/file_steps.py``) need not import it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from headrace.api.import_paths import ImportPathError, resolve, resolve_callable
from headrace.api.located_yaml import Located, closest
from headrace.api.stream import KeyedStream, Pipeline, Stream, Table
from headrace.errors import PipelineFileError
from headrace.expr import Expr, col, expr, lit

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SQL_CONSTANTS = ("true", "false", "null")


class Unbuilt(Exception):
    """A declaration reads one that could not be built (its error is already reported)."""


class FileBuilder(Protocol):
    """What a step kind may ask of the pipeline file's builder."""

    pipeline: Pipeline
    kind_of: dict[str, str]
    sources: dict[str, Located]
    built_tables: dict[str, Table]
    failed: set[str]
    unread: list[str]

    def fail(self, where: Located | int, subject: str, message: str) -> PipelineFileError: ...

    def at(self, line: int, subject: str) -> AbstractContextManager[None]: ...

    def stream_of(self, name: str, line: int) -> Stream: ...

    def input_for(self, ref: Located, reader: str) -> Stream: ...


@dataclass(frozen=True)
class StepKind:
    """One kind of step: its action ``key``, the ``options`` it takes beside it, whether it
    reads a ``from:`` stream, and ``build``, which adds it with the fluent API and returns its
    stream."""

    key: str
    build: Callable[[StepContext], Any]
    options: tuple[str, ...] = ()
    reads_from: bool = True
    summary: str = ""



class StepContext:
    """What a step kind's builder (``headrace/api/file_steps.py``) gets: the step's name and
    YAML, its input stream, and helpers that read values and fail naming their lines."""

    def __init__(self, builder: FileBuilder, name: str, spec: Located, kind: StepKind) -> None:
        self.builder, self.name, self.spec, self.kind = builder, name, spec, kind
        self.action: Located = spec[kind.key]
        self.subject = f"step '{name}'"

    @property
    def pipeline(self) -> Pipeline:
        return self.builder.pipeline

    @property
    def input(self) -> Stream:
        """The stream the step reads (its ``from:``)."""
        return self.builder.input_for(self.spec["from"], self.name)

    def keyed_input(self, what: str) -> KeyedStream:
        stream = self.input
        if not isinstance(stream, KeyedStream):
            raise self.fail(self.spec.line_of("from"), f"{what} works per key: read from a key_by step, not "
                                                       f"{self.spec['from'].value!r}")
        return stream

    def stream(self, ref: Located) -> Stream:
        """Another source or step this step reads (a union's)."""
        return self.builder.input_for(ref, self.name)

    def source(self, ref: Located) -> Stream:
        """A source's own stream (before its event time), for dead letters."""
        name = ref.text
        if not name or name not in self.builder.sources:
            sources = list(self.builder.sources)
            raise self.fail(ref, f"{ref.describe()} is not a source{closest(str(name), sources)}; the sources are "
                                 f"{', '.join(sources) or 'none'}")
        self.builder.stream_of(name, ref.line)
        return Stream(self.pipeline, self.pipeline.plan.nodes[name])

    def table(self, ref: Located) -> Table:
        name = ref.text
        tables = self.builder.built_tables
        if name in self.builder.failed and self.builder.kind_of.get(str(name)) == "table":
            raise Unbuilt(str(name))
        if not name or name not in tables:
            raise self.fail(ref, f"{ref.describe()} is not a table under tables:{closest(str(name), tables)}; the "
                                 f"tables are {', '.join(tables) or 'none'}")
        return tables[name]

    # -- values -----------------------------------------------------------------------------------
    def option(self, key: str) -> Located | None:
        return self.spec.get(key)

    def plain_option(self, key: str) -> Any:
        found = self.spec.get(key)
        return found.plain() if found is not None else None

    def required_option(self, key: str, what: str) -> Located:
        found = self.spec.get(key)
        if found is None:
            raise self.fail(self.spec.line_of(self.kind.key), f"a {self.kind.key} step needs {key}: {what}")
        return found

    def required(self, spec: Located, key: str) -> Located:
        found = spec.get(key)
        if found is None:
            raise self.fail(spec, f"give {key}:")
        return found

    def text(self, value: Located) -> str:
        if not value.text:
            raise self.fail(value, f"expected a name, got {value.describe()}")
        return value.text

    def listed(self, value: Located, what: str) -> list[Located]:
        """A list's items (a single scalar counts as a list of one)."""
        if value.is_list:
            if not value.value:
                raise self.fail(value, f"{what}: the list is empty")
            return list(value.value)
        if value.is_scalar and value.value is not None:
            return [value]
        raise self.fail(value, f"{what} takes a list, got {value.describe()}")

    def mapping(self, value: Located, what: str) -> dict[str, Located]:
        if not value.is_map or not value.value:
            raise self.fail(value, f"{what} takes a mapping {{name: value, ...}}, got {value.describe()}")
        return dict(value.items())

    def check_keys(self, spec: Located, known: tuple[str, ...], what: str) -> None:
        if not spec.is_map:
            raise self.fail(spec, f"{what} takes a mapping with {', '.join(known)}; got {spec.describe()}")
        check_keys(self.builder, spec, known, self.subject, f"{'an' if what[0] in 'aeiou' else 'a'} {what}")

    def expression(self, value: Located) -> Expr:
        """A column expression: a column name, a Spark SQL expression (checked by Spark when the
        query starts), or a constant."""
        found = value.value
        if value.is_scalar and isinstance(found, str):
            if IDENTIFIER.fullmatch(found) and found.lower() not in SQL_CONSTANTS:
                return col(found)
            return expr(found)
        if value.is_scalar and found is not None:
            return lit(found)
        raise self.fail(value, f"expected a column name or a Spark SQL expression, got {value.describe()}")

    def imported(self, value: Located) -> Any:
        """What an import path ``module:name`` names."""
        try:
            return resolve(value.value)
        except ImportPathError as exc:
            raise self.fail(value, str(exc)) from None

    def function(self, value: Located) -> Any:
        """The function an import path ``module:function`` names."""
        try:
            return resolve_callable(value.value)
        except ImportPathError as exc:
            raise self.fail(value, str(exc)) from None

    def function_entry(self, spec: Located) -> Any:
        """The function a ``{function: module:fn}`` mapping names, given to this step instead of
        its usual value (a ``filter``'s condition, a ``key_by``'s fields)."""
        self.check_keys(spec, ("function",), self.kind.key)
        return self.function(self.required(spec, "function"))

    @contextmanager
    def at(self, value: Located) -> Iterator[None]:
        """Build inside at ``value``'s line (a window shape, a trigger)."""
        with self.builder.at(value.line, self.subject):
            yield

    def fail(self, where: Located | int, message: str) -> PipelineFileError:
        return self.builder.fail(where, self.subject, message)


def check_keys(builder: FileBuilder, spec: Located, known: tuple[str, ...], subject: str, owner: str) -> None:
    """Refuse a key ``spec`` should not have, suggesting the closest known one; ``owner`` says
    what takes the keys (``a map step``)."""
    for key in spec.keys():
        if key not in known:
            raise builder.fail(spec.line_of(key), subject, f"unknown key {key!r}{closest(key, known)}; {owner} takes "
                                                           f"{', '.join(known)}")
