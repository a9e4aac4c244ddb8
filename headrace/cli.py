"""The ``headrace`` command: a thin layer over the library.

The library (and pyspark with it) is imported inside the commands, after ``main`` has taken
over Ctrl-C and SIGTERM: a signal at any moment of a run's start-up stops it cleanly.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import os
import shlex
import sys
from types import ModuleType
from typing import Any

from headrace import config
from headrace.errors import REFUSED_EXIT_STATUS, HeadraceError
from headrace.runtime.signals import stop_on_signals

STATE_DIR_HELP = ("where checkpoints live: a directory, or a Hadoop URI such as hdfs://namenode:8020/state "
                  "(default: $HEADRACE_STATE_DIR or .headrace)")
RUNS_PIPELINES = ("run", "demo")  # the commands whose Ctrl-C and SIGTERM stop a run (headrace/runtime/signals.py)
SIGPIPE_STATUS = 141  # a shell's status for a command ended by SIGPIPE: its reader left
PIPELINE_FILE_SUFFIXES = (".yaml", ".yml")
RUN_EXIT_STATUSES = ("exit status: 0 when the input ended or the run was stopped; 1 on a failure that running it "
                     "again may get past (a service out of reach past the restarts, a failure headrace cannot tell); "
                     f"2 on bad command-line input; {REFUSED_EXIT_STATUS} refused: the pipeline cannot run as it is "
                     "(a plan or setup error, a checkpoint the plan cannot continue, a source's or sink's own "
                     "refusal, a user function that raised, another driver running it): running it again will not "
                     "help, so headrace server does not; 130 interrupted")


class UsageError(Exception):
    """Bad command-line input: printed as one line, exit status 2."""


def load_pipeline(target: str) -> Any:
    """``FILE[:PIPELINE]``: load FILE as a module (not as __main__) and pick a Pipeline from it;
    a pipeline file (``.yaml``, ``.yml``) is read with ``hr.load_pipeline_file``. A file that
    calls ``p.run()`` stops there, and ``p`` is the pipeline picked: the command runs it (or,
    for ``explain``, does not)."""
    from headrace.api.stream import Pipeline

    path, _, wanted = target.partition(":")
    if not os.path.isfile(path):
        raise UsageError(f"no such file: {path}")
    if path.endswith(PIPELINE_FILE_SUFFIXES):
        return _load_pipeline_file(path, wanted)
    module, ran = load_user_file(path)
    found = {name: value for name, value in vars(module).items() if isinstance(value, Pipeline)}
    if ran is not None and (not wanted or wanted == ran.name):
        return ran
    if wanted:
        for variable, pipeline in found.items():
            if wanted in (variable, pipeline.name):
                return pipeline
        raise UsageError(f"{path} has no pipeline named {wanted!r}; it has: {', '.join(found) or 'none'}")
    if not found:
        raise UsageError(f"{path} defines no headrace Pipeline at module level")
    if len(found) > 1:
        raise UsageError(f"{path} defines several pipelines ({', '.join(found)}); choose one with {path}:NAME")
    return next(iter(found.values()))


def load_user_file(path: str) -> tuple[ModuleType, Any]:
    """Import the Python file ``path`` as a module of its own (its folder on the Python path) and
    the pipeline it runs, if it calls ``run``: the run is deferred, not started. The module and
    the modules it imports from its folder travel to Spark's workers by value (the workers need
    not find them on their path)."""
    from headrace.api.import_paths import ship_by_value
    from headrace.runtime.runner import RunDeferred, deferring_runs

    folder = os.path.dirname(os.path.abspath(path))
    sys.path.insert(0, folder)
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, os.path.abspath(path))
    if spec is None or spec.loader is None:
        raise UsageError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[name] = module
    ran = None
    try:
        with deferring_runs():
            spec.loader.exec_module(module)
    except RunDeferred as deferred:
        ran = deferred.pipeline
    except HeadraceError:
        raise
    except Exception as exc:
        raise UsageError(f"{path} failed to load: {type(exc).__name__}: {exc}") from None
    for loaded in [module, *(sys.modules[new] for new in set(sys.modules) - before)]:
        if os.path.abspath(getattr(loaded, "__file__", None) or "/").startswith(folder + os.sep):
            ship_by_value(loaded)
    return module, ran


def _module_name(path: str) -> str:
    """The file's name without ``.py`` when no other module has it, else a private name."""
    stem = os.path.splitext(os.path.basename(path))[0]
    taken = sys.modules.get(stem)
    if stem.isidentifier() and (taken is None or getattr(taken, "__file__", None) == os.path.abspath(path)):
        return stem
    digest = hashlib.sha1(os.path.abspath(path).encode()).hexdigest()[:8]
    return f"__headrace_file_{digest}__"


