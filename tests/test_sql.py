"""SQL steps (``p.sql``): plan-time checks without Spark, then queries run on Spark and checked
against the same result computed in plain Python."""

from __future__ import annotations

import datetime
import inspect
import runpy
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import headrace as hr
from headrace.plan.sql_query import Position, rewrite, show, top_n_as_aggregate_query
from headrace.runtime.compatibility import compare, plan_record
from headrace.spark.specs import output_mode, spec_of
from headrace.spark.writer import shared_root
from headrace.testing import TestSink, TestSource, Watermark, run_to_completion

ROOT = Path(__file__).resolve().parents[1]
CLICKS = {"user": "string", "url": "string", "ts": "timestamp"}
MINUTE = 60_000
UTC = datetime.UTC


def next_line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def at(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=UTC)


def clicks_pipeline(name: str, batches: list | None = None, *, event_time: bool = True) -> hr.Pipeline:
    p = hr.Pipeline(name)
    p.source("clicks", TestSource(batches or [], schema=CLICKS), event_time="ts" if event_time else None,
             max_out_of_orderness="30s" if event_time else 0)
    return p


# -- plan time: what the query is, and the errors that point at it -----------------------------------

@pytest.mark.fast
def test_the_query_decides_how_the_step_runs():
    p = clicks_pipeline("shapes")
    p.table("users", [{"user": "u1", "country": "fr"}])
    windowed = p.sql("SELECT window, url, count(*) AS n FROM clicks GROUP BY window(ts, '1 minute'), url")
    stateless = p.sql("SELECT c.user, c.ts, u.country FROM clicks c JOIN users u ON c.user = u.user")
    grouped = p.sql("SELECT url, count(*) AS n FROM clicks GROUP BY url")
    assert [s.node.shape for s in (windowed, stateless, grouped)] == ["windowed aggregate", "stateless", "aggregate"]
    assert windowed.node.inputs == ("clicks_event_time",)  # a source's name reads it with its event time
    assert stateless.node.inputs == ("clicks_event_time", "users")
    assert stateless.node.event_time == "ts"  # c.ts passes through: a fluent window can follow
    assert grouped.node.event_time is None
    specs = [spec_of(s.node) for s in (windowed, stateless, grouped)]
    assert [(s.per_batch, s.stateful, s.reads_watermark) for s in specs] == [
        (False, True, True), (True, False, False), (False, True, False)]
    assert [s.output_mode(n.node) for s, n in zip(specs, (windowed, stateless, grouped))] == ["append", None, "update"]


@pytest.mark.parametrize(("query", "each_record"), [
    ("SELECT user, upper(url) AS url, date_format(ts, 'HH:mm') AS hm FROM clicks", True),
    ("SELECT * FROM clicks c", True),
    ("SELECT user FROM clicks WHERE url <> ''", False),
    ("SELECT c.user, u.country FROM clicks c JOIN users u ON c.user = u.user", False),
    ("SELECT explode(split(url, '/')) AS part FROM clicks", False),
    ("SELECT part FROM clicks LATERAL VIEW explode(split(url, '/')) t AS part", False),
    ("SELECT user FROM (SELECT user FROM clicks)", False),
    ("SELECT user, (SELECT max(country) FROM users) AS c FROM clicks", False),
    ("SELECT user FROM clicks TABLESAMPLE (10 PERCENT)", False),
])
@pytest.mark.fast
def test_a_query_that_only_projects_its_stream_gives_a_row_per_record(query, each_record):
    """Only a projection of one stream is counted as its input (``headrace/spark/step_counts.py``):
    a filter, a join, a generator, a nested query or a sample can change the number of rows."""
    p = clicks_pipeline("projections")
    p.table("users", [{"user": "u1", "country": "fr"}])
    assert p.sql(query).node.each_record is each_record


@pytest.mark.fast
def test_a_syntax_error_names_the_step_its_line_and_the_query_line_and_column():
    p = clicks_pipeline("syntax")
    line = next_line() + 1
    with pytest.raises(hr.PlanError) as error:
        p.sql("SELECT url, count(*) AS n\nFROM clicks\nGROUP url", name="bad_group")
    message = str(error.value)
    assert message.startswith(f"step 'bad_group' (test_sql.py:{line}): syntax error in the query")
    assert "at line 3, column 7 of the query:" in message
    assert message.endswith("    3 | GROUP url\n      |       ^^^")


@pytest.mark.fast
def test_an_unknown_name_lists_the_pipelines_streams_and_tables():
    p = clicks_pipeline("unknown")
    p.table("users", [{"user": "u1", "country": "fr"}])
    line = next_line() + 1
    with pytest.raises(hr.PlanError) as error:
        p.sql("SELECT *\nFROM clicks c\nJOIN userz u ON c.user = u.user", name="enrich")
    message = str(error.value)
    assert message.startswith(f"step 'enrich' (test_sql.py:{line}): unknown stream or table 'userz'; pipeline "
                              "'unknown' has the streams clicks, clicks_event_time and the tables users")
    assert "at line 3, column 6 of the query:" in message
    assert message.endswith("    3 | JOIN userz u ON c.user = u.user\n      |      ^^^^^")


