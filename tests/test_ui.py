"""The server's web UI in a real headless Chromium (Debian's package, driven by Playwright): a
submitted pipeline's DAG and moving counters, a state lookup equal to sums made here, pause,
resume, a SIGKILLed driver shown restarting and back, a rescale through the server, a stop, with
the output exact, its checkpoints tab listing the batches of its commit log and its configuration
tab its source and sinks, no console error and no request to another host; and a failing record
shown as one exception with its count."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import service_or_skip
from test_server import Server

from headrace.connectors.files_sink import read_rows
from headrace.runtime.rescale import state_partitions

PIPELINE = """import headrace as hr

p = hr.Pipeline("orders_ui")
orders = p.source("orders", hr.sources.Files({inbox!r}, schema="id long, customer string, amount long",
                                            max_files_per_batch=1))
orders.sink("out", hr.sinks.Files({out!r}, format="jsonl"))
orders.key_by("customer").sum("amount", name="spend").queryable("spend_by_customer")
"""
STEPS = {"orders", "out", "key_by", "spend", "spend_by_customer"}
FILES = [[(1, "c1", 10), (2, "c2", 20)], [(3, "c1", 5)], [(4, "c2", 7)], [(5, "c1", 1)]]


def write(inbox: Path, n: int) -> None:
    lines = [f'{{"id": {i}, "customer": "{c}", "amount": {a}}}\n' for i, c, a in FILES[n]]
    (inbox / f".{n}.tmp").write_text("".join(lines))
    os.replace(inbox / f".{n}.tmp", inbox / f"{n}.jsonl")  # whole, or not at all, for the reader


def spend(files: int, customer: str) -> int:
    return sum(a for rows in FILES[:files] for _, c, a in rows if c == customer)


@pytest.fixture
def browser() -> Any:
    chromium = shutil.which("chromium")
    service_or_skip("Chromium", chromium is not None, "bash scripts/services.sh installs Debian's chromium")
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


def test_the_web_ui_draws_the_running_dag_and_drives_the_pipeline(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    inbox, out = tmp_path / "inbox", tmp_path / "out"
    inbox.mkdir()
    (tmp_path / "orders.py").write_text(PIPELINE.format(inbox=str(inbox), out=str(out)))
    server = Server(tmp_path).start(HEADRACE_RESTART_BACKOFF="3s")  # long enough to see "restarting"
    try:
        assert server.cli("submit", "orders.py").returncode == 0
        write(inbox, 0)
        page = browser.new_page()
        problems: list[str] = []
        hosts: set[str] = set()
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("response", lambda r: problems.append(f"HTTP {r.status} from {r.url.split('?')[0]}")
                if r.status >= 500 else None)
        page.on("request", lambda r: hosts.add(r.url.split("/")[2]))
        loaded = page.goto(f"{server.url}/?token={server.token}")
        assert loaded is not None and "default-src 'none'" in loaded.headers["content-security-policy"]

        row = page.locator("#pipelines tr[data-pipeline='orders_ui']")
        expect(row).to_contain_text("running", timeout=60_000)
        row.locator("a").click()
        expect(page.locator("svg.dag .node")).to_have_count(len(STEPS), timeout=60_000)
        drawn = {node.get_attribute("data-step") for node in page.locator("svg.dag .node").all()}
        assert drawn == STEPS
        assert page.locator("svg.dag .edge[data-from='key_by'][data-to='spend']").count() == 1

        records = page.locator(".kpi[data-kpi='records'] b")
        expect(records).to_have_text("2", timeout=120_000)  # the counters move as files arrive
        write(inbox, 1)
        expect(records).to_have_text("3", timeout=120_000)

        page.select_option("#state-view", "spend_by_customer")
        page.fill("#state-key", "c1")
        page.click("#state-lookup")
        expect(page.locator("#state-result")).to_contain_text(f'"sum": {spend(2, "c1")}', timeout=30_000)

        status = page.locator("#status")
        page.click("button[data-action=pause]")
        expect(status).to_have_text("paused", timeout=120_000)
        write(inbox, 2)  # waits in the directory while paused
        page.click("button[data-action=resume]")
        expect(status).to_have_text("running", timeout=120_000)
        expect(records).to_have_text("4", timeout=120_000)

        pid = server.status("orders_ui")["pid"]
        os.killpg(pid, signal.SIGKILL)  # the driver's whole process group
        expect(status).to_have_text("restarting", timeout=30_000)
        assert "bad" in (status.get_attribute("class") or "")  # drawn red, and so is the DAG
        assert page.locator("svg.dag.bad").count() == 1
        expect(status).to_have_text("running", timeout=120_000)
        expect(page.locator(".kpi[data-kpi='restarts'] b")).to_have_text("1")

        # rescale through the server: stopped at a batch boundary, its state spread over 3 partitions, started again
        refused = server.cli("rescale", "orders_ui", "0")
        assert refused.returncode == 1 and "a whole number from 1 to 10000" in refused.stderr
        rescaled = server.cli("rescale", "orders_ui", "3", "--wait", "--json")
        assert rescaled.returncode == 0, rescaled.stderr
        assert json.loads(rescaled.stdout)["operation"]["status"] == "done"
        expect(status).to_have_text("running")
        commits = tmp_path / "state" / "pipelines" / "orders_ui" / "orders_ui" / "checkpoint" / "commits"
        last_commit = max(int(name) for name in os.listdir(commits) if name.isdigit())  # the rescale's batch
        expect(page.locator(".kpi[data-kpi='batches'] b")).to_have_text(str(last_commit + 1))
        write(inbox, 3)
        expect(records).to_have_text("5", timeout=120_000)
        page.click("#state-lookup")
        expect(page.locator("#state-result")).to_contain_text(f'"sum": {spend(4, "c1")}', timeout=30_000)
        assert state_partitions(str(tmp_path / "state" / "pipelines" / "orders_ui" / "orders_ui" / "checkpoint")) == 3
        edge = page.locator("svg.dag .edge[data-from='orders'][data-to='out']")
        assert float(edge.get_attribute("stroke-width") or 0) > 1.5  # as wide as the source's rate while it runs

        page.click("button[data-action=stop]")
        expect(status).to_have_text("stopped", timeout=120_000)
        expect(page.locator(".kpi[data-kpi='records/s'] b")).to_have_text("0")  # no rate once it stopped
        expect(edge).to_have_attribute("stroke-width", "1.5")
        written = sorted((r["id"], r["amount"]) for r in read_rows(str(out), "jsonl"))
        assert written == sorted((i, a) for rows in FILES for i, _, a in rows)  # each record once
        # each step's records, each batch once across the kill: the source's, and the running sum's updated keys
        updates = sum(len({c for _, c, _ in rows}) for rows in FILES)
        node = page.locator("svg.dag .node[data-step=orders]")
        expect(node).to_have_attribute("data-records", str(sum(map(len, FILES))))
        expect(page.locator("svg.dag .node[data-step=spend]")).to_have_attribute("data-records", str(updates))

        # the checkpoints tab: the batches Spark's commit log holds, newest first, their records each read once
        committed = sorted((int(name) for name in os.listdir(commits) if name.isdigit()), reverse=True)
        page.click("a[data-tab=checkpoints]")
        batches = page.locator("#checkpoints tr[data-batch]")
        expect(batches).to_have_count(len(committed), timeout=30_000)
        assert [int(row.get_attribute("data-batch") or "") for row in batches.all()] == committed
        expect(page.locator("#checkpoint-summary tr[data-field=last] td")).to_have_text(str(committed[0]))
        read = [text for text in batches.locator("td.input-rows").all_inner_texts() if text != "–"]
        assert sum(map(int, read)) == sum(map(len, FILES))
        expect(page.locator("#checkpoint-summary tr[data-field=operator-0] td")).to_contain_text("rows")
        # the state on disk by partition: the running sum's three partitions (rescaled), each as its folder holds
        state = commits.parent / "state"
        on_disk = {int(p.name): sum(f.stat().st_size for f in p.rglob("*") if f.is_file()
                                    and "_metadata" not in f.relative_to(p).parts)
                   for p in (state / "0").iterdir() if p.name.isdigit()}
        bars = page.locator("#state-partitions tr[data-operator='0'] rect")
        expect(bars).to_have_count(3)
        assert {int(b.get_attribute("data-partition") or ""): int(b.get_attribute("data-bytes") or "")
                for b in bars.all()} == on_disk
        assert len(on_disk) == 3
        # and in the running sum's drawer, the step its driver noted for that operator
        page.click("a[data-tab=overview]")
        page.locator("svg.dag .node[data-step=spend]").click()
        expect(page.locator("aside#drawer #step-state-partitions tr[data-operator='0'] rect")).to_have_count(3)
        page.click("a[data-tab=checkpoints]")

        # the configuration tab: the source and the sinks, with their connectors' settings
        page.click("a[data-tab=configuration]")
        connectors = page.locator("#config-connectors .connector")
        expect(connectors).to_have_count(3, timeout=30_000)
        assert {(c.get_attribute("data-role"), c.get_attribute("data-step")) for c in connectors.all()} == {
            ("source", "orders"), ("sink", "out"), ("sink", "spend_by_customer")}
        expect(page.locator(".connector[data-step=orders] tr[data-field=path] td")).to_have_text(str(inbox))
        expect(page.locator(".connector[data-step=out] tr[data-field=path] td")).to_have_text(str(out))
        expect(page.locator("#config-pipeline tr[data-field=restart_strategy] td")).to_contain_text("3 restarts")
        expect(page.locator("#config-pipeline tr[data-field=trigger_interval] td")).to_have_text(
            "none: as fast as it can")
        assert problems == [], f"{problems}; the server printed: {server.output()}"
        assert hosts == {server.url.split("/")[2]}
        assert server.token not in page.url  # taken out of the address bar, kept for the tab
    finally:
        entry = server.status("orders_ui")
        server.close()
        if entry["pid"]:
            os.killpg(entry["pid"], signal.SIGKILL)


FAILING = """import headrace as hr


