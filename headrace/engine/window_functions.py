"""What a window computes from its records, free of Spark: the :class:`WindowFunction`
protocol (create, add, merge, result) and its four kinds - built-in aggregates, a reduce
function, a user's ``hr.AggregateFunction``, or a process-window function that sees all the
window's records and its bounds. :class:`~headrace.engine.window_panes.WindowLogic` keeps
one accumulator per pane and calls these.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headrace.aggregates import Agg, AggregateFunction


class WindowFunction:
    """How a window turns records into a result: create, add, merge and result."""

    # True when ``add`` has no side effects and does not fail on a record the plan accepted, so
    # that a tumbling count window may fold each record in as it arrives instead of keeping the
    # records until the window is full (the result is the same either way).
    incremental: bool = False

    def create(self) -> Any:
        raise NotImplementedError

    def add(self, accumulator: Any, record: dict[str, Any]) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, accumulator: Any, key: Any, window: tuple[int | None, int | None]) -> list[dict[str, Any]]:
        """The output records of one pane (usually one)."""
        raise NotImplementedError


class BuiltinAggregates(WindowFunction):
    """count, sum, min, max and mean over columns; the accumulator is one list per aggregate."""

    incremental = True

    def __init__(self, aggs: tuple[tuple[str, Agg], ...]) -> None:
        self.aggs = aggs

    def create(self) -> list[Any]:
        return [[0, 0] if agg.func in ("count", "mean") else None for _, agg in self.aggs]

    def add(self, acc: list[Any], record: dict[str, Any]) -> list[Any]:
        for i, (_, agg) in enumerate(self.aggs):
            value = record.get(agg.column) if agg.column else 1
            if value is None:
                continue
            if agg.func == "count":
                acc[i][0] += 1
            elif agg.func == "mean":
                acc[i] = [acc[i][0] + value, acc[i][1] + 1]
            elif acc[i] is None:
                acc[i] = value
            elif agg.func == "sum":
                acc[i] += value
            elif agg.func == "min":
                acc[i] = min(acc[i], value)
            elif agg.func == "max":
                acc[i] = max(acc[i], value)
        return acc

    def add_columns(self, acc: list[Any], columns: dict[str, list[Any]], start: int, stop: int) -> list[Any]:
        """``add`` for the records ``start:stop`` of a micro-batch given as columns (nulls as None),
        with the same result as adding them one by one, in order."""
        for i, (_, agg) in enumerate(self.aggs):
            if agg.column is None:
                acc[i][0] += stop - start
                continue
            values = [v for v in columns[agg.column][start:stop] if v is not None]
            if not values:
                continue
            if agg.func == "count":
                acc[i][0] += len(values)
            elif agg.func == "mean":
                acc[i] = [sum(values, acc[i][0]), acc[i][1] + len(values)]
            elif agg.func == "sum":
                acc[i] = sum(values[1:], values[0]) if acc[i] is None else sum(values, acc[i])
            elif agg.func == "min":
                acc[i] = min(values) if acc[i] is None else min([acc[i], *values])
            elif agg.func == "max":
                acc[i] = max(values) if acc[i] is None else max([acc[i], *values])
        return acc

    def merge(self, a: list[Any], b: list[Any]) -> list[Any]:
        merged = []
        for (_, agg), x, y in zip(self.aggs, a, b):
            if agg.func in ("count", "mean"):
                merged.append([x[0] + y[0], x[1] + y[1]])
            elif x is None or y is None:
                merged.append(y if x is None else x)
            else:
                merged.append({"sum": x + y, "min": min(x, y), "max": max(x, y)}[agg.func])
        return merged

    def result(self, acc: list[Any], key: Any, window: Any) -> list[dict[str, Any]]:
        out: dict[str, Any] = {}
        for (name, agg), value in zip(self.aggs, acc):
            if agg.func == "count":
                out[name] = value[0]
            elif agg.func == "mean":
                out[name] = value[0] / value[1] if value[1] else None
            else:  # a sum, min or max of no values (none, or all null) is null, as in SQL
                out[name] = value
        return [out]


class ReduceWindow(WindowFunction):
    """Flink's reduce: ``fn(accumulated, record) -> record``."""

    def __init__(self, fn: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], fields: list[str]) -> None:
        self.fn, self.fields = fn, fields

    def create(self) -> Any:
        return None

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        record = {f: record.get(f) for f in self.fields}
        return record if acc is None else {f: v for f, v in self.fn(dict(acc), record).items() if f in self.fields}

    def merge(self, a: Any, b: Any) -> Any:
        return b if a is None else a if b is None else self.add(a, b)

    def result(self, acc: Any, key: Any, window: Any) -> list[dict[str, Any]]:
        return [] if acc is None else [acc]


class UserAggregate(WindowFunction):
    """A user's ``hr.AggregateFunction``: its ``result(accumulator)`` is the pane's one record."""

    def __init__(self, function: AggregateFunction) -> None:
        self.function = function

    def create(self) -> Any:
        return self.function.create()

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        return self.function.add(acc, record)

    def merge(self, a: Any, b: Any) -> Any:
        return self.function.merge(a, b)

    def result(self, acc: Any, key: Any, window: Any) -> list[dict[str, Any]]:
        return [self.function.result(acc)]


class ProcessWindow(WindowFunction):
    """``fn(key, (start, end), records) -> iterable of dicts``, given every record of the pane."""

    incremental = True  # add only keeps the record; fn sees the pane's records when it fires

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def create(self) -> list[dict[str, Any]]:
        return []

    def add(self, acc: list[dict[str, Any]], record: dict[str, Any]) -> list[dict[str, Any]]:
        acc.append(record)
        return acc

    def merge(self, a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return a + b

    def result(self, acc: list[dict[str, Any]], key: Any, window: Any) -> list[dict[str, Any]]:
        return list(self.fn(key, window, list(acc)))
