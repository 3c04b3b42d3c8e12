"""Serving: the merge rule on inline data, and the read-only guard through the real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from include.coverage import bronze_fingerprint, coverage_runs, mark_covered, mark_rerun_started
from include.views import VIEWS, VIEWS_BY_NAME
from include.lakehouse import LakehouseError, open_store
from serving import engine as engine_module
from serving.engine import QueryRefused, QueryTimeout, ServingEngine

D1, D2 = date(2026, 11, 20), date(2026, 11, 21)

REVENUE = VIEWS_BY_NAME["revenue_by_category_5m"]


def revenue_row(day, revenue):
    start = datetime(day.year, day.month, day.day, 10, 0, tzinfo=timezone.utc)
    return (start, start.replace(minute=5), "books", revenue, 1, 1, day)


@pytest.fixture
def lake(spark, settings):
    store = open_store(settings, spark)
    for table in (REVENUE.speed_table, REVENUE.batch_table):
        store.ensure_table(table, REVENUE.schema, ["date"])
    store.append(REVENUE.speed_table,
                 spark.createDataFrame([revenue_row(D1, 1.0), revenue_row(D2, 2.0)], REVENUE.schema))
    store.append(REVENUE.batch_table, spark.createDataFrame([revenue_row(D1, 10.0)], REVENUE.schema))
    return settings, store


def served(settings):
    rows = ServingEngine(settings).rows(
        "SELECT window_start, revenue, source FROM revenue_by_category_5m ORDER BY window_start")
    return [(r["window_start"].date(), r["revenue"], r["source"]) for r in rows]


def test_uncovered_days_come_from_speed_covered_days_from_batch(lake):
    settings, store = lake
    assert served(settings) == [(D1, 1.0, "speed"), (D2, 2.0, "speed")]
    mark_covered(store, D1, {})
    assert served(settings) == [(D1, 10.0, "batch"), (D2, 2.0, "speed")]


def test_an_open_engine_refreshes_only_the_tables_that_changed(lake):
    settings, store = lake
    engine = ServingEngine(settings)
    total = "SELECT sum(revenue) AS r FROM revenue_by_category_5m"
    assert engine.rows(total) == [{"r": 3.0}]
    assert engine.refresh() == []
    store.append(REVENUE.speed_table, store.spark.createDataFrame([revenue_row(D2, 5.0)], REVENUE.schema))
    assert engine.rows(total) == [{"r": 3.0}]  # the snapshot it opened, until refreshed
    assert engine.refresh() == ["speed_revenue_by_category_5m"]
    assert engine.rows(total) == [{"r": 8.0}]
    mark_covered(store, D1, {})  # a table that did not exist when the engine opened
    assert engine.refresh() == ["coverage"]
    assert engine.rows(total) == [{"r": 17.0}]
    with pytest.raises(QueryRefused):  # still read-only after re-registering
        engine.query("COPY (SELECT 1) TO 'x.csv'")


def test_a_rerun_is_served_only_once_it_publishes_and_then_whole(lake):
    settings, store = lake
    def rows(engine):
        return [(r["day"], r["revenue"]) for r in engine.rows(
            "SELECT CAST(window_start AS DATE) AS day, revenue FROM revenue_by_category_5m "
            "WHERE source = 'batch' ORDER BY day, revenue")]

    mark_covered(store, D1, {}, "first")
    engine = ServingEngine(settings)
    assert rows(engine) == [(D1, 10.0)]
    assert mark_rerun_started(store, D1) and not mark_rerun_started(store, D2)  # D2 is not covered
    store.replace_partition(REVENUE.batch_table, store.spark.createDataFrame([revenue_row(D1, 99.0)], REVENUE.schema),
                            {"date": D1})
    engine.refresh()
    assert rows(engine) == rows(ServingEngine(settings)) == [(D1, 10.0)]  # the rerun has not published
    # Another day's run publishes a version past the unpublished rerun's: D1 stays at its own.
    store.replace_partition(REVENUE.batch_table, store.spark.createDataFrame([revenue_row(D2, 20.0)], REVENUE.schema),
                            {"date": D2})
    mark_covered(store, D2, {}, "other-day")
    engine.refresh()
    assert rows(engine) == rows(ServingEngine(settings)) == [(D1, 10.0), (D2, 20.0)]
    pending = {row["date"]: (row["run_id"], row["rerun_started_at"] is not None) for row in coverage_runs(store)}
    assert pending == {D1: ("first", True), D2: ("other-day", False)}
    store.append(REVENUE.batch_table, store.spark.createDataFrame([revenue_row(D1, 1.0)], REVENUE.schema))
    mark_covered(store, D1, {}, "second")
    engine.refresh()
    assert rows(engine) == rows(ServingEngine(settings)) == [(D1, 1.0), (D1, 99.0), (D2, 20.0)]
    # A compaction after the publication serves the same rows from its files, so vacuum may go.
    published = store.version(REVENUE.batch_table)
    store.optimize(REVENUE.batch_table)
    store.vacuum(REVENUE.batch_table, retention_hours=0)
    assert store.version(REVENUE.batch_table) > published
    engine.refresh()
    assert engine.version("batch_revenue_by_category_5m") == store.version(REVENUE.batch_table)
    assert rows(engine) == rows(ServingEngine(settings)) == [(D1, 1.0), (D1, 99.0), (D2, 20.0)]


def test_a_day_held_back_whose_files_vacuum_deleted_is_refused_with_the_command_to_run(lake):
    settings, store = lake
    mark_covered(store, D1, {}, "first")
    mark_rerun_started(store, D1)
    store.replace_partition(REVENUE.batch_table, store.spark.createDataFrame([revenue_row(D1, 99.0)], REVENUE.schema),
                            {"date": D1})
    store.replace_partition(REVENUE.batch_table, store.spark.createDataFrame([revenue_row(D2, 20.0)], REVENUE.schema),
                            {"date": D2})
    mark_covered(store, D2, {}, "other-day")  # D1 is now read at an older version than the table's published one
    engine = ServingEngine(settings)
    store.vacuum(REVENUE.batch_table, retention_hours=0)
    with pytest.raises(LakehouseError, match=r"day 2026-11-20 .* vacuum has deleted .* `lambdalake batch --date "
                                             r"2026-11-20`"):
        ServingEngine(settings)
    assert engine.rows("SELECT count(*) AS n FROM revenue_by_category_5m WHERE source = 'batch'") == [{"n": 2}]


def test_refresh_follows_replaced_and_compacted_files(lake):
    settings, store = lake
    engine = ServingEngine(settings)
    speed = "SELECT revenue FROM _lake.speed_revenue_by_category_5m ORDER BY revenue"
    for revenue in (3.0, 4.0):
        store.append(REVENUE.speed_table, store.spark.createDataFrame([revenue_row(D2, revenue)], REVENUE.schema))
    store.replace_partition(REVENUE.speed_table, store.spark.createDataFrame([revenue_row(D1, 7.0)], REVENUE.schema),
                            {"date": D1})
    engine.refresh()
    assert [r["revenue"] for r in engine.rows(speed)] == [2.0, 3.0, 4.0, 7.0]
    store.optimize(REVENUE.speed_table)  # removes three files of 2026-11-21 and adds one
    assert engine.refresh() == ["speed_revenue_by_category_5m"]
    assert [r["revenue"] for r in engine.rows(speed)] == [2.0, 3.0, 4.0, 7.0]
    assert engine.rows(speed) == ServingEngine(settings).rows(speed)


def test_a_failed_refresh_changes_nothing_and_the_next_one_catches_up(lake, monkeypatch):
    settings, store = lake
    engine = ServingEngine(settings)
    total = ("SELECT (SELECT sum(revenue) FROM _lake.speed_revenue_by_category_5m) "
             "+ (SELECT sum(revenue) FROM _lake.batch_revenue_by_category_5m) AS r")
    assert engine.rows(total) == [{"r": 13.0}]
    for table in (REVENUE.speed_table, REVENUE.batch_table):
        store.append(table, store.spark.createDataFrame([revenue_row(D2, 100.0)], REVENUE.schema))
    real_rows = engine_module._rows
    calls = []

    def second_fails(schema, fragments):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("a file vanished")
        return real_rows(schema, fragments)

    monkeypatch.setattr(engine_module, "_rows", second_fails)
    with pytest.raises(OSError):
        engine.refresh()
    assert engine.rows(total) == [{"r": 13.0}]  # neither table moved
    assert sorted(engine.refresh()) == ["batch_revenue_by_category_5m", "speed_revenue_by_category_5m"]
    assert engine.rows(total) == [{"r": 213.0}]


def test_a_query_past_the_time_limit_is_cancelled(settings):
    engine = ServingEngine(settings, query_timeout=0.5)
    with pytest.raises(QueryTimeout, match="0.5 s time limit"):
        engine.query("SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000000) b")
    assert engine.rows("SELECT count(*) AS n FROM dlq") == [{"n": 0}]  # the engine still answers


def test_queries_see_days_in_utc_whatever_the_machine_time_zone(settings, monkeypatch):
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        rows = ServingEngine(settings).rows("SELECT CAST(TIMESTAMPTZ '2026-11-21 02:00:00+00' AS DATE) AS day")
    finally:
        monkeypatch.undo()
        time.tzset()
    assert rows == [{"day": D2}]


def test_missing_tables_serve_empty_views(settings):
    assert ServingEngine(settings).rows("SELECT count(*) AS n FROM order_payments") == [{"n": 0}]


FORBIDDEN = [
    "DROP VIEW revenue_by_category_5m",
    "DELETE FROM dlq",
    "INSERT INTO dlq VALUES ('x', 'x', 'x', 'x', now())",
    "CREATE TABLE stolen AS SELECT 1",
    "ATTACH 'other.duckdb' AS other",
    "COPY (SELECT * FROM revenue_by_category_5m) TO 'out.csv'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_parquet('{lake}/speed/revenue_by_category_5m/*/*.parquet')",
    "SELECT 1; SELECT 2",
    "SET enable_external_access = true",
    "PRAGMA database_list",
]


@pytest.mark.parametrize("sql", FORBIDDEN)
def test_forbidden_queries_exit_non_zero_and_change_nothing(lake, sql, tmp_path, monkeypatch, capsys):
    settings, store = lake
    before = {path: path.stat().st_mtime_ns for path in settings.lakehouse_dir.rglob("*")}
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    argv = ["query", "--home", str(settings.home), sql.format(lake=settings.lakehouse_dir)]
    if sql == FORBIDDEN[0]:  # one through the installed command; the others in-process (same main, no start-up)
        result = subprocess.run([Path(sys.executable).parent / "lambdalake", *argv], capture_output=True, text=True,
                                cwd=workdir)
        code, stdout, stderr = result.returncode, result.stdout, result.stderr
    else:
        from lambdalake.cli import main

        monkeypatch.chdir(workdir)
        code = main(argv)
        stdout, stderr = capsys.readouterr()
    assert code == 2, stdout
    assert stderr.startswith("lambdalake: error: ") and len(stderr.strip().splitlines()) == 1
    assert {path: path.stat().st_mtime_ns for path in settings.lakehouse_dir.rglob("*")} == before
    assert list(workdir.iterdir()) == []  # nothing written where the query ran either


def test_query_formats(lake):
    settings, _ = lake
    lambdalake = Path(sys.executable).parent / "lambdalake"
    sql = "SELECT window_start, revenue, source FROM revenue_by_category_5m ORDER BY revenue"
    as_json = subprocess.run([lambdalake, "query", "--home", settings.home, sql, "--format", "json"],
                             capture_output=True, text=True, check=True)
    assert json.loads(as_json.stdout) == [
        {"window_start": "2026-11-20T10:00:00Z", "revenue": 1.0, "source": "speed"},
        {"window_start": "2026-11-21T10:00:00Z", "revenue": 2.0, "source": "speed"},
    ]
    as_csv = subprocess.run([lambdalake, "query", "--home", settings.home, sql, "--format", "csv"],
                            capture_output=True, text=True, check=True)
    assert as_csv.stdout.splitlines()[0] == "window_start,revenue,source"
    with pytest.raises(QueryRefused):
        ServingEngine(settings).query("DROP VIEW dlq")


def test_status_reports_coverage_versions_and_stream_state(lake):
    settings, store = lake
    mark_covered(store, D1, bronze_fingerprint(store, settings, D1))
    landed = settings.landing_topic_dir("orders") / "000001.jsonl"  # no stream has taken it
    landed.parent.mkdir(parents=True, exist_ok=True)
    landed.write_text('{"order_id": "o1"}\n')
    os.utime(landed, (time.time() - 3 * 3600, time.time() - 3 * 3600))
    lambdalake = Path(sys.executable).parent / "lambdalake"
    result = subprocess.run([lambdalake, "status", "--home", settings.home, "--format", "json"],
                            capture_output=True, text=True, check=True)
    rows = {row["view"]: row for row in json.loads(result.stdout)}
    assert set(rows) == {view.name for view in VIEWS}
    revenue = rows["revenue_by_category_5m"]
    assert revenue["batch_covered_days"] == "2026-11-20" and revenue["stale_days"] == ""
    assert revenue["speed_version"] == 1 and revenue["batch_version"] == 1
    assert revenue["batch_runs"].startswith("2026-11-20: batch__") and revenue["batch_reruns_unpublished"] == ""
    # No stream metrics here: the newest window's start, never a time after the events counted.
    assert revenue["speed_max_event_time"] == "2026-11-21T10:00:00Z" and revenue["speed_refreshed_at"] is None
    assert revenue["stream_state"] == "never started"
    assert (revenue["input_waiting_files"], revenue["input_waiting_bytes"]) == (1, 19)
    assert 3 * 3600 <= revenue["input_lag_seconds"] < 3 * 3600 + 300

    summary = subprocess.run([lambdalake, "status", "--home", settings.home], capture_output=True, text=True,
                             check=True)
    lines = summary.stdout.splitlines()
    assert lines[0] == "stream: never started; 1 landed files waiting (0.0 MB), the oldest for 3 h"
    assert lines[-1] == "alerts: none"
    assert lines[-2].startswith("batch: 2026-11-20 served from run batch__2026-")
    assert any(line.startswith("revenue_by_category_5m  2026-11-21 10:00Z (") and "1 (last 2026-11-20)" in line
               for line in lines)
    assert max(map(len, lines)) <= 100  # fits a terminal


def test_history_and_query_as_of_a_version_or_a_time(lake):
    settings, store = lake
    lambdalake = Path(sys.executable).parent / "lambdalake"
    sql = "SELECT revenue FROM revenue_by_category_5m ORDER BY revenue"
    between = datetime.now(timezone.utc)
    time.sleep(0.05)
    store.append(REVENUE.speed_table, store.spark.createDataFrame([revenue_row(D2, 9.0)], REVENUE.schema))

    def query(*options):
        result = subprocess.run([lambdalake, "query", "--home", settings.home, sql, "--format", "json", *options],
                                capture_output=True, text=True, check=True)
        return [row["revenue"] for row in json.loads(result.stdout)]

    assert query() == [1.0, 2.0, 9.0]
    assert query("--as-of", "1") == [1.0, 2.0]
    assert query("--as-of", between.isoformat()) == [1.0, 2.0]
    assert query("--as-of", "2026-01-01T00:00:00Z") == []  # before the tables existed

    result = subprocess.run([lambdalake, "history", REVENUE.speed_table, "--home", settings.home, "--format", "json"],
                            capture_output=True, text=True, check=True)
    history = json.loads(result.stdout)
    assert [(v["version"], v["rows"], v["files"]) for v in history] == [(2, 3, 3), (1, 2, 2), (0, 0, 0)]
    assert history[0]["operation"] and history[0]["committed_at"] > between.isoformat()[:19]

    unknown = subprocess.run([lambdalake, "history", "speed/nope", "--home", settings.home], capture_output=True,
                             text=True)
    assert unknown.returncode == 2 and "no Delta table 'speed/nope'" in unknown.stderr
    assert REVENUE.speed_table in unknown.stderr


def test_as_of_a_time_or_version_older_than_a_tables_log_is_refused(spark, settings):
    """A table the stream writes keeps a short log (here a second, cleaned at each second
    commit's checkpoint): older versions are gone, and an answer from them would be made up.
    delta-spark cleans only log files older than the UTC day the retention reaches back to, so
    the first commits' files are made two days old."""
    store = open_store(settings, spark)
    store.ensure_table(REVENUE.speed_table, REVENUE.schema, ["date"],
                       {"delta.logRetentionDuration": "interval 1 second",
                        "delta.deletedFileRetentionDuration": "interval 1 second", "delta.checkpointInterval": "2"})
    log = settings.lakehouse_dir / REVENUE.speed_table / "_delta_log"
    before = datetime.now(timezone.utc)
    time.sleep(0.1)
    for revenue in (1.0, 2.0, 3.0, 4.0):
        store.append(REVENUE.speed_table, spark.createDataFrame([revenue_row(D1, revenue)], REVENUE.schema))
        if revenue == 2.0:  # the checkpoint at version 2 is written; the next at 4 cleans what is older
            two_days_ago = time.time() - 2 * 86400
            for version in (0, 1):
                for file in log.glob(f"{version:020d}.*"):
                    os.utime(file, (two_days_ago, two_days_ago))
    kept = [commit["version"] for commit in DeltaTable(str(settings.lakehouse_dir / REVENUE.speed_table)).history()]
    assert max(kept) == 4 and min(kept) > 1  # versions 0 and 1 left the log
    lambdalake = Path(sys.executable).parent / "lambdalake"
    for as_of, says in ((before.isoformat(), "keeps versions from"), ("1", f"keeps versions {min(kept)} to 4 only")):
        refused = subprocess.run([lambdalake, "query", "--home", settings.home, "--as-of", as_of,
                                  "SELECT count(*) FROM revenue_by_category_5m"], capture_output=True, text=True)
        assert refused.returncode == 2 and says in refused.stderr and "lambdalake history" in refused.stderr, refused
    assert ServingEngine(settings, as_of=4).rows("SELECT count(*) AS n FROM revenue_by_category_5m") == [{"n": 4}]