@pytest.mark.fast
def test_a_window_on_a_stream_without_event_time_is_refused():
    p = clicks_pipeline("no_time", event_time=False)
    line = next_line() + 1
    with pytest.raises(hr.PlanError) as error:
        p.sql("SELECT window, count(*) AS n FROM clicks GROUP BY window(ts, '1 minute')", name="per_minute")
    message = str(error.value)
    assert message.startswith(f"step 'per_minute' (test_sql.py:{line}): window() needs event time, and the stream "
                              "'clicks' has none: declare it with .with_event_time('field', max_out_of_orderness)")
    assert "at line 1, column 51 of the query:" in message


@pytest.mark.parametrize("query, message", [
    ("SELECT window, count(*) FROM clicks GROUP BY window(user, '1 minute')",
     r"window\(\) must read the event-time field 'ts' of stream 'clicks_event_time'.*it reads user"),
    ("SELECT * FROM clicks ORDER BY ts", "ORDER BY is not supported on a stream"),
    ("SELECT * FROM clicks LIMIT 3", "LIMIT is not supported"),
    ("SELECT url, max(ts) OVER (PARTITION BY user) FROM clicks", r"OVER \(...\) window functions"),
    ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user ORDER BY ts) AS rn FROM clicks) WHERE rn > 3",
     r"OVER \(...\) window functions are not supported on a stream \(Spark refuses non-time windows on streaming "
     r"queries\), but for the first N rows per key: SELECT ... FROM \(SELECT ..., ROW_NUMBER\(\) OVER"),
    ("SELECT sum(DISTINCT amount) FROM clicks", r"a stream takes COUNT\(DISTINCT one_column\)"),
    ("SELECT count(DISTINCT user, url) FROM clicks", r"for several columns count DISTINCT struct\(a, b\)"),
    ("SELECT DISTINCT url, count(*) FROM clicks GROUP BY url",
     "DISTINCT on the result of GROUP BY or an aggregate is a second aggregation"),
    ("SELECT u FROM (SELECT DISTINCT user AS u FROM clicks)", "DISTINCT in a nested query"),
    ("SELECT url, count(*) AS n FROM clicks GROUP BY url HAVING count(*) < 3",
     "HAVING on a GROUP BY without a window is not supported on a stream: the query runs in update mode"),
    ("SELECT * FROM (SELECT url, count(*) AS n FROM clicks GROUP BY url) WHERE n < 3",
     "a WHERE on the results of a GROUP BY without a window is not supported"),
    ("SELECT n, count(*) FROM (SELECT url, count(*) AS n FROM clicks GROUP BY url) GROUP BY n",
     "the query aggregates twice"),
    ("SELECT n, count(*) FROM (SELECT url, window, count(*) AS n FROM clicks GROUP BY url, window(ts, '1 minute')) "
     "GROUP BY n", r"the query aggregates twice .*, and not each in windows; .* group each by window\(...\), the "
     r"later ones over window_time\(<the earlier window>\) or by the earlier window itself"),
    ("SELECT count(*) FROM (SELECT url, window, count(*) AS n FROM clicks GROUP BY url, window(ts, '1 minute')) "
     "GROUP BY window(url, '1 hour')", r"window\(\) must read the event-time field 'ts' .*it reads url"),
    ("SELECT c.user FROM clicks c JOIN (SELECT max(ts) AS latest, window.end AS ended FROM clicks "
     "GROUP BY window(ts, '1 minute')) l ON c.ts = l.latest AND c.ts BETWEEN l.ended - INTERVAL 1 MINUTE AND l.ended",
     r"the join equates the event time c.ts of stream 'c' with an aggregate's result: .* Compare the times as "
     r"numbers instead, e.g. unix_micros\(c.ts\) = unix_micros\(...\)"),
    ("SELECT c.user FROM clicks c JOIN (SELECT max(ts) AS latest, window.end AS ended FROM clicks "
     "GROUP BY window(ts, '1 minute')) l ON c.ts BETWEEN l.ended - INTERVAL 1 MINUTE AND l.ended",
     r"a join of streams needs an equality between them \(ON a.key = b.key AND ...\)"),
    ("SELECT * FROM users", "the query reads no stream, only tables"),
    ("SELECT * FROM clicks JOIN clicks_event_time USING (user)",
     "the join of stream 'clicks_event_time' is not bounded in event time from below and above by another "
     "stream's: Spark would keep every record of both sides in its state forever"),
    ("SELECT * FROM clicks UNION ALL SELECT * FROM clicks", "UNION, INTERSECT and EXCEPT are not supported"),
    ("SELECT * FROM out", "'out' is a sink; a query reads sources, steps and tables"),
    ("INSERT INTO x SELECT 1", r"an SQL step runs a query \(SELECT ...\), not an INSERT statement"),
    ("SELECT 1 FROM clicks; SELECT 2 FROM clicks", "give one query, not 2 statements"),
    ("SELECT 'open FROM clicks", "is a quote or a backtick left open"),
    ("   ", "sql needs a query string"),
])
@pytest.mark.fast
def test_what_a_streaming_query_cannot_do_is_refused_with_the_reason(query, message):
    p = clicks_pipeline("limits")
    p.table("users", [{"user": "u1", "country": "fr"}])
    p.source("other", TestSource([], schema=CLICKS)).sink("out", TestSink())
    with pytest.raises(hr.PlanError, match=message):
        p.sql(query, name="q")


