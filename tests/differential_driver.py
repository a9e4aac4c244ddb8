"""A driver process for the SIGKILL variant of the differential test (tests/test_differential.py):
the pipeline of a pickled spec (tests/model/spec.py), from its input files to its file sinks, until
SIGTERM.

    python tests/differential_driver.py '{"name": ..., "spec": ..., "folder": ..., "state_dir": ..., "out": ...}'
"""

from __future__ import annotations

import pickle
from pathlib import Path

from driver_process import driver_main
from model.build import build


def pipeline(args: dict) -> object:
    with open(args["spec"], "rb") as handle:
        spec = pickle.load(handle)
    built = build(spec, args["name"], Path(args["folder"]))
    return built.pipeline


if __name__ == "__main__":
    driver_main(pipeline)