def checked(order):
    if order["amount"] < 0:
        raise ValueError("a negative amount")
    return order


p = hr.Pipeline("orders_failing")
(p.source("orders", hr.sources.Files({inbox!r}, schema="id long, amount long"))
  .map(checked, schema={{"id": "long", "amount": "long"}}, name="check")
  .sink("out", hr.sinks.Files({out!r}, format="jsonl")))
"""


def test_a_record_that_fails_shows_as_one_exception_with_its_count(browser: Any, tmp_path: Path) -> None:
    """A step that raises on a record ends its driver with a refusal (the replayed batch would give it
    the same record), so the server does not restart it, though its restart strategy allows one: the
    page shows the pipeline failed, in red, and one exception counted once, as /metrics counts it."""
    from playwright.sync_api import expect

    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.jsonl").write_text('{"id": 1, "amount": 10}\n{"id": 2, "amount": -5}\n')
    (tmp_path / "failing.py").write_text(FAILING.format(inbox=str(inbox), out=str(tmp_path / "out")))
    server = Server(tmp_path).start(HEADRACE_RESTART_ATTEMPTS="1", HEADRACE_RESTART_BACKOFF="0s")
    try:
        assert server.cli("submit", "failing.py").returncode == 0
        page = browser.new_page()
        page.goto(f"{server.url}/?token={server.token}#/p/orders_failing")
        expect(page.locator("#status")).to_have_text("failed", timeout=180_000)
        assert "bad" in (page.locator("#status").get_attribute("class") or "")
        rows = page.locator("#exceptions tr:has(td)")
        expect(rows).to_have_count(1)
        expect(rows.locator("td.count")).to_have_text("1")
        expect(rows.locator("td.message")).to_have_text("step 'check' (checked at failing.py:4) raised ValueError: "
                                                        "a negative amount (record: {'amount': -5, 'id': 2})")
        status, text = server.call("GET", "/metrics")
        assert status == 200 and 'headrace_exceptions_total{pipeline="orders_failing"} 1' in text.splitlines()
    finally:
        server.close()


def test_the_dag_is_drawn_by_each_steps_rate_and_a_slow_sink_red(browser: Any, tmp_path: Path) -> None:
    """Gearpump's encodings over a pipeline's figures written here (a server in this process, no
    driver): a step's box taller the more records per second it handed on, an edge as wide as
    the rate of the step it comes from, a sink whose last write took most of the batch red."""
    from local_server import TOKEN
    from local_server import Server as LocalServer
    from playwright.sync_api import expect

    import headrace as hr
    from headrace.runtime.compatibility import record_plan

    server = LocalServer(tmp_path)
    try:
        root = server.pipeline("orders", tmp_path / "state")
        running(server, "orders")  # a rate is drawn while it runs
        p = hr.Pipeline("orders")
        orders = p.source("orders", hr.sources.Files(str(tmp_path), schema="id long, amount long"))
        orders.sink("archive", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
        orders.filter(hr.col("amount") > 100, name="big").sink("db", hr.sinks.Postgres("big", dsn="postgresql://db/x"))
        cents = orders.select("id", name="ids").filter(hr.col("id") > 5, name="late_ids")
        cents.sink("ids_out", hr.sinks.Files(str(tmp_path / "ids"), format="jsonl"))
        (root / "checkpoint").mkdir(parents=True)
        record_plan(p.plan, str(root))
        batches = [{"batch": 0, "batch_ms": 2000, "step_records": {"orders": 1000, "big": 5, "late_ids": 990},
                    "sink_ms": {"db": 500, "archive": 100, "ids_out": 50}},
                   {"batch": 1, "batch_ms": 4000, "step_records": {"orders": 4000, "big": 40, "late_ids": 3990},
                    "sink_ms": {"db": 3000, "archive": 200, "ids_out": 60}}]
        (tmp_path / "state" / "progress.jsonl").write_text("".join(json.dumps(b) + "\n" for b in batches))

        page = browser.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.goto(f"{server.url}/?token={TOKEN}#/p/orders")
        db = page.locator("svg.dag .node[data-step=db]")
        expect(db).to_have_class("node bad slow", timeout=30_000)
        expect(db.locator("title")).to_contain_text("slow, its last write took 3000 ms")
        expect(page.locator("svg.dag .node[data-step=archive]")).to_have_class("node")
        expect(page.locator("svg.dag .node[data-step=orders]")).to_contain_text("5,000 records, 1,000/s")

        def height(step: str) -> float:
            return float(page.locator(f"svg.dag .node[data-step={step}] rect").get_attribute("height") or 0)

        def width(source: str, target: str) -> float:
            edge = page.locator(f"svg.dag .edge[data-from='{source}'][data-to='{target}']")
            return float(edge.get_attribute("stroke-width") or 0)

        assert height("orders") > height("big") > height("db")  # 1,000/s, 10/s, none counted
        assert width("orders", "big") > width("big", "db")

        # A click on a step opens its drawer: what the plan says of it and its figures, kept as the page refreshes.
        page.locator("svg.dag .node[data-step=big]").click()
        drawer = page.locator("aside#drawer[data-step=big]")
        expect(drawer.locator("tr[data-field=records_total] td")).to_have_text("45")
        expect(drawer.locator("tr[data-field=records_last_batch] td")).to_have_text("40")
        expect(drawer.locator("tr[data-field=records_per_second] td")).to_have_text("10")
        expect(drawer.locator("tr[data-field=inputs] td")).to_have_text("orders")
        expect(drawer.locator("tr[data-field=read_by] td")).to_have_text("db")
        expect(drawer.locator("#step-records-chart polyline")).to_have_count(1)
        assert len(drawer.locator("#step-records-chart polyline").get_attribute("points").split()) == 2
        page.wait_for_timeout(1500)  # a refresh or more later
        expect(page.locator("svg.dag .node[data-step=big]")).to_have_class("node open")
        page.locator("svg.dag .node[data-step=db]").click()  # a sink: its write times
        drawer = page.locator("aside#drawer[data-step=db]")
        expect(drawer.locator("tr[data-field=write_seconds_total] td")).to_have_text("3.5 s")
        expect(drawer.locator("tr[data-field=write_ms_last_batch] td")).to_have_text("3,000 ms")
        expect(drawer.locator("tr[data-field=slow] td")).to_contain_text("yes")
        page.locator("svg.dag .node[data-step=ids]").click()  # fused with its neighbours: not counted
        expect(page.locator("aside#drawer[data-step=ids] #not-counted")).to_contain_text("not counted")
        page.locator("#drawer-close").click()
        expect(page.locator("aside#drawer")).to_have_count(0)

        # A score step's drawer shows the model version of the last batch; a learn step's, its drift flags.
        models = tmp_path / "models"
        hr.ml.publish(models, _FixedModel(), {"amount": "long"})
        scoring = hr.Pipeline("scoring")
        scoring.source("orders", hr.sources.Files(str(tmp_path), schema="id long, amount long")).score(
            str(models)).sink("scored", hr.sinks.Files(str(tmp_path / "scored"), format="jsonl"))
        learning = hr.Pipeline("learning")
        (learning.source("orders", hr.sources.Files(str(tmp_path), schema="id long, amount long, ts long"),
                         event_time="ts")
         .learn(_FixedModel, label="amount", features=["id"], drift=True, name="learner")
         .sink("learnt", hr.sinks.Files(str(tmp_path / "learnt"), format="jsonl")))
        for pipeline, progress in ((scoring, [{"batch": 0, "model_versions": {"score": 1}},
                                              {"batch": 1, "model_versions": {"score": 2}}]),
                                   (learning, [{"batch": 0, "drift_flags": {"learner": 2}},
                                               {"batch": 1, "drift_flags": {"learner": 1}}])):
            state = tmp_path / f"state_{pipeline.name}"
            (server.pipeline(pipeline.name, state) / "checkpoint").mkdir(parents=True)
            record_plan(pipeline.plan, str(state / pipeline.name))
            (state / "progress.jsonl").write_text("".join(json.dumps(b) + "\n" for b in progress))
        page.goto(f"{server.url}/?token={TOKEN}#/p/scoring")
        page.locator("svg.dag .node[data-step=score]").click()
        expect(page.locator("aside#drawer[data-step=score] tr[data-field=model_version] td")).to_have_text("v2")
        page.goto(f"{server.url}/?token={TOKEN}#/p/learning")
        page.locator("svg.dag .node[data-step=learner]").click()
        drawer = page.locator("aside#drawer[data-step=learner]")
        expect(drawer.locator("tr[data-field=drift_flags_total] td")).to_have_text("3")
        expect(drawer.locator("tr[data-field=drift_flags_last_batch] td")).to_have_text("1")
        assert problems == []
    finally:
        server.close()


def running(server: Any, name: str) -> None:
    """The pipeline ``name`` of ``server`` (in this process: no driver) marked running."""
    entry = server.registry.get(name)
    entry.status, entry.wanted = "running", True
    server.registry.put(entry)


class _FixedModel:
    """A model that predicts 1: enough for a registry and a learn step's plan (none runs here)."""

    def predict(self, rows: Any) -> list[int]:
        return [1] * len(rows)

    def predict_one(self, x: Any) -> int:
        return 1

    def learn_one(self, x: Any, y: Any) -> None:
        pass