@pytest.mark.fast
def test_an_aggregate_of_an_aggregate_is_refused_across_steps():
    p = clicks_pipeline("twice")
    p.sql("SELECT url, count(*) AS n FROM clicks GROUP BY url", name="per_url")
    with pytest.raises(hr.PlanError, match=r"step 'histogram' \(test_sql.py:\d+\): it reads the results of SQL step "
                                           r"'per_url' \(test_sql.py:\d+\), which emits updates \(Spark's update "
                                           r"mode\), and Spark runs stateful steps one after another in one query "
                                           "only in append mode"):
        p.sql("SELECT n, count(*) AS urls FROM per_url GROUP BY n", name="histogram")


@pytest.mark.fast
def test_explain_shows_the_sql_step_and_how_it_is_lowered():
    p = clicks_pipeline("explained")
    p.sql("SELECT window, url, count(*) AS n\n  FROM clicks\n GROUP BY window(ts, '1 minute'), url",
          name="per_minute").sink("out", TestSink())
    text = p.explain()
    assert "one Spark streaming query, output mode append" in text
    assert ("per_minute         SQL windowed aggregate: SELECT window, url, count(*) AS n FROM clicks GROUP BY "
            "window(ts, '1 ... <- clicks_event_time") in text
    assert ("lowered as: Spark SQL over temp views of clicks_event_time: native window aggregate, append mode (a "
            "window is emitted once the watermark passes its end)") in text
    node = next(n for n in p.to_json()["nodes"] if n["name"] == "per_minute")
    assert (node["kind"], node["shape"], node["reads"]) == ("sql", "windowed aggregate",
                                                             {"clicks": "clicks_event_time"})


@pytest.mark.fast
def test_an_sql_aggregate_is_state_identity_for_restarts():
    def build(name: str, query: str) -> hr.Pipeline:
        p = clicks_pipeline("restart")
        p.sql(query, name=name).sink("out", TestSink())
        return p

    counted = "SELECT url, count(*) AS n FROM clicks GROUP BY url"
    stored = plan_record(build("per_url", counted).plan)
    assert compare(stored, plan_record(build("per_url", counted.replace("n FROM", "clicks FROM")).plan)).allowed
    renamed = compare(stored, plan_record(build("by_url", counted).plan))
    assert not renamed.allowed and "stateful step 'per_url' (sql" in renamed.message()
    windowed = "SELECT window, count(*) AS n FROM clicks GROUP BY window(ts, '1 minute')"
    reshaped = compare(stored, plan_record(build("per_url", windowed).plan))
    assert not reshaped.allowed and "query shape aggregate → windowed aggregate" in reshaped.message()


@pytest.mark.fast
def test_a_windowed_query_keeps_a_pipeline_out_of_real_time_mode():
    p = hr.Pipeline("sql_real_time", trigger="real-time")
    p.source("orders", hr.sources.Kafka("orders", schema="user string, t timestamp"), event_time="t")
    p.sql("SELECT window, user, count(*) AS n FROM orders GROUP BY window(t, '1 second'), user",
          name="per_second").sink("out", hr.sinks.Kafka("counts", exactly_once=False))
    with pytest.raises(hr.PlanError, match="step 'per_second' .* is a windowed SQL query, which emits final results "
                                           r"\(append mode\); real-time mode runs in update mode"):
        p.validate()


@pytest.mark.fast
def test_rewriting_keeps_the_users_query_and_maps_positions_back():
    query = "SELECT c.url FROM clicks c\nJOIN users ON c.user = users.user WHERE nope > 1"
    rewritten = rewrite(query, {"clicks": "v1", "users": "v2"})
    assert rewritten.text == "SELECT c.url FROM `v1` c\nJOIN `v2` AS users ON c.user = users.user WHERE nope > 1"
    offset = rewritten.text.index("nope")
    assert rewritten.original_offset(offset) == query.index("nope")
    assert rewritten.original_offset(rewritten.text.index("`v2`") + 2) == query.index("users")
    assert show(query, Position.at(query, query.index("nope"), 4)).splitlines()[-1] == "      |" + " " * 41 + "^^^^"


# -- on Spark ------------------------------------------------------------------------------------------

