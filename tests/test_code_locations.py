"""User code keeps its file and line in errors after it was pickled by value for Spark's workers
(cloudpickle 3.1.3+ names the file of such code ``<dynamic-code>``)."""

import sys

import cloudpickle
import pytest

import headrace as hr
import headrace.testing  # noqa: F401
from headrace.code_locations import function_label, user_location

pytestmark = pytest.mark.fast  # needs no JVM and no service


class Shouter:
    def process(self, record):
        return user_location()


def double(record: dict) -> dict:
    return {"value": record["value"] * 2}


def _by_value(obj):
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        return cloudpickle.loads(cloudpickle.dumps(obj))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])


def test_labels_recorded_when_the_plan_is_built_survive_pickling_by_value():
    p = hr.Pipeline("labels")
    source = p.source("in", hr.testing.TestSource([[{"value": 1}]], schema={"value": "long"}))
    source.map(double, schema={"value": "long"}).sink("out", hr.testing.TestSink())
    shipped = _by_value(double)
    assert function_label(shipped) == f"double at test_code_locations.py:{double.__code__.co_firstlineno}"


def test_a_method_of_a_shipped_class_names_the_users_file_and_line():
    from headrace.code_locations import remember_definitions

    remember_definitions(Shouter())
    shipped = _by_value(Shouter)
    line = Shouter.process.__code__.co_firstlineno
    assert function_label(shipped.process) == f"Shouter.process at test_code_locations.py:{line}"
    assert shipped().process({}) == f"test_code_locations.py:{line + 1}"
