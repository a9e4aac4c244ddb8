"""One exception tree for everything headrace raises."""

from __future__ import annotations

import re


class HeadraceError(Exception):
    """Base of every error headrace raises on purpose. The message is one line; ``trace``, when
    set, is Spark's own account of the failure behind it (``headrace run --verbose`` prints it)."""

    trace: str | None = None


class SetupError(HeadraceError):
    """The machine lacks something headrace needs (Java, a writable state directory)."""


class PlanError(HeadraceError):
    """A pipeline is not valid; raised while it is built, before Spark starts."""


class StepFunctionError(HeadraceError):
    """A user function raised, or returned a value of the wrong type, while records flowed."""


class SourceError(HeadraceError):
    """A source could not read its input, or found a bad record with fail-fast set."""


class SinkError(HeadraceError):
    """A sink could not write or commit a batch."""


class IncompatibleCheckpoint(HeadraceError):
    """A pipeline changed in a way its checkpoint cannot follow (a stateful step or a source
    changed its identity); raised before Spark starts. The message names each step, what
    changed and what to do."""


class PipelineFailed(HeadraceError):
    """The Spark query behind a pipeline stopped with an error headrace did not raise itself."""


def step_error(node_name: str, defined_at: str, message: str) -> PlanError:
    """A plan error naming the step and where it was defined: ``step 'parse' (app.py:12): ...``."""
    return PlanError(f"step '{node_name}' ({defined_at}): {message}")


_RAISED_KINDS: dict[str, type[HeadraceError]] = {"StepFunctionError": StepFunctionError, "SourceError": SourceError,
                                                 "SinkError": SinkError}
_RAISED = re.compile(r"headrace\.errors\.(StepFunctionError|SourceError|SinkError): (.*)")


def raised_inside(text: str, only: tuple[str, ...] = ("StepFunctionError", "SourceError", "SinkError")
                  ) -> HeadraceError | None:
    """The first headrace error of a kind in ``only`` that a Spark failure's text carries
    (a Python worker's traceback, wrapped by Spark)."""
    for match in _RAISED.finditer(text):
        if match.group(1) in only:
            return _RAISED_KINDS[match.group(1)](match.group(2).strip())
    return None


class PipelineFileError(PlanError):
    """A pipeline file is not valid: ``pipeline.yaml:12: step 'parse': ...``. ``path`` and ``line``
    say where (``line`` 0 when the error is about the whole file)."""

    def __init__(self, path: str, line: int, subject: str, message: str) -> None:
        self.path, self.line, self.subject, self.message = path, line, subject, message
        self.errors: list[PipelineFileError] = [self]  # every error found in the file (``PipelineFileErrors``)
        where = f"{path}:{line}" if line else path
        super().__init__(f"{where}: {subject}: {message}" if subject else f"{where}: {message}")


class PipelineFileErrors(PipelineFileError):
    """Several errors of one pipeline file, found at once: reads as the first (``line``,
    ``subject``, ``message``); ``errors`` has them all, by line; the text is one per line."""

    def __init__(self, errors: list[PipelineFileError]) -> None:
        first = errors[0]
        super().__init__(first.path, first.line, first.subject, first.message)
        self.errors = list(errors)
        self.args = ("\n".join(str(e) for e in errors),)

    def __str__(self) -> str:
        return str(self.args[0])