T0 = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE  # a minute boundary
CLICK_BATCHES = [
    [{"user": "ann", "url": "/a", "ts": T0 + 1_000}, {"user": "bob", "url": "/b", "ts": T0 + 5_000},
     {"user": "ann", "url": "/a", "ts": T0 + 59_999}],
    [{"user": "cid", "url": "/a", "ts": T0 + MINUTE + 2_000}, {"user": "ann", "url": "/a", "ts": T0 + 40_000},
     {"user": "bob", "url": "/b", "ts": T0 + MINUTE + 30_000}],
    [{"user": "ann", "url": "/c", "ts": T0 + 3 * MINUTE + 1}, {"user": "bob", "url": "/b", "ts": T0 + 3 * MINUTE}],
    Watermark(T0 + 2 * MINUTE + 30_000),
    [{"user": "cid", "url": "/a", "ts": T0 + 3 * MINUTE + 10_000},
     {"user": "ann", "url": "/p/1", "ts": T0 + 4 * MINUTE}],
]
USERS = [{"user": "ann", "country": "fr"}, {"user": "bob", "country": "de"}]


def all_clicks() -> list[dict]:
    return [r for batch in CLICK_BATCHES if isinstance(batch, list) for r in batch]


def test_a_windowed_sql_count_equals_the_count_computed_in_python(spark):
    """count(*), and COUNT(DISTINCT ...) with and without FILTER (exact: each group's set of values)."""
    p = clicks_pipeline("sql_window_count", CLICK_BATCHES)
    sink = TestSink()
    p.sql("""SELECT window, url, count(*) AS n, count(DISTINCT user) AS users,
                    count(DISTINCT user) FILTER (WHERE user <> 'ann') AS others
               FROM clicks
              GROUP BY window(ts, '1 minute'), url""", name="per_minute").sink("out", sink)
    rows = run_to_completion(p)["out"]
    expected = Counter((r["ts"] - r["ts"] % MINUTE, r["url"]) for r in all_clicks())
    users: dict[tuple[int, str], set[str]] = {}
    for r in all_clicks():
        users.setdefault((r["ts"] - r["ts"] % MINUTE, r["url"]), set()).add(r["user"])
    got = [((r["window_start"], r["window_end"]), r["url"], r["n"], r["users"], r["others"]) for r in rows]
    assert sorted(got) == sorted(((at(start), at(start + MINUTE)), url, n, len(users[start, url]),
                                  len(users[start, url] - {"ann"})) for (start, url), n in expected.items())
    assert {r["others"] for r in rows} != {r["users"] for r in rows}  # the filter mattered
    assert set(rows[0]) == {"window_start", "window_end", "url", "n", "users", "others"}  # the window, flattened
    # append mode: each window once (the comparison above), the last ones when the bounded input ends
    last = [sink.batches[b] for b in sorted(sink.batches) if sink.batches[b]][-1]
    assert {r["window_start"] for r in last} == {at(T0 + 3 * MINUTE), at(T0 + 4 * MINUTE)}


def test_windows_of_windows_in_one_query_equal_those_computed_in_python(spark):
    """Clicks per user and 10 s, then per user and minute the busiest 10 s and the total: the later
    window reads the earlier one's window_time (each result at its window's end - 1 µs)."""
    p = clicks_pipeline("sql_windows_of_windows", CLICK_BATCHES)
    p.sql("""SELECT user, window(window_time(w), '1 minute') AS window, max(n) AS busiest, sum(n) AS total
               FROM (SELECT user, window(ts, '10 seconds') AS w, count(*) AS n
                       FROM clicks GROUP BY user, window(ts, '10 seconds'))
              GROUP BY user, window(window_time(w), '1 minute')""", name="per_minute").sink("out", TestSink())
    assert "native window aggregates, one after another" in p.explain()
    rows = run_to_completion(p)["out"]
    per_10s = Counter((r["user"], r["ts"] - r["ts"] % 10_000) for r in all_clicks())
    per_minute: dict[tuple[str, int], list[int]] = {}
    for (user, start), n in per_10s.items():
        per_minute.setdefault((user, start - start % MINUTE), []).append(n)
    assert sorted((r["user"], r["window_start"], r["window_end"], r["busiest"], r["total"]) for r in rows) == sorted(
        (user, at(start), at(start + MINUTE), max(ns), sum(ns)) for (user, start), ns in per_minute.items())


