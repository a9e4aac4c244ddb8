"""What the server checks before it starts a pipeline's driver, so that what a driver would refuse
is answered at once, as a 4xx with its reason, and never retried as if the driver had crashed:

* the file builds (``headrace explain FILE``, without Spark, in a process of its own): one that
  does not is refused with its error (400); one whose loading does not finish in time is ended
  and refused (422), naming the line of the file it was at;
* the checkpoint can be continued: a drained one takes no other run (409) unless the pipeline
  starts ``fresh``; one the file's plan cannot continue is refused with the reasons (409, the
  rules of ``headrace explain --against-checkpoint``);
* a rescale has keyed state to spread over another number of partitions (409).

``start_fresh`` forgets a pipeline's checkpoint, as ``headrace run --fresh`` does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from typing import Any

from headrace.environment import checkpoints, storage
from headrace.environment.end_of_time import DRAINED_FILE
from headrace.environment.lease import Lease, LeaseHeld
from headrace.runtime.compatibility import WHAT_TO_DO
from headrace.server.driver import end_session
from headrace.server.registry import Refused

LOAD_TIMEOUT_S = 60.0  # how long building a submitted file's plan may take (importing it, above all)
STUCK_GRACE_S = 60.0  # and how long its process may take besides (importing headrace, printing where it is)
# ``headrace explain ...`` that, stuck past its time once headrace's modules it uses are imported (so that
# the time is the file's: loading it, building its plan), prints each thread's stack and exits (faulthandler)
HEADRACE_MODULES = ("headrace.cli", "headrace.runtime.runner", "headrace.api.import_paths",
                    "headrace.api.pipeline_file", "headrace.runtime.compatibility", "headrace.spark.plan_checks")
EXPLAIN = (f"import faulthandler, importlib, sys; [importlib.import_module(m) for m in {HEADRACE_MODULES!r}]; "
           "faulthandler.dump_traceback_later(float(sys.argv.pop(1)), exit=True); "
           "sys.exit(sys.modules['headrace.cli'].main(sys.argv[1:]))")
TIMED_OUT = re.compile(r"^Timeout \(\d+:\d\d:\d\d(\.\d+)?\)!$")
FRAME = re.compile(r'^\s*File "(.+)", line (\d+) in ')
FRESH_HINT = ('submit it again with "fresh": true (headrace submit FILE --fresh), or restart it with ?fresh=true '
              "(headrace restart NAME --fresh), to delete its checkpoint and start over from the beginning of "
              "its input")


def explain(path: str, *options: str, timeout_s: float = LOAD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``headrace explain PATH OPTIONS`` in a session of its own, ended with whatever it started; a
    run that does not finish within ``timeout_s`` is refused (422), naming where the file was."""
    process = subprocess.Popen([sys.executable, "-c", EXPLAIN, str(timeout_s), "explain", path, *options],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    stuck = False
    try:
        out, err = process.communicate(timeout=timeout_s + STUCK_GRACE_S)
    except subprocess.TimeoutExpired:  # stuck where even faulthandler's thread could not end it
        end_session(process.pid)
        out, err = process.communicate()
        stuck = True
    finally:
        end_session(process.pid)  # what the file started, if anything
    if stuck or (process.returncode == 1 and any(TIMED_OUT.match(line) for line in err.splitlines())):
        raise Refused(422, f"loading {os.path.basename(path)} did not finish within {timeout_s:g} s"
                           f"{stuck_at(err, path)}; a pipeline file must build its pipeline without waiting on "
                           "anything: move what waits (a connection, a download, a sleep) into a step or a source")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def stuck_at(stacks: str, path: str) -> str:
    """Where a stuck file was, from faulthandler's stacks (the most recent call first): the line
    of a file in the pipeline file's folder, with its text (``: it was at app.py:4 (time.sleep(1000))``)."""
    folder = os.path.dirname(os.path.abspath(path)) + os.sep
    for line in stacks.splitlines():
        frame = FRAME.match(line)
        if frame and frame.group(1).startswith(folder):
            file, number = frame.group(1), int(frame.group(2))
            text = _source_line(file, number)
            return f": it was at {os.path.relpath(file, folder)}:{number}{f' ({text})' if text else ''}"
    return ""


def _source_line(file: str, number: int) -> str:
    try:
        with open(file, encoding="utf-8", errors="replace") as source:
            for at, text in enumerate(source, 1):
                if at == number:
                    return text.strip()
    except OSError:
        pass
    return ""


def pipeline_name(path: str, timeout_s: float = LOAD_TIMEOUT_S) -> str:
    """The pipeline's name, from ``headrace explain --json``: one that does not build is refused
    with its error (400)."""
    done = explain(path, "--json", timeout_s=timeout_s)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["headrace explain failed"])[-1]
        raise Refused(400, error.removeprefix("headrace: "))
    return str(printed_json(done.stdout)["pipeline"])