def _load_pipeline_file(path: str, wanted: str) -> Any:
    from headrace.api.pipeline_file import load_pipeline_file

    pipeline = load_pipeline_file(path)
    if wanted and wanted != pipeline.name:
        raise UsageError(f"{path} describes pipeline {pipeline.name!r}, not {wanted!r}")
    return pipeline


def cmd_switch(args: argparse.Namespace) -> int:
    """Move readers to another version of an output: a PostgreSQL view (``--dsn``) or a link to a
    folder; with ``--batch``, a Lambda serving view (docs/backfill.md)."""
    from headrace.connectors import serving
    from headrace.errors import SetupError

    lambda_options = (args.batch, args.live, args.time, args.cutoff)
    if any(lambda_options):
        if not all(lambda_options) or args.target or not args.dsn:
            raise SetupError("switch: a serving view needs --batch, --live, --time, --cutoff and --dsn, and no TARGET")
        done = serving.lambda_view(args.dsn, args.name, args.batch, args.live, args.time, args.cutoff)
    elif not args.target:
        raise SetupError("switch: name the TARGET to point NAME at (a table with --dsn, else a folder)")
    elif args.dsn:
        done = serving.switch_view(args.dsn, args.name, args.target)
    else:
        done = serving.switch_link(args.name, args.target)
    was = f" (was {done.previous})" if done.previous else ""
    print(f"{done.name} -> {done.target}{was}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    """Build a pipeline's plan and check it, without Spark."""
    from headrace.api.pipeline_file import plan_summary
    from headrace.errors import PlanError

    try:
        pipeline = load_pipeline(args.file).validate()
    except PlanError as exc:
        if not args.json:
            raise
        errors = [{"line": getattr(e, "line", 0), "error": str(e)} for e in getattr(exc, "errors", [exc])]
        print(json.dumps({"file": args.file, "valid": False, **errors[0], "errors": errors}))
        return 1
    summary = plan_summary(pipeline)
    if args.json:
        print(json.dumps({"file": args.file, "valid": True, **summary, "plan": pipeline.to_json()}, default=str))
        return 0
    counts = ", ".join(f"{n} {what if n == 1 else what + 's'}" for what, n in
                       (("source", summary["sources"]), ("step", summary["steps"]), ("sink", summary["sinks"])))
    print(f"{args.file}: pipeline {pipeline.name!r} is valid: {counts}; guarantee {summary['guarantee']}")
    if args.explain:
        print(pipeline.explain())
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from headrace.scaffold import create_project

    try:
        written = create_project(args.directory)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from None
    print(f"created {args.directory}:")
    for path in written:
        print(f"  {os.path.relpath(path, args.directory)}")
    print(f"next: cd {args.directory} && headrace validate pipeline.yaml && headrace run pipeline.yaml && pytest")
    return 0


def _progress(args: argparse.Namespace) -> str:
    return "json" if args.json else "quiet" if args.quiet else "line"


def cmd_run(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.target)
    result = pipeline.run(state_dir=args.state_dir, master=args.master, progress=_progress(args), fresh=args.fresh,
                          max_seconds=args.max_seconds, restart_attempts=args.restart_attempts,
                          restart_window=args.restart_window, restart_backoff=args.restart_backoff, drain=args.drain,
                          backfill=args.backfill)
    _report(result, args)
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    pipeline = load_pipeline(args.target)
    if args.against_checkpoint:
        return explain_restart(pipeline, args)
    print(json.dumps(pipeline.to_json(), indent=2, default=str) if args.json else pipeline.explain())
    return 0


def explain_restart(pipeline: Any, args: argparse.Namespace) -> int:
    """What a restart from the stored checkpoint would keep; 1 when it would be refused. No
    Spark, unless the state dir is on HDFS or S3 (read through Spark's JVM)."""
    from headrace.environment import storage
    from headrace.environment.checkpoints import has_batches, pipeline_root, read_plan
    from headrace.environment.session import get_session, spark_log_file
    from headrace.runtime.compatibility import check_restart
    from headrace.runtime.runner import default_state_dir
    from headrace.spark.plan_checks import check_plan

    check_plan(pipeline.plan)
    state_dir = args.state_dir or default_state_dir()
    root = pipeline_root(state_dir, pipeline.name)
    checkpoint = storage.join(root, "checkpoint")
    if storage.is_remote(root):
        get_session(None, spark_log_file(state_dir))
    verdict = check_restart(pipeline.plan, root)
    if verdict is None:
        unchecked = has_batches(checkpoint) and read_plan(root) is None
        why = ("the checkpoint was written before headrace stored plans: the restart is not checked" if unchecked
               else "no checkpoint with a batch in it: a run starts from the beginning")
        report: dict[str, Any] = {"pipeline": pipeline.name, "checkpoint": checkpoint,
                                  "restart": "unchecked" if unchecked else "fresh", "message": why}
        print(json.dumps(report, indent=2) if args.json else f"pipeline {pipeline.name!r} ({checkpoint}): {why}")
        return 0
    print(json.dumps(verdict.to_json(), indent=2, ensure_ascii=False) if args.json else "\n".join(verdict.lines()))
    return 0 if verdict.allowed else 1


def cmd_rescale(args: argparse.Namespace) -> int:
    from headrace.runtime.rescale import rescale

    if not os.path.exists(args.target.split(":", 1)[0]):  # no such file: a pipeline on the server
        client = _client(args)
        answer = client.call("POST", f"{client.pipeline(args.target)}/rescale", {"partitions": args.partitions})
        entry, status = _waited(client, answer, args.wait)
        print(json.dumps(entry) if args.json else _show_pipeline(entry))
        return status
    pipeline = load_pipeline(args.target)
    before = rescale(pipeline, args.partitions, state_dir=args.state_dir, master=args.master)
    report = {"pipeline": pipeline.name, "partitions_before": before, "partitions": args.partitions}
    print(json.dumps(report) if args.json else
          f"{pipeline.name}: state rescaled from {before} to {args.partitions} partitions; the next run continues "
          "from it")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from headrace.connectors.console import Console
    from headrace.demo import ysb_pipeline

    # With --json, stdout carries JSON lines only: the windows' console tables go to stderr.
    sink = Console(limit=10, out=sys.stderr) if args.json else None
    pipeline = ysb_pipeline(variant=args.variant, limit=args.limit, sink=sink)
    if not args.json and not args.quiet:
        print(pipeline.explain(), end="\n\n", flush=True)
    result = pipeline.run(state_dir=args.state_dir, master=args.master, progress=_progress(args), fresh=True)
    _report(result, args)
    return 0


def _report(result: Any, args: argparse.Namespace) -> None:
    summary = {"pipeline": result.pipeline, "batches": result.batches, "input_rows": result.input_rows,
               "dead_letters": result.dead_letters, "late_rows_dropped": result.late_rows_dropped,
               "restarts": result.restarts, "stopped_by": result.stopped_by, "elapsed_s": result.elapsed_s,
               "checkpoint": result.checkpoint}
    if args.json:
        print(json.dumps({"result": summary}))
    elif not args.quiet:
        restarts = f", {result.restarts} restart{'s' if result.restarts != 1 else ''}" if result.restarts else ""
        print(f"\n{result.pipeline}: {result.input_rows:,} rows in {result.batches} batches, "
              f"{result.dead_letters} dead letters{restarts}, stopped: {result.stopped_by} ({result.elapsed_s} s)")


FRESH_HELP = ("delete the pipeline's checkpoint first and start over from the beginning of its input (a drained "
              "pipeline takes no other start)")
WAIT_HELP = ("wait until it has happened: stopped, paused, or a new driver's query started; exit 1 if the "
             "pipeline failed or stopped first")


def cmd_server(args: argparse.Namespace) -> int:
    from headrace.server.service import run_server

    run_server(args.state_dir or config.STATE_DIR.get(), args.host, args.port, args.allow or [os.getcwd()],
               standby=args.standby)
    return 0


def _client(args: argparse.Namespace) -> Any:
    from headrace.server.client import Client

    return Client.find(args.state_dir or config.STATE_DIR.get(), args.server, args.token)


def _show_pipeline(entry: dict[str, Any]) -> str:
    restarts = f", {entry['restarts']} restart{'s' * (entry['restarts'] != 1)}" if entry["restarts"] else ""
    driver = f", driver pid {entry['pid']}" if entry["pid"] else ""
    return f"{entry['name']}: {entry['status']}{restarts}{driver} ({entry['reason']}); {entry['file']}"


def _waited(client: Any, answer: dict[str, Any], wait: bool) -> tuple[dict[str, Any], int]:
    """``answer`` (a pipeline), or with ``wait`` the pipeline once the operation the request began
    has ended; and the exit status: 1 when that operation failed."""
    operation = answer.get("operation")
    if not wait or not operation:
        return answer, 0
    ended = client.wait_for(operation["id"])
    entry = client.call("GET", client.pipeline(answer["name"]))
    if ended["status"] != "done":
        print(f"headrace: {ended['action']} of {answer['name']} failed: {ended['detail']}", file=sys.stderr)
    return {**entry, "operation": ended}, int(ended["status"] != "done")


def cmd_submit(args: argparse.Namespace) -> int:
    client = _client(args)
    body = {"file": os.path.abspath(args.file), **({"name": args.name} if args.name is not None else {}),
            **({"fresh": True} if args.fresh else {})}
    entry, status = _waited(client, client.call("POST", "/api/pipelines", body), args.wait)
    print(json.dumps(entry) if args.json else _show_pipeline(entry))
    return status


def cmd_list(args: argparse.Namespace) -> int:
    entries = _client(args).call("GET", "/api/pipelines")
    if args.json:
        print(json.dumps(entries))
    for entry in [] if args.json else entries:
        print(_show_pipeline(entry))
    if not entries and not args.json:
        print("no pipelines (headrace submit FILE starts one)")
    return 0


def cmd_pipeline_action(args: argparse.Namespace) -> int:
    client = _client(args)
    path = client.pipeline(args.name)
    if args.command == "status":
        answer = client.call("GET", path)
    elif args.command == "logs":
        print(client.call("GET", f"{path}/logs?lines={args.lines}"), end="")
        return 0
    elif args.command == "upgrade":
        answer = client.call("POST", f"{path}/upgrade", {"file": os.path.abspath(args.file)})
    else:
        flags = "&".join(f"{flag}=true" for flag in ("now", "drain", "fresh") if getattr(args, flag, False))
        answer = client.call("POST", f"{path}/{args.command}" + (f"?{flags}" if flags else ""))
    answer, status = _waited(client, answer, getattr(args, "wait", False))
    print(json.dumps(answer) if getattr(args, "json", False) else
          f"removed {args.name}" if args.command == "remove" else _show_pipeline(answer))
    return status


def cmd_query(args: argparse.Namespace) -> int:
    answer = _client(args).query(args.name, args.view, args.key, prefix=args.prefix, cursor=args.cursor,
                                 limit=args.limit, min_batch=args.min_batch, timeout=args.timeout)
    if args.json:
        print(json.dumps(answer))
        return 0
    rows = [answer] if args.key is not None else answer["rows"]
    for row in rows:
        print(f"{row['key']}\t{json.dumps(row['value'])}")
    watermark = f", watermark {answer['watermark']}" if answer.get("watermark") else ""
    print(f"(view {answer['view']} as of batch {answer['batch_id']}{watermark})")
    if answer.get("next_cursor") is not None:
        print(f"(more: --cursor {shlex.quote(answer['next_cursor'])})")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="headrace", description="Streaming pipelines in Python, run on Spark.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def runtime_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--state-dir", help=STATE_DIR_HELP)
        sub.add_argument("--master", help="Spark master URL (default: $HEADRACE_MASTER or local[*,4])")
        shown = sub.add_mutually_exclusive_group()
        shown.add_argument("--quiet", action="store_true", help="no progress display")
        shown.add_argument("--json", action="store_true", help="progress as JSON lines on stdout")
        sub.add_argument("--verbose", action="store_true",
                         help="on a failure, print Spark's own trace before headrace's one-line error (Spark's log "
                              "is in <state dir>/spark.log, or $HEADRACE_SPARK_LOG), and print headrace's log "
                              "(the Kafka clients' retries, sink failovers) as it happens")

    run = commands.add_parser("run", help="run a pipeline until its input ends or Ctrl-C",
                              description="Run FILE's pipeline; Ctrl-C or SIGTERM stops it at a batch boundary (a "
                                          "second one stops it at once), and the next run continues from its "
                                          "checkpoint. A query that fails in a way worth restarting (a crashed "
                                          "Python worker, a lost connection) is restarted from its checkpoint.",
                              epilog=RUN_EXIT_STATUSES)
    run.add_argument("target", metavar="FILE[:PIPELINE]")
    run.add_argument("--fresh", action="store_true", help="forget the checkpoint and start from the beginning")
    run.add_argument("--max-seconds", type=float, help="stop after this many seconds")
    run.add_argument("--drain", action="store_true",
                     help="end the pipeline for good: read what its sources hold now, fire every open window and "
                          "timer, and mark its checkpoint drained (a later run needs --fresh)")
    run.add_argument("--backfill", action="store_true",
                     help="first read what the sources hold now in bounded micro-batches, as fast as Spark can, then "
                          "go on live on the same checkpoint")
    run.add_argument("--restart-attempts", type=int, metavar="N",
                     help="restarts of a failed query allowed within the window (default: $HEADRACE_RESTART_ATTEMPTS "
                          "or 3; 0: never)")
    run.add_argument("--restart-window", metavar="DURATION",
                     help="the window restarts are counted in (default: $HEADRACE_RESTART_WINDOW or 10min)")
    run.add_argument("--restart-backoff", metavar="DURATION",
                     help="wait before the first restart, doubled for each further one (default: "
                          "$HEADRACE_RESTART_BACKOFF or 1s)")
    runtime_options(run)
    run.set_defaults(handler=cmd_run)

    explain = commands.add_parser("explain", help="print the DAG, its lowering to Spark and its guarantee",
                                  description="Print a pipeline's plan without running it; with "
                                              "--against-checkpoint, what a restart from its checkpoint would keep.")
    explain.add_argument("target", metavar="FILE[:PIPELINE]")
    explain.add_argument("--json", action="store_true", help="the plan (or, with --against-checkpoint, the verdict) "
                                                             "as JSON")
    explain.add_argument("--against-checkpoint", action="store_true",
                         help="say what a restart from the stored checkpoint would keep, without starting Spark "
                              "(a state dir on HDFS or S3 is read through Spark's JVM); exit status 1 when it would "
                              "be refused")
    explain.add_argument("--state-dir", help=STATE_DIR_HELP)
    explain.set_defaults(handler=cmd_explain)

    rescale = commands.add_parser("rescale", help="spread a pipeline's keyed state over N partitions",
                                  description="Rewrite a stopped pipeline's keyed state into N partitions (Spark's "
                                              "offline state repartition); the next run continues with N parallel "
                                              "state tasks and exactly the same results. Given the NAME of a "
                                              "pipeline on the server (no such file here), the server stops it at "
                                              "a batch boundary, rescales it and starts it again.")
    rescale.add_argument("target", metavar="FILE[:PIPELINE] | NAME")
    rescale.add_argument("partitions", metavar="N", type=int, help="the new number of state partitions")
    rescale.add_argument("--state-dir", help=STATE_DIR_HELP)
    rescale.add_argument("--master", help="Spark master URL (default: $HEADRACE_MASTER or local[*,4])")
    rescale.add_argument("--json", action="store_true", help="the result as JSON")
    rescale.add_argument("--wait", action="store_true", help="(a pipeline on the server) " + WAIT_HELP)
    rescale.add_argument("--server", help="(a pipeline on the server) the server's URL")
    rescale.add_argument("--token", help="(a pipeline on the server) the server's token")
    rescale.set_defaults(handler=cmd_rescale)

    validate = commands.add_parser("validate", help="check a pipeline file without starting Spark",
                                   description="Build the plan a pipeline file (or a Python file) describes: "
                                               "imports, schemas, the graph, the guarantee, without starting Spark; "
                                               "exit status 0 with a summary, 1 with the error and the file's line.")
    validate.add_argument("file", metavar="FILE.yaml")
    validate.add_argument("--json", action="store_true", help="the result (and the plan) as JSON")
    validate.add_argument("--explain", action="store_true", help="also print the plan, as headrace explain does")
    validate.set_defaults(handler=cmd_validate)

    switch = commands.add_parser(
        "switch", help="move readers to another version of an output, atomically",
        description="Point NAME at TARGET in one step: a PostgreSQL view at a table (with --dsn), or a symbolic "
                    "link at a folder; or, with --batch/--live/--time/--cutoff, make NAME a Lambda serving view: "
                    "the batch table's rows before the cut-off and the live table's from it on.")
    switch.add_argument("name", metavar="NAME", help="the view (with --dsn) or link readers read")
    switch.add_argument("target", metavar="TARGET", nargs="?", help="the table (with --dsn) or folder to point at")
    switch.add_argument("--dsn", help="the PostgreSQL database of the view (a libpq connection string or URL)")
    switch.add_argument("--batch", help="a serving view's batch table (history before the cut-off)")
    switch.add_argument("--live", help="a serving view's live table (from the cut-off on)")
    switch.add_argument("--time", help="a serving view's time column")
    switch.add_argument("--cutoff", help="a serving view's cut-off time, such as 2026-11-01T00:00:00Z")
    switch.set_defaults(handler=cmd_switch)

    init = commands.add_parser("init", help="create a pipeline project: a pipeline file, a Python step, a test",
                               description="Create DIR with pipeline.yaml, the Python module of its step, sample "
                                           "input, a test that runs the pipeline with the test kit, and a README.")
    init.add_argument("directory", metavar="DIR", help="a new (or empty) directory")
    init.set_defaults(handler=cmd_init)

    demo = commands.add_parser("demo", help="run the Yahoo Streaming Benchmark pipeline on generated events",
                               description="Generated ad events -> views -> join campaigns -> count per campaign "
                                           "per 10 s window, printed to the console.")
    demo.add_argument("--variant", choices=["native", "python"], default="native")
    demo.add_argument("--limit", type=int, default=3_000_000, help="events to generate (default 3,000,000)")
    runtime_options(demo)
    demo.set_defaults(handler=cmd_demo)
    server = commands.add_parser("server", help="serve the REST API that runs and supervises submitted pipelines",
                                 description="Run pipelines submitted to it, each in a driver process of its own, "
                                             "restarted from its checkpoint when it dies (docs/control-plane.md). "
                                             "Ctrl-C or SIGTERM stops the server; its pipelines go on running.")
    server.add_argument("--state-dir", help="where the server keeps its registry, its token and the pipelines' "
                                            "state (default: $HEADRACE_STATE_DIR or .headrace)")
    server.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1)")
    server.add_argument("--port", type=int, default=8790, help="the port (default 8790; 0: any free one)")
    server.add_argument("--allow", action="append", metavar="DIR",
                        help="a directory submitted pipeline files may be in (repeat for more; default: the "
                             "directory the server starts in)")
    server.add_argument("--standby", action=argparse.BooleanOptionalAction, default=True,
                        help="keep a warm standby driver (Spark's JVM and session, Python workers started) to take "
                             "the next pipeline to start, a restart after a crash above all (default; "
                             "--no-standby saves its JVM's memory)")
    server.set_defaults(handler=cmd_server)

    def client_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--server", help="the server's URL (default: $HEADRACE_SERVER, or the state dir's "
                                          "server.json)")
        sub.add_argument("--token", help="the server's token (default: $HEADRACE_TOKEN, or the state dir's "
                                         "server.token)")
        sub.add_argument("--state-dir", help="the server's state dir, to find it (default: $HEADRACE_STATE_DIR "
                                             "or .headrace)")

    submit = commands.add_parser("submit", help="run a pipeline file on the server (idempotent)")
    submit.add_argument("file", metavar="FILE")
    submit.add_argument("--name", help="the pipeline's name on the server (default: the pipeline's own)")
    submit.add_argument("--fresh", action="store_true", help=FRESH_HELP)
    submit.add_argument("--json", action="store_true", help="the answer as JSON")
    submit.add_argument("--wait", action="store_true", help=WAIT_HELP)
    client_options(submit)
    submit.set_defaults(handler=cmd_submit)
    listing = commands.add_parser("list", help="the server's pipelines and their status")
    listing.add_argument("--json", action="store_true", help="the answer as JSON")
    client_options(listing)
    listing.set_defaults(handler=cmd_list)
    for action, text in (("status", "one pipeline's status on the server"),
                         ("stop", "stop a pipeline on the server at a batch boundary (--now: at once; --drain: "
                                  "fire every window and end it for good)"),
                         ("pause", "stop consuming at a batch boundary, keeping the checkpoint"),
                         ("resume", "go on from a paused pipeline's checkpoint"),
                         ("restart", "restart a pipeline on the server from its checkpoint"),
                         ("upgrade", "run another file's version of a pipeline from its checkpoint, when the "
                                     "compatibility rules allow it"),
                         ("logs", "the end of a pipeline's driver log"),
                         ("remove", "forget a stopped pipeline (its state dir stays)")):
        sub = commands.add_parser(action, help=text)
        sub.add_argument("name", metavar="NAME")
        if action == "upgrade":
            sub.add_argument("file", metavar="FILE", help="the pipeline's new file")
        if action not in ("logs", "remove"):
            sub.add_argument("--json", action="store_true", help="the answer as JSON")
        if action in ("stop", "pause", "resume", "restart", "upgrade"):
            sub.add_argument("--wait", action="store_true", help=WAIT_HELP)
        if action == "stop":
            ending = sub.add_mutually_exclusive_group()
            ending.add_argument("--now", action="store_true", help="stop at once, not at a batch boundary")
            ending.add_argument("--drain", action="store_true",
                                help="end it for good: read what its sources hold now, fire every open window and "
                                     "timer, then finish (headrace run --drain)")
        if action == "restart":
            sub.add_argument("--fresh", action="store_true", help=FRESH_HELP)
        if action == "logs":
            sub.add_argument("--lines", type=int, default=200, help="how many of the last lines (default 200)")
        client_options(sub)
        sub.set_defaults(handler=cmd_pipeline_action)
    query = commands.add_parser("query", help="read a pipeline's queryable view on the server: one key, or the "
                                              "keys with a prefix",
                                description="Prints each row as its key and its JSON, then the batch and watermark "
                                            "the answer is as of. A key is its columns' values as text joined by |.")
    query.add_argument("name", metavar="NAME", help="the pipeline")
    query.add_argument("view", metavar="VIEW", help="the view (its sink step's name)")
    query.add_argument("key", metavar="KEY", nargs="?", help="one key (default: a page of every key)")
    query.add_argument("--prefix", default="", help="only the keys starting with it")
    query.add_argument("--cursor", help="the page after this key (as the last answer printed)")
    query.add_argument("--limit", type=int, help="rows per page (default 100, at most 1000)")
    query.add_argument("--min-batch", type=int, help="wait until the view has applied this batch")
    query.add_argument("--timeout", type=float, help="how long --min-batch waits, in seconds (default 10)")
    query.add_argument("--json", action="store_true", help="the answer as JSON")
    client_options(query)
    query.set_defaults(handler=cmd_query)
    return parser


