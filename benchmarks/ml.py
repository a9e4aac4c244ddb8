"""Scoring a stream with a published model: headrace's score step against the same model applied
by hand in plain PySpark, in the same process, on the same Parquet files.

    .venv/bin/python benchmarks/ml.py                 # 1,000,000 rows in 10 files, 3 runs each
    .venv/bin/python benchmarks/ml.py --rows 100000   # smaller

* **scikit-learn**: a logistic regression over four features, trained on 10,000 rows and
  published (``hr.ml.publish``). headrace: ``Files`` (Parquet, bounded, a file per micro-batch)
  -> ``score(registry)`` -> ``Null`` sink. By hand: ``spark.readStream.parquet`` (a file per
  micro-batch) -> ``mapInArrow`` with the same model (``predict_proba`` and ``predict`` per Arrow
  batch, the model sent with the function) -> Spark's ``noop`` writer, ``availableNow``.
* **Spark MLlib**: a ``PipelineModel`` (a vector assembler and a logistic regression) trained on
  the same rows. headrace: the same pipeline with the MLlib version published. By hand: the
  model's own ``transform`` on the stream, its probability's second value taken as the score.

Each side runs ``--runs`` times, taking turns to go first, each timed from its progress reports
(``benchmarks/common.py``); the fastest run of each counts. The ratio is the hand-written
pipeline's time over headrace's (1: as fast). Prints ``ml ratio=<x>`` and ``ml mllib_ratio=<y>``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import headrace as hr  # noqa: E402
from benchmarks.common import alternating, fresh_dir, processing_seconds  # noqa: E402
from headrace.environment.session import get_session  # noqa: E402
from headrace.runtime.runner import PipelineRun  # noqa: E402

FEATURES = ["x1", "x2", "x3", "x4"]
FILES = 10


def write_rows(folder: str, rows: int, seed: int = 0) -> pd.DataFrame:
    """``rows`` rows of four features and a label, in FILES Parquet files; returns a sample of 10,000."""
    generator = np.random.default_rng(seed)
    per_file = rows // FILES
    for number in range(FILES):
        x = generator.normal(size=(per_file, 4))
        frame = pd.DataFrame(x, columns=FEATURES)
        frame.insert(0, "id", np.arange(number * per_file, (number + 1) * per_file))
        frame["label"] = (x @ [1.0, -2.0, 0.5, 0.0] + generator.normal(scale=0.5, size=per_file) > 0).astype("int64")
        path = os.path.join(folder, f"part-{number:02d}.parquet")
        frame.to_parquet(path, index=False)
        os.utime(path, (1_700_000_000 + number, 1_700_000_000 + number))  # read in order
    return pd.read_parquet(os.path.join(folder, "part-00.parquet")).head(10_000)


def headrace_seconds(folder: str, registry: str, workdir: str) -> float:
    p = hr.Pipeline("ml_score")
    (p.source("rows", hr.sources.Files(folder, "parquet", bounded=True, max_files_per_batch=1))
     .score(registry, features=FEATURES)
     .sink("out", hr.sinks.Null()))
    result = PipelineRun(p, state_dir=fresh_dir(workdir, "state"), progress="quiet", fresh=True).start().wait()
    return processing_seconds(result.progress)


def by_hand_seconds(spark: Any, folder: str, score: Any, workdir: str) -> float:
    stream = spark.readStream.schema("id long, x1 double, x2 double, x3 double, x4 double, label long").option(
        "maxFilesPerTrigger", 1).parquet(folder)

    def write(df: Any, _batch: int) -> None:
        df.write.format("noop").mode("overwrite").save()

    query = (score(stream).writeStream.foreachBatch(write).trigger(availableNow=True)
             .option("checkpointLocation", fresh_dir(workdir, "hand")).start())
    query.awaitTermination()
    return processing_seconds([dict(p) for p in query.recentProgress])


def sklearn_by_hand(model: Any) -> Any:
    """The hand-written scoring: ``mapInArrow`` with the model sent along with the function."""
    import pyarrow as pa

    def score_batches(batches: Any) -> Any:
        for batch in batches:
            rows = batch.select(FEATURES).to_pandas()
            probability = model.predict_proba(rows)[:, 1]
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(probability), pa.array(model.predict(rows))],
                                             names=[*batch.schema.names, "score", "prediction"])

    schema = "id long, x1 double, x2 double, x3 double, x4 double, label long, score double, prediction long"
    return lambda stream: stream.mapInArrow(score_batches, schema)


def mllib_by_hand(model: Any) -> Any:
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    def score(stream: Any) -> Any:
        scored = model.transform(stream)
        return scored.select(*stream.columns, vector_to_array(F.col("probability"))[1].alias("score"),
                             F.col("prediction"))
    return score


def compare(spark: Any, name: str, folder: str, registry: str, by_hand: Any, runs: int, workdir: str) -> float:
    best: dict[str, float] = {}
    for order in alternating(["headrace", "hand"], runs):
        for who in order:
            seconds = (headrace_seconds(folder, registry, workdir) if who == "headrace"
                       else by_hand_seconds(spark, folder, by_hand, workdir))
            best[who] = min(best.get(who, seconds), seconds)
    ratio = best["hand"] / best["headrace"]
    print(f"  {name}: by hand {best['hand']:.2f} s, headrace {best['headrace']:.2f} s (best of {runs})")
    return ratio


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    from pyspark import cloudpickle
    from pyspark.ml import Pipeline
    from pyspark.ml.classification import LogisticRegression as SparkLogisticRegression
    from pyspark.ml.feature import VectorAssembler
    from sklearn.linear_model import LogisticRegression

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark = get_session()
    workdir = tempfile.mkdtemp(prefix="headrace-ml-")
    try:
        folder = fresh_dir(workdir, "rows")
        sample = write_rows(folder, args.rows)
        print(f"ml: {args.rows:,} rows in {FILES} Parquet files, Spark {spark.version}, {os.cpu_count()} cores, "
              f"load {os.getloadavg()[0]:.1f}")
        model = LogisticRegression().fit(sample[FEATURES], sample["label"])
        sklearn_registry = os.path.join(workdir, "sklearn")
        hr.ml.publish(sklearn_registry, model, sample[FEATURES])
        ratio = compare(spark, "scikit-learn", folder, sklearn_registry, sklearn_by_hand(model), args.runs, workdir)
        training = spark.createDataFrame(sample)
        mllib = Pipeline(stages=[VectorAssembler(inputCols=FEATURES, outputCol="features"),
                                 SparkLogisticRegression(labelCol="label")]).fit(training)
        mllib_registry = os.path.join(workdir, "mllib")
        hr.ml.publish(mllib_registry, mllib, training.select(*FEATURES))
        mllib_ratio = compare(spark, "Spark MLlib", folder, mllib_registry, mllib_by_hand(mllib), args.runs, workdir)
        print(f"ml ratio={ratio:.2f} mllib_ratio={mllib_ratio:.2f}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
