"""Versioned outputs and ``headrace switch`` (docs/backfill.md): a second version of a pipeline
reprocesses the history into its own PostgreSQL table (or folder) beside the first while a
reader reads the first through a view (or a link); the switch moves the reader in one step. A
Lambda serving view merges a batch table before a cut-off with a live table from it on. Checked
against sums and rows computed in plain Python from the input files."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from conftest import PG_DSN

import headrace as hr
from headrace.cli import main
from headrace.connectors.files_sink import read_rows

ORDERS = [{"id": i, "amount": float(i % 17 + 1)} for i in range(300)]


def write_orders(folder: Path) -> None:
    folder.mkdir()
    for n in range(3):
        (folder / f"part-{n}.jsonl").write_text("".join(json.dumps(o) + "\n" for o in ORDERS[n * 100:n * 100 + 100]))


def version(name: str, folder: Path, rate: float, sink: hr.sinks.SinkConnector) -> hr.Pipeline:
    """A pipeline version: each order's total at a tax rate."""
    p = hr.Pipeline(name)
    (p.source("orders", hr.sources.Files(str(folder), "jsonl", "id long, amount double", max_files_per_batch=1,
                                         bounded=True))
     .with_columns(total=hr.col("amount") * rate)
     .sink("out", sink))
    return p


def answer(rate: float) -> tuple[int, float]:
    return len(ORDERS), round(sum(o["amount"] * rate for o in ORDERS), 6)


def test_a_second_version_reprocesses_the_history_beside_the_first_and_the_switch_moves_readers_at_once(
        spark, pg, tmp_path, capsys):
    for table in ("orders_live", "orders_v1", "orders_v2"):
        pg.execute(f"DROP VIEW IF EXISTS {table}") if table == "orders_live" else pg.execute(
            f"DROP TABLE IF EXISTS {table}")
    write_orders(tmp_path / "in")
    hr.run(version("orders_v1", tmp_path / "in", 1.0, hr.sinks.Postgres("orders_v1", PG_DSN, key="id")),
           state_dir=str(tmp_path / "state"), progress="quiet")
    assert main(["switch", "orders_live", "orders_v1", "--dsn", PG_DSN]) == 0
    assert capsys.readouterr().out == "orders_live -> orders_v1\n"

    seen: list[tuple[int, float]] = []
    failures: list[BaseException] = []
    reading = threading.Event()
    reading.set()

    def reader() -> None:  # a reader of the view, all the while
        import psycopg

        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            while reading.is_set():
                try:
                    count, total = conn.execute("SELECT count(*), sum(total) FROM orders_live").fetchone()
                    seen.append((count, round(total, 6)))
                except Exception as exc:  # noqa: BLE001 - any failure of a read fails the test
                    failures.append(exc)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        hr.run(version("orders_v2", tmp_path / "in", 1.19, hr.sinks.Postgres("orders_v2", PG_DSN, key="id")),
               state_dir=str(tmp_path / "state"), progress="quiet", backfill=True)
        assert main(["switch", "orders_live", "orders_v2", "--dsn", PG_DSN]) == 0
        switched_at = len(seen)
        while len(seen) < switched_at + 20 and thread.is_alive():
            time.sleep(0.01)
    finally:
        reading.clear()
        thread.join(30)
    assert capsys.readouterr().out == "orders_live -> orders_v2 (was public.orders_v1)\n"
    assert not failures, failures[:3]
    assert set(seen) <= {answer(1.0), answer(1.19)} and seen[0] == answer(1.0) and seen[-1] == answer(1.19)
    first_new = seen.index(answer(1.19))
    assert all(s == answer(1.19) for s in seen[first_new:])  # once moved, readers never see the old version
    assert pg.execute("SELECT count(*) FROM orders_v1").fetchone()[0] == len(ORDERS)  # the old one is kept