def test_windowed_aggregates_joined_to_each_other_and_to_their_stream_equal_python(spark):
    """NEXMark's q5 and q7 patterns over clicks, in one pipeline: per minute the busiest users (a count
    per user joined to the count's maximum, which groups the same windows again: GROUP BY w), and the
    clicks of each minute's alphabetically last user (a window's maximum joined back to the stream)."""
    p = clicks_pipeline("sql_joined_windows", CLICK_BATCHES)
    counts = "SELECT user, count(*) AS n, window(ts, '1 minute') AS w FROM clicks GROUP BY user, window(ts, '1 minute')"
    p.sql(f"""SELECT c.user, c.n, c.w.start AS started
                FROM ({counts}) c
                JOIN (SELECT max(m.n) AS most, m.w FROM ({counts}) m GROUP BY m.w) top
                  ON c.w = top.w AND c.n >= top.most""", name="busiest_users").sink("busiest", TestSink())
    p.sql("""SELECT c.user, c.url, c.ts
               FROM clicks c
               JOIN (SELECT max(user) AS last_user, window.end AS ended
                       FROM clicks GROUP BY window(ts, '1 minute')) l
                 ON c.user = l.last_user AND c.ts BETWEEN l.ended - INTERVAL 1 MINUTE AND l.ended""",
          name="last_clicks").sink("last", TestSink())
    out = run_to_completion(p)
    per_minute: dict[int, Counter[str]] = {}
    for r in all_clicks():
        per_minute.setdefault(r["ts"] - r["ts"] % MINUTE, Counter())[r["user"]] += 1
    busiest = [(user, n, at(start)) for start, users in per_minute.items() for user, n in users.items()
               if n == max(users.values())]
    assert sorted((r["user"], r["n"], r["started"]) for r in out["busiest"]) == sorted(busiest)
    last_user = {start: max(users) for start, users in per_minute.items()}
    expected = [(r["user"], r["url"], at(r["ts"])) for r in all_clicks()
                if r["user"] == last_user[r["ts"] - r["ts"] % MINUTE]]
    assert sorted((r["user"], r["url"], r["ts"]) for r in out["last"]) == sorted(expected)
    assert len({r["started"] for r in out["busiest"]}) == 4 and len(expected) == 4


def test_processing_time_windows_in_sql_count_every_record_once(spark):
    """The micro-batch's current_timestamp() declared as the event time between two queries (NEXMark's
    q12): which window a record falls in depends on the clock, but each is counted once, per user."""
    p = clicks_pipeline("sql_processing_time", CLICK_BATCHES)
    p.sql("SELECT user, current_timestamp() AS p_time FROM clicks", name="stamped").with_event_time(
        "p_time", name="clicks_p_time")
    p.sql("""SELECT user, window, count(*) AS n FROM clicks_p_time
              GROUP BY user, window(p_time, '10 seconds')""", name="per_10s").sink("out", TestSink())
    rows = run_to_completion(p)["out"]
    totals: Counter[str] = Counter()
    for row in rows:
        totals[row["user"]] += row["n"]
        assert row["window_end"] - row["window_start"] == datetime.timedelta(seconds=10)
    assert totals == Counter(r["user"] for r in all_clicks())


def sessions(times: list[int], gap: int) -> list[tuple[int, int, int]]:
    """(start, end, count) of the sessions of one key, in plain Python."""
    out: list[list[int]] = []
    for t in sorted(times):
        if out and t < out[-1][1]:
            out[-1][1], out[-1][2] = max(out[-1][1], t + gap), out[-1][2] + 1
        else:
            out.append([t, t + gap, 1])
    return [tuple(s) for s in out]  # type: ignore[misc]


def test_a_session_window_query(spark):
    p = clicks_pipeline("sql_sessions", CLICK_BATCHES)
    p.sql("SELECT user, session_window.start AS started, session_window.end AS ended, count(*) AS clicks "
          "FROM clicks GROUP BY user, session_window(ts, '1 minute')", name="sessions").sink("out", TestSink())
    rows = run_to_completion(p)["out"]
    by_user: dict[str, list[int]] = {}
    for r in all_clicks():
        by_user.setdefault(r["user"], []).append(r["ts"])
    expected = sorted((user, at(s), at(e), n) for user, times in by_user.items() for s, e, n in sessions(times, MINUTE))
    assert sorted((r["user"], r["started"], r["ended"], r["clicks"]) for r in rows) == expected


def test_a_stream_joined_with_a_static_table(spark):
    p = hr.Pipeline("sql_join")
    clicks = p.source("clicks", TestSource(CLICK_BATCHES, schema=CLICKS))
    p.table("users", USERS)
    p.sql("SELECT c.user, c.url, u.country FROM clicks c JOIN users u ON c.user = u.user",
          name="enriched").sink("out", TestSink())
    clicks.sink("raw", TestSink())
    assert shared_root(p.plan) == "clicks"  # each micro-batch is split after the source: the query runs on it
    out = run_to_completion(p)
    country = {u["user"]: u["country"] for u in USERS}
    expected = sorted((r["user"], r["url"], country[r["user"]]) for r in all_clicks() if r["user"] in country)
    assert sorted((r["user"], r["url"], r["country"]) for r in out["out"]) == expected
    assert len(out["raw"]) == len(all_clicks())


def path_depth(url: str) -> int:
    """A Python function for SQL (``p.udf``)."""
    return url.count("/")


