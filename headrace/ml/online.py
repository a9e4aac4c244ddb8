"""Online learning in keyed state (``keyed.learn``): a River model per key, kept in the process
step's state, that predicts each record and then learns from it.

For each key, the micro-batch's records are taken in event-time order (the arrival order of
records with the same time). For each record, the model predicts the label from the features,
the prequential metric (scored on predictions made before learning) takes the prediction and
the label, the drift detector (ADWIN, when asked for) takes the error, and the model learns
the record. The model, the metric, the detector and the count of records seen are the key's
state: a restart goes on from the last committed micro-batch, exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.process import Context, KeyedProcessFunction
from headrace.state import ValueState

PREDICTION, METRIC, DRIFT, SEEN = "prediction", "metric", "drift", "seen"


class OnlineLearner(KeyedProcessFunction):
    """The process function behind ``keyed.learn`` (docs/ml.md)."""

    records_in_event_time_order = True  # ProcessLogic hands each key's records over sorted by time
    model = ValueState()
    metric = ValueState()
    detector = ValueState()
    seen = ValueState(default=0)

    def __init__(self, model_factory: Callable[[], Any], label: str, features: list[str],
                 metric_factory: Callable[[], Any], detect_drift: bool, keys: list[str], time: str | None) -> None:
        self.model_factory, self.label, self.features = model_factory, label, features
        self.metric_factory, self.detect_drift, self.keys, self.time = metric_factory, detect_drift, keys, time

    def process(self, record: dict[str, Any], ctx: Context) -> None:
        model = self.model.get() or self.model_factory()
        metric = self.metric.get() or self.metric_factory()
        x = {name: record[name] for name in self.features}
        y = record[self.label]
        predicted = model.predict_one(x)
        if predicted is not None:
            metric.update(y, predicted)
        drift = False
        if self.detect_drift:
            drift = self._drifted(y, predicted)
        model.learn_one(x, y)
        self.model.set(model)
        self.metric.set(metric)
        self.seen.set(self.seen.get() + 1)
        keys = ctx.key if len(self.keys) > 1 else (ctx.key,)
        timed = {self.time: record[self.time]} if self.time else {}
        ctx.emit({**dict(zip(self.keys, keys)), **timed, self.label: y, PREDICTION: predicted,
                  METRIC: float(metric.get()), DRIFT: drift, SEEN: self.seen.get()})

    def _drifted(self, y: Any, predicted: Any) -> bool:
        """ADWIN on the error (a wrong class: 1; a regression: the absolute error): a change it
        finds counts as drift only when the error rose."""
        from river import drift

        detector = self.detector.get() or {"adwin": drift.ADWIN(), "mean": 0.0}
        if isinstance(y, (int, float)) and not isinstance(y, bool) and isinstance(predicted, float):
            error = abs(float(y) - predicted)
        else:
            error = float(predicted != y)
        before = detector["adwin"].estimation
        detector["adwin"].update(error)
        rose = detector["adwin"].drift_detected and detector["adwin"].estimation > before
        self.detector.set(detector)
        return bool(rose)
