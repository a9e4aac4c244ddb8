"""What a running pipeline costs while no data comes: CPU seconds of its processes per minute.

    .venv/bin/python benchmarks/idle.py                  # 30 s of idling each, about 2 minutes
    .venv/bin/python benchmarks/idle.py --seconds 10

Three drivers, one after the other, each in a process group of its own, each reading a folder of
JSON lines that holds one file and gets no other: ``headrace run`` of an unbounded ``Files``
pipeline (a filter, the console sink); the same query hand-written in PySpark
(``spark.readStream.json`` to the console, Spark's settings); and that hand-written query with
Spark's ``pollingDelay`` as headrace sets it. Once a driver has printed its first micro-batch
and settled (10 s), the CPU time of it and every process below it (the JVM, Python) is read from
``/proc`` before and after ``--seconds`` of idling. Prints a line per driver and
``idle headrace_cpu_per_min=<s> pyspark_cpu_per_min=<s> ratio=<pyspark / headrace>``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
TICKS = os.sysconf("SC_CLK_TCK")

from benchmarks.common import tree_ticks  # noqa: E402

PIPELINE = """
import headrace as hr

pipeline = hr.Pipeline("idle")
orders = pipeline.source("orders", hr.sources.Files({folder!r}, format="jsonl",
                                                    schema={{"user": "string", "amount": "long"}}))
orders.filter(lambda r: r["amount"] > 0).sink("out", hr.sinks.Console())
"""

HAND_WRITTEN = """
import sys
from pyspark.sql import SparkSession, functions as F

spark = SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false").getOrCreate()
spark.sparkContext.setLogLevel("ERROR")
if sys.argv[3] != "spark":
    spark.conf.set("spark.sql.streaming.pollingDelay", sys.argv[3])
query = (spark.readStream.schema("user string, amount long").json(sys.argv[1]).where(F.col("amount") > 0)
         .writeStream.format("console").option("checkpointLocation", sys.argv[2]).start())
query.awaitTermination()
"""


def idle_cpu(command: list[str], out: str, seconds: float, env: dict[str, str]) -> float:
    """CPU seconds per minute of ``command``'s process group while idle, after its first batch."""
    with open(out, "w") as log:
        driver = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.time() + 180
        while "Batch: 0" not in open(out).read() and "batch 0" not in open(out).read():
            if driver.poll() is not None or time.time() > deadline:
                raise SystemExit(f"{command} printed no first batch:\n{open(out).read()[-2000:]}")
            time.sleep(0.5)
        time.sleep(10)
        before = tree_ticks(driver.pid) / TICKS
        time.sleep(seconds)
        return (tree_ticks(driver.pid) / TICKS - before) * 60 / seconds
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of idling measured per driver")
    args = parser.parse_args()
    from headrace.environment.session import spark_defaults

    headrace_delay = spark_defaults("local[*]")["spark.sql.streaming.pollingDelay"]
    env = {**os.environ, "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}
    work = tempfile.mkdtemp(prefix="headrace-idle-")
    folder = os.path.join(work, "in")
    os.makedirs(folder)
    with open(os.path.join(folder, "0.jsonl"), "w") as data:
        data.write(json.dumps({"user": "ana", "amount": 3}) + "\n")
    with open(os.path.join(work, "idle.py"), "w") as script:
        script.write(PIPELINE.format(folder=folder))
    with open(os.path.join(work, "hand_written.py"), "w") as script:
        script.write(HAND_WRITTEN)
    headrace = os.path.join(os.path.dirname(sys.executable), "headrace")
    figures = {}
    runs = [("headrace", [headrace, "run", os.path.join(work, "idle.py"), "--state-dir", os.path.join(work, "h")]),
            ("pyspark", [sys.executable, os.path.join(work, "hand_written.py"), folder, os.path.join(work, "p"),
                         "spark"]),
            (f"pyspark, pollingDelay {headrace_delay}",
             [sys.executable, os.path.join(work, "hand_written.py"), folder, os.path.join(work, "q"),
              headrace_delay])]
    for name, command in runs:
        figures[name] = idle_cpu(command, os.path.join(work, f"{name.split(',')[0]}.log"), args.seconds, env)
        print(f"  {name}: {figures[name]:.2f} CPU seconds per minute idle", flush=True)
    print(f"idle headrace_cpu_per_min={figures['headrace']:.2f} pyspark_cpu_per_min={figures['pyspark']:.2f} "
          f"ratio={figures['pyspark'] / max(figures['headrace'], 0.01):.2f}")


if __name__ == "__main__":
    main()