def printed_json(printed: str) -> dict[str, Any]:
    """The JSON object ``headrace explain --json`` printed last (indented: its first line is ``{``),
    after whatever the file printed as it loaded."""
    start = 0 if printed.startswith("{") else printed.rfind("\n{\n") + 1
    try:
        found = json.loads(printed[start:])
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise Refused(400, f"headrace explain printed no plan: {printed.strip()[-300:]!r}")
    return found


def refuse_incompatible(path: str, state_dir: str, what: str, advice: str = "",
                        timeout_s: float = LOAD_TIMEOUT_S) -> None:
    """Refuse (409) when the checkpoint under ``state_dir`` cannot be continued by ``path``'s plan,
    with the reasons: ``what`` says what is refused (``the upgrade is refused, 'orders' runs on``),
    ``advice`` what to do instead."""
    verdict = explain(path, "--against-checkpoint", "--json", "--state-dir", state_dir, timeout_s=timeout_s)
    if verdict.returncode == 0:
        return
    try:
        message = str(printed_json(verdict.stdout)["message"]).removesuffix(" " + WHAT_TO_DO).removesuffix(".")
    except (Refused, KeyError):  # an error, not a verdict
        lines = [line.strip().removeprefix("headrace: ") for line in verdict.stderr.splitlines() if line.strip()]
        message = lines[-1] if lines else "headrace explain --against-checkpoint failed"
    raise Refused(409, f"{what}: {message}{'; ' + advice if advice else ''}")


def drained(root: str) -> dict[str, Any] | None:
    """The mark of a drained checkpoint under pipeline root ``root`` (its batch and when), or None."""
    try:
        with open(os.path.join(root, DRAINED_FILE), encoding="utf-8") as mark:
            found = json.load(mark)
    except FileNotFoundError:
        return None
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def refuse_drained(roots: list[str], name: str) -> None:
    """Refuse (409) to run the pipeline again on its checkpoint when it was drained."""
    for root in roots:
        mark = drained(root)
        if mark is not None:
            raise Refused(409, f"pipeline {name!r} was drained at batch {mark.get('batch')} ({mark.get('at')}): every "
                               "window fired at the end of time, so its checkpoint takes no more records; "
                               f"{FRESH_HINT}")


def has_checkpoint(root: str) -> bool:
    return checkpoints.has_batches(storage.join(root, "checkpoint"))


def refuse_rescale(roots: list[str], name: str, partitions: int, running: bool) -> None:
    """Refuse (409) a rescale that ``headrace rescale`` would refuse: a checkpoint drained, with
    batches and no keyed state, or with ``partitions`` partitions already. A ``running``
    pipeline's checkpoint may have no batch yet: its driver may commit one before it stops."""
    refuse_drained(roots, name)
    checkpoint = storage.join(roots[0], "checkpoint") if roots else ""
    if not roots or not checkpoints.has_batches(checkpoint):
        if running:
            return
        raise Refused(409, f"pipeline {name!r} has no checkpoint with processed batches yet, so there is no keyed "
                           "state to rescale: resume or restart it first (a new pipeline takes its number of state "
                           "partitions from spark.sql.shuffle.partitions)")
    if not os.path.isdir(os.path.join(checkpoint, "state")):
        raise Refused(409, f"pipeline {name!r} keeps no keyed state (no stateful step in its checkpoint), so there "
                           "is nothing to rescale")
    planned, committed = (checkpoints.last_batch(checkpoint, log) for log in (checkpoints.OFFSETS,
                                                                              checkpoints.COMMITS))
    current, next_batch = (None if batch is None else
                           checkpoints.state_partitions_of(checkpoints.batch_metadata(checkpoint, batch))
                           for batch in (committed, planned))
    rescaling = planned != committed and next_batch != current  # a rescale interrupted midway: asking again ends it
    if current == partitions and not rescaling:
        raise Refused(409, f"pipeline {name!r}'s state already has {partitions} partitions")


def start_fresh(state_dir: str, pipeline: str, also: tuple[str, ...] = ()) -> None:
    """Delete pipeline ``pipeline``'s checkpoint under ``state_dir`` (its root: checkpoint, stored
    plan, run files) and the files ``also`` names, under the checkpoint's lease, as ``headrace run
    --fresh`` does; refused (409) while a driver holds the lease."""
    lease = Lease(state_dir, pipeline)
    try:
        lease.acquire()
    except LeaseHeld as held:
        raise Refused(409, str(held)) from None
    try:
        storage.delete_tree(checkpoints.pipeline_root(state_dir, pipeline))
        for file in also:
            if os.path.exists(file):
                os.remove(file)
    finally:
        lease.release()
