"""One exception tree for everything headrace raises."""

from __future__ import annotations

import re

# Whether running a pipeline again can get past an error is a property of the error's class,
# ``refusal``: True when the same pipeline, run again from the same checkpoint against the same
# systems, fails the same way (a refusal: the pipeline cannot run as it is). ``headrace run``
# ends on a refusal with REFUSED_EXIT_STATUS; neither the run's restarts (headrace/runtime/
# restarts.py) nor the server (headrace/server/supervisor.py) start it again. The rule:
#
# * refusals: a plan that is not valid (PlanError), a machine that lacks something, or a lease
#   another driver holds (SetupError), a checkpoint the plan cannot continue
#   (IncompatibleCheckpoint), a user function that raised (StepFunctionError: the replayed
#   batch hands it the same records), a source's or a sink's own refusal (SourceError,
#   SinkError: a table without a column, a directory holding an earlier run's batches, a bad
#   record with fail-fast set);
# * not refusals: a failure of Spark's that headrace cannot tell (PipelineFailed), which the
#   server may try again.
#
# The code that raises an error knows better for that one error and says so with
# ``refusal=``: a connector whose server stayed out of reach past its retries raises its
# SinkError with ``refusal=False``; the failure classifier (headrace/runtime/failures.py) marks
# a lost connection or a crashed Python worker ``refusal=False``, a class Spark cannot load
# ``refusal=True``.
REFUSED_EXIT_STATUS = 3  # headrace run's exit status when it ends on a refusal


class HeadraceError(Exception):
    """Base of every error headrace raises on purpose. The message is one line; ``trace``, when
    set, is Spark's own account of the failure behind it (``headrace run --verbose`` prints it);
    ``refusal``: whether running the pipeline again cannot help (the rule above).

    >>> SinkError("sink 'out': table 't' has no column 'n'").refusal
    True
    >>> SinkError("sink 'out': PostgreSQL unreachable after 6 attempts", refusal=False).refusal
    False
    """

    trace: str | None = None
    refusal: bool = False

    def __init__(self, *args: object, refusal: bool | None = None) -> None:
        super().__init__(*args)
        if refusal is not None:
            self.refusal = refusal


class SetupError(HeadraceError):
    """The machine lacks something headrace needs (Java, a writable state directory)."""

    refusal = True


class PlanError(HeadraceError):
    """A pipeline is not valid; raised while it is built, before Spark starts."""

    refusal = True


class StepFunctionError(HeadraceError):
    """A user function raised, or returned a value of the wrong type, while records flowed."""

    refusal = True


class SourceError(HeadraceError):
    """A source could not read its input, or found a bad record with fail-fast set."""

    refusal = True


class SinkError(HeadraceError):
    """A sink could not write or commit a batch."""

    refusal = True


class IncompatibleCheckpoint(HeadraceError):
    """A pipeline changed in a way its checkpoint cannot follow (a stateful step or a source
    changed its identity); raised before Spark starts. The message names each step, what
    changed and what to do."""

    refusal = True


class PipelineFailed(HeadraceError):
    """The Spark query behind a pipeline stopped with an error headrace did not raise itself."""


def step_error(node_name: str, defined_at: str, message: str) -> PlanError:
    """A plan error naming the step and where it was defined: ``step 'parse' (app.py:12): ...``."""
    return PlanError(f"step '{node_name}' ({defined_at}): {message}")


_RAISED_KINDS: dict[str, type[HeadraceError]] = {"StepFunctionError": StepFunctionError, "SourceError": SourceError,
                                                 "SinkError": SinkError}
_RAISED = re.compile(r"headrace\.errors\.(StepFunctionError|SourceError|SinkError): (.*)")


WORKER_CRASHED = "Python worker exited unexpectedly"


def python_worker_crashed(text: str) -> bool:
    """Whether a Spark failure's text says a Python worker died under a task."""
    return WORKER_CRASHED in text


def raised_inside(text: str, only: tuple[str, ...] = ("StepFunctionError", "SourceError", "SinkError")
                  ) -> HeadraceError | None:
    r"""The first headrace error of a kind in ``only`` that a Spark failure's text carries
    (a Python worker's traceback, wrapped by Spark). A message that ends where a Python
    worker's traceback begins gets the worker's exception added.

    >>> text = ("headrace.errors.SinkError: sink 'out' (words.py:15): PythonException: An exception was thrown "
    ...         "from the Python worker:\nTraceback (most recent call last):\n  File \"worker.py\", line 73\n"
    ...         "    command = serializer._read_with_length(file)\nModuleNotFoundError: No module named 'words'\n"
    ...         "\n\tat org.apache.spark.api.python.Runner")
    >>> print(str(raised_inside(text)).split("worker: ")[1])
    ModuleNotFoundError: No module named 'words'
    """
    for match in _RAISED.finditer(text):
        if match.group(1) in only:
            message = match.group(2).strip()
            if message.endswith(WORKER_EXCEPTION):
                message = f"{message} {python_exception(text[match.end():])}"
            return _RAISED_KINDS[match.group(1)](message)
    return None


WORKER_EXCEPTION = "An exception was thrown from the Python worker:"  # PythonException's first line
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


def python_exception(text: str) -> str:
    r"""The exception a Python traceback in ``text`` ends with (``KeyError: 'x'``), the last of a
    chain; ``text``'s first line when it holds no traceback.

    >>> python_exception("Traceback (most recent call last):\n  File 'a.py', line 1\nValueError: bad\n\n"
    ...                  "During handling of the above exception, another exception occurred:\n\n"
    ...                  "Traceback (most recent call last):\n  File 'a.py', line 3\nKeyError: 'x'\n"
    ...                  "\tat org.apache.spark.Thing")
    "KeyError: 'x'"
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")), None)
    if start is None:
        return next((line.strip() for line in lines if line.strip()), "")
    found, in_frames = "", False
    for line in lines[start + 1:]:
        if line.startswith("Traceback (most recent call last)"):
            in_frames = True
        elif line.startswith(" "):
            in_frames = True
        elif in_frames and line.strip():
            found, in_frames = line.strip(), False
        elif line.strip() and not line.startswith(_CHAINED):
            break  # past the traceback (Spark's JVM frames, its summary)
    return found


def describe(exc: BaseException) -> str:
    """``Type: message``; a Python worker's exception (PySpark's PythonException, whose message is
    its worker's whole traceback) in one line, ending with the exception the traceback ends with.

    >>> describe(RuntimeError("disk full"))
    'RuntimeError: disk full'
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    if first.endswith(WORKER_EXCEPTION):
        text = f"{first} {python_exception(text)}"
    return f"{type(exc).__name__}: {text}"


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