# -- pages over pipelines written here (a server in this process, no driver, no JVM) ----------------

# Every element with id "error" the page shows (the page draws a failed refresh as one), kept in
# window.shownErrors even when the next refresh takes it away again.
RECORD_SHOWN_ERRORS = """
window.shownErrors = [];
new MutationObserver(() => {
  const shown = document.getElementById("error");
  if (shown && !window.shownErrors.includes(shown)) window.shownErrors.push(shown);
}).observe(document, { childList: true, subtree: true });
"""


def orders_pipeline(tmp_path: Path, views: bool) -> Any:
    import headrace as hr

    p = hr.Pipeline("orders")
    orders = p.source("orders", hr.sources.Files(str(tmp_path), schema="id long, customer string, amount long"))
    orders.sink("archive", hr.sinks.Files(str(tmp_path / "out"), format="jsonl"))
    if views:
        orders.key_by("customer").sum("amount", name="spend").queryable("spend_by_customer")
    return p


def written_pipeline(server: Any, tmp_path: Path, name: str, status: str, views: bool,
                     progress: list[dict[str, Any]]) -> Path:
    """A pipeline in ``server``'s registry with ``status``, its recorded plan (``orders_pipeline``
    under ``name``) and its progress file ``progress``; its root."""
    from headrace.runtime.compatibility import record_plan
    from headrace.server.registry import Entry

    state = tmp_path / f"state_{name}"
    root = state / name
    (root / "checkpoint").mkdir(parents=True)
    plan = orders_pipeline(tmp_path, views).plan
    record_plan(plan, str(root))
    (state / "progress.jsonl").write_text("".join(json.dumps(batch) + "\n" for batch in progress))
    server.registry.put(Entry(name, str(tmp_path / f"{name}.py"), str(state), status, status == "running"))
    return root


