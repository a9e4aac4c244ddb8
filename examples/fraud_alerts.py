"""A keyed process step: flag a card when a small charge is followed, within a minute of
event time, by a large one. Declared state with a time-to-live, and an event-time timer.

    python examples/fraud_alerts.py
"""

from typing import Any

import headrace as hr
from headrace.testing import TestSink, TestSource, Watermark, run_to_completion

SMALL, LARGE = 1.00, 500.00


class FraudDetector(hr.KeyedProcessFunction):
    small_charge = hr.ValueState(ttl="1h")   # the last small charge, forgotten after an hour
    alerts = hr.ValueState(default=0)          # alerts raised for this card so far

    def process(self, record: dict[str, Any], ctx: hr.Context) -> None:
        if self.small_charge.exists() and record["amount"] > LARGE:
            self.alerts.set(self.alerts.get() + 1)
            ctx.emit({"card": ctx.key, "small": self.small_charge.get(), "large": record["amount"],
                      "alert": self.alerts.get()})
            self.small_charge.clear()
        if record["amount"] < SMALL:
            self.small_charge.set(record["amount"])
            ctx.register_event_time_timer(ctx.timestamp + 60_000)   # a minute to follow it up

    def on_timer(self, timer: hr.Timer, ctx: hr.Context) -> None:
        self.small_charge.clear()   # a minute passed: the small charge no longer counts


charges = TestSource(
    [
        [{"card": "4711", "amount": 0.50, "ts": 0}, {"card": "1234", "amount": 0.10, "ts": 5_000}],
        [{"card": "4711", "amount": 900.0, "ts": 30_000}],     # within the minute: an alert
        Watermark(70_000),                                       # 1234's minute is over
        [{"card": "1234", "amount": 800.0, "ts": 71_000},      # too late for its small charge
         {"card": "4711", "amount": 0.25, "ts": 72_000}],
        [{"card": "4711", "amount": 650.0, "ts": 100_000}],    # a second alert for 4711
    ],
    schema={"card": "string", "amount": "double", "ts": "timestamp"},
)

pipeline = hr.Pipeline("fraud_alerts")
alerts = (pipeline.source("charges", charges, event_time="ts")
          .key_by("card")
          .process(FraudDetector(), schema={"card": "string", "small": "double", "large": "double", "alert": "long"}))
alerts.sink("alerts", TestSink())

if __name__ == "__main__":
    for row in run_to_completion(pipeline)["alerts"]:
        print(f"card {row['card']}: {row['small']:.2f} then {row['large']:.2f} (alert {row['alert']})")