def show_logs_on_stderr() -> None:
    """``--verbose``: headrace's loggers (the Kafka clients' log, sink failovers) on stderr from INFO."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("headrace: %(name)s: %(message)s"))
    logger = logging.getLogger("headrace")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):
        show_logs_on_stderr()
    try:
        with stop_on_signals(args.command in RUNS_PIPELINES):
            status = int(args.handler(args))
            sys.stdout.flush()  # here, where a reader that left is noticed (headrace explain FILE | head)
            return status
    except BrokenPipeError:
        _drop_stdout()
        return SIGPIPE_STATUS
    except UsageError as exc:
        print(f"headrace: error: {exc}", file=sys.stderr)
        return 2
    except HeadraceError as exc:
        if getattr(args, "verbose", False) and exc.trace:
            print(exc.trace, file=sys.stderr)
        for error in getattr(exc, "errors", [exc]):  # a pipeline file's errors, one per line
            print(f"headrace: {error}", file=sys.stderr)
        return REFUSED_EXIT_STATUS if exc.refusal and args.command in RUNS_PIPELINES else 1
    except KeyboardInterrupt as exc:
        print(f"headrace: {exc or 'interrupted'}", file=sys.stderr)
        return 130


def _drop_stdout() -> None:
    """The reader of stdout left: what is still buffered goes nowhere, with no error at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