def renders(page: Any) -> int:
    return int(page.locator("#main").get_attribute("data-renders") or 0)


def wait_for_renders(page: Any, count: int) -> None:
    """Until the page has refreshed ``count`` more times (each refresh ends by counting itself)."""
    page.wait_for_function(f"() => Number(document.getElementById('main').dataset.renders || 0) >= {count}",
                           timeout=60_000)


def test_a_pipeline_page_without_a_view_refreshes_without_an_error(browser: Any, tmp_path: Path) -> None:
    """A page whose pipeline has no queryable view refreshed again and again: never an error shown
    (every other refresh failed on its missing table of views)."""
    from local_server import TOKEN
    from local_server import Server as LocalServer
    from playwright.sync_api import expect

    server = LocalServer(tmp_path)
    try:
        written_pipeline(server, tmp_path, "orders", "running", False,
                         [{"batch": 0, "batch_ms": 1000, "input_rows": 5, "rows_per_second": 5.0}])
        page = browser.new_page()
        problems: list[str] = []
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.add_init_script(RECORD_SHOWN_ERRORS)
        page.goto(f"{server.url}/?token={TOKEN}#/p/orders")
        expect(page.locator("#state")).to_contain_text("No views yet", timeout=30_000)
        wait_for_renders(page, renders(page) + 6)
        assert page.evaluate("window.shownErrors.map((shown) => shown.textContent)") == []
        assert problems == []
    finally:
        server.close()