def test_a_stateless_query_feeds_a_fluent_window_and_a_sink(spark):
    p = clicks_pipeline("sql_then_window", CLICK_BATCHES)
    p.udf("path_depth", path_depth, returns="long")
    pages = p.sql("SELECT user, ts, upper(url) AS page, path_depth(url) AS depth FROM clicks WHERE url <> '/b'",
                  name="pages_sql")
    pages.sink("pages", TestSink())
    pages.key_by("user").window(hr.Tumbling("2m"), name="per_user_2m").count().sink("per_user", TestSink())
    out = run_to_completion(p)
    kept = [r for r in all_clicks() if r["url"] != "/b"]
    assert sorted((r["user"], r["ts"], r["page"], r["depth"]) for r in out["pages"]) == sorted(
        (r["user"], at(r["ts"]), r["url"].upper(), r["url"].count("/")) for r in kept)
    assert {r["depth"] for r in out["pages"]} == {1, 2}
    expected = Counter((r["user"], r["ts"] - r["ts"] % (2 * MINUTE)) for r in kept)
    assert sorted((r["user"], r["window_start"], r["count"]) for r in out["per_user"]) == sorted(
        (user, at(start), n) for (user, start), n in expected.items())


def test_a_word_count_in_sql_over_a_flat_map_of_lines(spark):
    lines = [[{"line": "the quick brown fox"}, {"line": "the lazy dog"}], [{"line": "The fox and the dog"}]]
    p = hr.Pipeline("sql_word_count")
    (p.source("lines", TestSource(lines, schema={"line": "string"}))
      .flat_map(lambda r: [{"word": w.lower()} for w in r["line"].split()], schema={"word": "string"}, name="words"))
    counts = p.sql("SELECT word, count(*) AS n FROM words GROUP BY word", name="counts")
    sink = TestSink()
    counts.sink("out", sink)
    assert output_mode(p.plan) == "update"
    run_to_completion(p)
    latest = {r["word"]: r["n"] for r in sink.rows()}  # update mode: a key's last row is its count
    assert latest == Counter(w.lower() for batch in lines for r in batch for w in r["line"].split())
    changed = [len(sink.batches[b]) for b in sorted(sink.batches) if sink.batches[b]]
    assert changed == [6, 4]  # each micro-batch emits the words it changed


def test_select_distinct_emits_each_distinct_row_once_ever(spark):
    orders = [[{"order_id": 1, "customer": "ann"}, {"order_id": 1, "customer": "ann"},
               {"order_id": 2, "customer": "bob"}],
              [{"order_id": 1, "customer": "ann"}, {"order_id": 3, "customer": "ann"}],
              [{"order_id": 2, "customer": "bob"}, {"order_id": 3, "customer": "ann"}]]
    p = hr.Pipeline("sql_distinct")
    p.source("orders", TestSource(orders, schema={"order_id": "long", "customer": "string"}))
    distinct = p.sql("SELECT DISTINCT order_id, customer\n  FROM orders", name="distinct_orders")
    sink = TestSink()
    distinct.sink("out", sink)
    assert distinct.node.shape == "distinct" and output_mode(p.plan) == "append"
    assert "dropDuplicates" in p.explain()
    run_to_completion(p)
    seen: list[tuple] = []
    for batch in orders:
        seen += [r for r in dict.fromkeys((o["order_id"], o["customer"]) for o in batch) if r not in seen]
    assert sorted((r["order_id"], r["customer"]) for r in sink.rows()) == sorted(seen)  # each once, ever
    assert [len(sink.batches[b]) for b in sorted(sink.batches) if sink.batches[b]] == [2, 1]


def test_a_spark_analysis_error_names_the_step_and_points_at_the_query(spark):
    p = clicks_pipeline("sql_bad_column", CLICK_BATCHES[:1], event_time=False)
    line = next_line()
    p.sql("SELECT user,\n       nope + 1 AS n\n  FROM clicks", name="broken").sink("out", TestSink())
    with pytest.raises(hr.PlanError) as error:
        run_to_completion(p)
    message = str(error.value)
    assert message.startswith(f"step 'broken' (test_sql.py:{line}): Spark refused the query: "
                              "[UNRESOLVED_COLUMN.WITH_SUGGESTION]")
    assert "`nope`" in message and "_hr_sql_" not in message and "JVM stacktrace" not in message
    assert message.endswith("  at line 2, column 8 of the query:\n    1 | SELECT user,\n    2 |        nope + 1 AS n\n"
                            "      |        ^^^^\n    3 |   FROM clicks")


def test_a_query_spark_refuses_on_a_stream_names_the_step_before_the_query_starts(spark):
    p = clicks_pipeline("sql_outer_join", CLICK_BATCHES[:1], event_time=False)
    p.table("users", USERS)
    line = next_line()
    p.sql("SELECT u.user, c.url FROM users u LEFT JOIN clicks c ON c.user = u.user", name="backwards").sink(
        "out", TestSink())
    with pytest.raises(hr.PlanError) as error:
        run_to_completion(p)
    message = str(error.value)
    assert message.startswith(f"step 'backwards' (test_sql.py:{line}): Spark refused the query: LeftOuter join "
                              "with a streaming DataFrame/Dataset on the right and a static DataFrame/Dataset on the "
                              "left is not supported")
    assert "_hr_sql_" not in message and "\n  the query:\n    1 | SELECT u.user" in message