def test_a_link_to_a_folder_is_switched_between_two_versions_written_by_files_sinks(spark, tmp_path, capsys):
    write_orders(tmp_path / "in")
    for name, rate in (("v1", 1.0), ("v2", 1.19)):
        hr.run(version(f"orders_files_{name}", tmp_path / "in", rate,
                       hr.sinks.Files(str(tmp_path / f"orders@{name}"), format="jsonl")),
               state_dir=str(tmp_path / "state"), progress="quiet")
    link = str(tmp_path / "orders")
    assert main(["switch", link, str(tmp_path / "orders@v1")]) == 0
    assert sorted(r["total"] for r in read_rows(link, "jsonl")) == sorted(o["amount"] for o in ORDERS)
    assert main(["switch", link, str(tmp_path / "orders@v2")]) == 0
    was, now = tmp_path / "orders@v1", tmp_path / "orders@v2"
    assert capsys.readouterr().out.splitlines()[-1] == f"{link} -> {now} (was {was})"
    assert sorted(r["total"] for r in read_rows(link, "jsonl")) == sorted(o["amount"] * 1.19 for o in ORDERS)


def test_a_lambda_serving_view_merges_the_batch_table_before_the_cut_off_with_the_live_one_after(pg, capsys):
    for table in ("clicks_batch", "clicks_live", "clicks_wrong"):
        pg.execute(f"DROP TABLE IF EXISTS {table} CASCADE")
    pg.execute("DROP VIEW IF EXISTS clicks_serving")
    pg.execute("CREATE TABLE clicks_batch (page text, hour timestamptz, clicks bigint)")
    pg.execute("CREATE TABLE clicks_live (page text, hour timestamptz, clicks bigint)")
    batch = [("a", f"2026-11-0{d}T00:00:00Z", d * 10) for d in range(1, 6)]  # recomputed history, 1-5 Nov
    live = [("a", f"2026-11-0{d}T00:00:00Z", d) for d in range(3, 8)]  # the speed layer, 3-7 Nov
    with pg.cursor() as cur:
        cur.executemany("INSERT INTO clicks_batch VALUES (%s, %s, %s)", batch)
        cur.executemany("INSERT INTO clicks_live VALUES (%s, %s, %s)", live)
    assert main(["switch", "clicks_serving", "--batch", "clicks_batch", "--live", "clicks_live", "--time", "hour",
                 "--cutoff", "2026-11-04T00:00:00Z", "--dsn", PG_DSN]) == 0
    rows = pg.execute("SELECT clicks FROM clicks_serving ORDER BY hour").fetchall()
    cutoff = "2026-11-04T00:00:00Z"
    assert [r[0] for r in rows] == [c for _, h, c in batch if h < cutoff] + [c for _, h, c in live if h >= cutoff]
    assert capsys.readouterr().out.startswith("clicks_serving -> clicks_batch before 2026-11-04T00:00:00Z")


@pytest.mark.parametrize("argv, message", [
    (["switch", "clicks_batch", "clicks_live", "--dsn", PG_DSN], "switch: 'clicks_batch' is a table, not a view; "
                                                                 "readers must read a view to be switched"),
    (["switch", "orders_live", "no_such_table", "--dsn", PG_DSN], "switch: there is no table 'no_such_table' to "
                                                                  "point 'orders_live' at"),
    (["switch", "clicks_serving", "--batch", "clicks_batch", "--live", "clicks_wrong", "--time", "hour", "--cutoff",
      "2026-11-04", "--dsn", PG_DSN], "switch: the batch table 'clicks_batch' has the columns page, hour, clicks and "
                                      "the live table 'clicks_wrong' page, clicks: a serving view needs the same ones"),
    (["switch", "clicks_serving", "--batch", "clicks_batch", "--dsn", PG_DSN],
     "switch: a serving view needs --batch, --live, --time, --cutoff and --dsn, and no TARGET"),
])
def test_a_switch_that_cannot_be_made_changes_nothing_and_says_why(pg, capsys, argv, message):
    pg.execute("CREATE TABLE IF NOT EXISTS clicks_batch (page text, hour timestamptz, clicks bigint)")
    pg.execute("CREATE TABLE IF NOT EXISTS clicks_live (page text, hour timestamptz, clicks bigint)")
    pg.execute("CREATE TABLE IF NOT EXISTS clicks_wrong (page text, clicks bigint)")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"headrace: {message}") and err.count("\n") == 1, err


@pytest.mark.fast
def test_a_folder_is_not_replaced_by_a_link(tmp_path, capsys):
    (tmp_path / "orders").mkdir()
    (tmp_path / "orders@v2").mkdir()
    assert main(["switch", str(tmp_path / "orders"), str(tmp_path / "orders@v2")]) == 1
    assert "is a folder, not a link; readers must read a link to be switched" in capsys.readouterr().err
    assert (tmp_path / "orders").is_dir() and not (tmp_path / "orders").is_symlink()