def test_what_is_typed_in_the_state_lookup_keeps_its_focus_across_refreshes(browser: Any, tmp_path: Path) -> None:
    """Typing a key, a refresh or two, typing on: the field keeps the focus and all that was typed,
    and the lookup answers the row the store holds."""
    from local_server import TOKEN
    from local_server import Server as LocalServer
    from playwright.sync_api import expect

    from headrace.connectors.view_store import ViewWriter, store_path
    from headrace.environment.checkpoints import run_dir

    server = LocalServer(tmp_path)
    try:
        root = written_pipeline(server, tmp_path, "orders", "running", True,
                                [{"batch": 0, "batch_ms": 1000, "input_rows": 3, "rows_per_second": 3.0}])
        store = store_path(run_dir(str(root), "orders", ""))
        os.makedirs(os.path.dirname(store), exist_ok=True)
        ViewWriter(store).apply("spend_by_customer", ("customer",), 0, None,
                                [("c1", json.dumps({"customer": "c1", "sum": 15})),
                                 ("c2", json.dumps({"customer": "c2", "sum": 20}))])
        page = browser.new_page()
        page.goto(f"{server.url}/?token={TOKEN}#/p/orders")
        key = page.locator("#state-key")
        key.click()
        page.keyboard.type("c")
        wait_for_renders(page, renders(page) + 2)
        page.keyboard.type("1")
        wait_for_renders(page, renders(page) + 2)
        assert page.evaluate("document.activeElement.id") == "state-key"
        expect(key).to_have_value("c1")
        page.click("#state-lookup")
        expect(page.locator("#state-result")).to_contain_text('"sum": 15')
    finally:
        server.close()