def test_the_word_count_in_docs_sql_md_prints_what_it_shows(spark, capsys):
    doc = (ROOT / "docs" / "sql.md").read_text()
    code = doc.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/sql.md", "exec"), {})
    shown = doc.split("<!-- word count output -->\n```\n", 1)[1].split("```", 1)[0]
    assert capsys.readouterr().out == shown == (
        "[('brown', 1), ('dog', 1), ('fox', 1), ('lazy', 1), ('quick', 1), ('the', 2)]\n"
        "[('fox', 2), ('jumps', 1), ('the', 3)]\n")


def test_the_sql_example_counts_right_and_prints_what_docs_sql_md_shows(spark, capsys, tmp_path, monkeypatch):
    from headrace.connectors.generator import generate

    monkeypatch.setenv("HEADRACE_STATE_DIR", str(tmp_path))
    runpy.run_path(str(ROOT / "examples" / "sql_clicks.py"), run_name="__main__")
    printed = sorted(line for line in capsys.readouterr().out.splitlines() if line.startswith("|2023"))
    doc = (ROOT / "docs" / "sql.md").read_text()
    shown = doc.split("<!-- sql_clicks output -->\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert printed and printed == sorted(line for line in shown if line.startswith("|2023"))
    clicks = generate("clicks", 0, 300_000).to_pylist()
    sections = ("books", "garden", "music", "toys")
    expected = Counter((str(c["event_time"].replace(microsecond=0)), sections[int(c["url"][-3:]) % 4])
                       for c in clicks)
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in printed]
    assert {(start, section): int(n) for start, _, section, n, _ in cells} == expected


# -- the watermark is taken where event time is declared ---------------------------------------------

def readings(name: str) -> tuple[hr.Pipeline, hr.Stream]:
    """Two windows of readings and, last, a far-future 'close' reading sent to close them; no
    end-of-input flush, so only that reading moves the watermark past the second window."""
    batches = [[{"kind": "temp", "ts": 1_000}, {"kind": "temp", "ts": 1_500}, {"kind": "temp", "ts": 2_200}],
               [{"kind": "close", "ts": 60_000}]]
    p = hr.Pipeline(name)
    return p, p.source("readings", TestSource(batches, schema={"kind": "string", "ts": "long"}, flush=False),
                       event_time="ts")


def optimized_plan(p: hr.Pipeline, spark, tmp_path) -> str:
    from headrace.spark.compiler import compile_plan

    frames = compile_plan(p.plan, spark, str(tmp_path / "compiled")).sink_frames
    optimizer = spark._jsparkSession.sessionState().optimizer()  # Catalyst's rules, as the query will run them
    return "\n".join(optimizer.execute(df._jdf.queryExecution().analyzed()).toString() for df in frames.values())


def filter_above_watermark(plan: str, predicate: str) -> bool:
    """Whether the Filter on ``predicate`` sits above (is printed before) EventTimeWatermark."""
    lines = plan.split("\n")
    filters = [i for i, line in enumerate(lines) if "Filter" in line and predicate in line]
    watermark = next(i for i, line in enumerate(lines) if "EventTimeWatermark" in line)
    return bool(filters) and all(i < watermark for i in filters)


def test_a_filter_after_the_event_time_declaration_does_not_hide_records_from_the_watermark(spark, tmp_path):
    expected = [(at(1_000), at(2_000), 2), (at(2_000), at(3_000), 1)]  # both windows, closed by the 'close' reading
    p, stream = readings("filtered_watermark")
    temps = stream.filter(hr.col("kind") != "close", name="temps")
    temps.window(hr.Tumbling("1s"), name="per_second").count().sink("out", TestSink())
    assert filter_above_watermark(optimized_plan(p, spark, tmp_path), "NOT (kind#")
    assert "watermark taken here" in p.explain()
    # run with a second branch through a Python step, which takes the watermark again: the first
    # branch then takes it on the way into its filter, and still sees every record
    p, stream = readings("filtered_watermark_branches")
    stream.filter(lambda r: True, name="everything").window(hr.Tumbling("1s"), name="all").count().sink("a", TestSink())
    temps = stream.filter(hr.col("kind") != "close", name="temps")
    temps.window(hr.Tumbling("1s"), name="per_second").count().sink("out", TestSink())
    assert "watermark taken on the way into 'temps'" in p.explain()
    out = run_to_completion(p)
    for sink in ("a", "out"):
        assert sorted((r["window_start"], r["window_end"], r["count"]) for r in out[sink]) == expected

    q, _ = readings("sql_where_watermark")
    q.sql("SELECT window, count(*) AS count FROM readings WHERE kind <> 'close' GROUP BY window(ts, '1 second')",
          name="per_second").sink("out", TestSink())
    assert filter_above_watermark(optimized_plan(q, spark, tmp_path), "NOT (kind#")
    out = run_to_completion(q)
    assert sorted((r["window_start"], r["window_end"], r["count"]) for r in out["out"]) == expected