def test_a_pipeline_that_is_not_running_shows_no_rate(browser: Any, tmp_path: Path) -> None:
    """A failed and a stopped pipeline whose last batch ran at 64.5 records/s: 0 in the list, on
    their pages and in their DAGs, as /metrics says; a running one shows its last batch's rate."""
    from local_server import TOKEN
    from local_server import Server as LocalServer
    from playwright.sync_api import expect

    server = LocalServer(tmp_path)
    last = {"batch": 3, "batch_ms": 2000, "input_rows": 129, "rows_per_second": 64.5,
            "step_records": {"orders": 129}}
    try:
        for name, status in (("failed_one", "failed"), ("stopped_one", "stopped"), ("running_one", "running")):
            written_pipeline(server, tmp_path, name, status, False, [last])
        page = browser.new_page()
        page.goto(f"{server.url}/?token={TOKEN}")
        for name, rate in (("failed_one", "0"), ("stopped_one", "0"), ("running_one", "64.5")):
            expect(page.locator(f"#pipelines tr[data-pipeline={name}] td").nth(3)).to_have_text(rate, timeout=30_000)
        for name, rate, drawn in (("failed_one", "0", "129 records"), ("running_one", "64.5", "129 records, 65/s")):
            page.goto(f"{server.url}/?token={TOKEN}#/p/{name}")
            expect(page.locator(".kpi[data-kpi='records/s'] b")).to_have_text(rate, timeout=30_000)
            expect(page.locator("svg.dag .node[data-step=orders] .figures")).to_have_text(drawn)
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        gauges = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines()
                  if line.startswith("headrace_input_records_per_second")}
        assert gauges == {'headrace_input_records_per_second{pipeline="failed_one"}': "0",
                          'headrace_input_records_per_second{pipeline="stopped_one"}': "0",
                          'headrace_input_records_per_second{pipeline="running_one"}': "64.5"}
    finally:
        server.close()