@pytest.mark.parametrize("register, message", [
    (lambda p: p.udf("path depth", path_depth), r"udf \(test_sql.py:\d+\): the name must be an SQL identifier"),
    (lambda p: p.udf("depth", 3), r"udf 'depth' \(test_sql.py:\d+\): expected a function, got int"),
    (lambda p: p.udf("depth", path_depth, returns="decimal"),
     r"returns='decimal' is not a column type; use one of string, long"),
    (lambda p: (p.udf("depth", path_depth), p.udf("depth", len)),
     r"udf 'depth' \(test_sql.py:\d+\): a function of that name is registered already, at test_sql.py:\d+"),
])
@pytest.mark.fast
def test_a_function_for_sql_is_refused_with_the_reason(register, message):
    with pytest.raises(hr.PlanError, match=message):
        register(clicks_pipeline("udfs"))


BIDS = {"auction": "long", "price": "long", "bidder": "string", "ts": "timestamp"}
BID_BATCHES = [[{"auction": a, "price": (a * 37 + i * 11) % 50, "bidder": f"b{(a + i) % 4}",
                 "ts": at(T0 + i * 4_000 + a)} for a in (1, 2, 3) for i in range(6)],
               [{"auction": a, "price": (a * 13 + i * 29) % 60, "bidder": f"b{(a * i) % 3}",
                 "ts": at(T0 + 30_000 + i * 5_000 + a)} for a in (1, 2, 4) for i in range(5)]]
TOP = ("SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY {partition} ORDER BY {order}) AS rn "
       "FROM bids) WHERE rn <= 3")


def top_three(rows: list[dict], order: Any) -> list[tuple]:
    ranked = sorted(rows, key=order)[:3]
    return [(r["auction"], r["price"], r["ts"], rank) for rank, r in enumerate(ranked, start=1)]


@pytest.mark.fast
def test_the_top_n_keeps_n_rows_per_key_when_its_order_allows_it():
    """Spark's max_by(row, order, N) when each ascending key is a number or a time; else each
    key's list of rows, sorted and cut."""
    query = TOP.format(partition="auction", order="price DESC, ts ASC")
    assert "MAX_BY(STRUCT(STRUCT(*) AS _hr_row), STRUCT(NOT price IS NULL AS o0, price AS o1, ts IS NULL AS o2, " \
           "-UNIX_MICROS(ts) AS o3), 3)" in top_n_as_aggregate_query(query, {"price": "bigint", "ts": "timestamp"})
    query = TOP.format(partition="auction", order="price DESC, bidder ASC")
    assert "COLLECT_LIST" in top_n_as_aggregate_query(query, {"price": "bigint", "bidder": "string"})


def test_the_top_n_per_key_and_per_window_is_exact(spark, tmp_path):
    """ROW_NUMBER() OVER (PARTITION BY ...) filtered to the first three, as the aggregate Spark runs:
    per auction in update mode (the last rows of each (auction, rank) are the current top three; Spark's
    max_by keeps three rows per auction), and per auction and 30 s window in append mode (each window's
    top three once; a string key ascending: each window's list of rows, sorted and cut)."""
    every = [r for batch in BID_BATCHES for r in batch]
    p = hr.Pipeline("top_per_key")
    p.source("bids", TestSource(BID_BATCHES, schema=BIDS))
    p.sql(TOP.format(partition="auction", order="price DESC, ts ASC"), name="top").sink("out", sink := TestSink())
    assert "SQL aggregate" in p.explain()
    run_to_completion(p, state_dir=str(tmp_path / "per_key"))
    current = {(r["auction"], r["rn"]): (r["auction"], r["price"], r["ts"], r["rn"]) for r in sink.rows()}
    assert sorted(current.values()) == sorted(
        t for a in {r["auction"] for r in every}
        for t in top_three([r for r in every if r["auction"] == a], lambda r: (-r["price"], r["ts"])))

    p = hr.Pipeline("top_per_window")
    p.source("bids", TestSource(BID_BATCHES, schema=BIDS), event_time="ts")
    p.sql(TOP.format(partition="window(ts, '30 seconds'), auction", order="price DESC, bidder ASC, ts"),
          name="top").sink("out", sink := TestSink())
    run_to_completion(p, state_dir=str(tmp_path / "per_window"))
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in every:
        groups.setdefault((r["auction"], int(r["ts"].timestamp() * 1000) // 30_000), []).append(r)
    assert sorted((r["auction"], r["price"], r["ts"], r["rn"]) for r in sink.rows()) == sorted(
        t for rows in groups.values() for t in top_three(rows, lambda r: (-r["price"], r["bidder"], r["ts"])))
    assert {(r["window_end"] - r["window_start"]).seconds for r in sink.rows()} == {30}
