"""Who runs the nightly batch's views (LAMBDALAKE_BATCH_ENGINE). Both engines' rows are checked
against the generator's truth end to end (tests/e2e: the default on the driver, Spark on both
lakehouse engines); the definitions' agreement across engines view by view in test_views."""

from __future__ import annotations

from dataclasses import replace
from datetime import date, datetime, timezone

import pyarrow as pa
import pytest

from batch_layer import recompute
from include import tables
from include.config import ConfigError
from include.coverage import input_days
from include.lakehouse import open_store

DAY = date(2026, 11, 20)


def land(store, topic: str, day: date, lines: int) -> None:
    """``lines`` Bronze lines of ``topic`` with event date ``day``."""
    store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
    now = datetime.now(timezone.utc)
    row = {"value": b"{}", "topic": topic, "source": "test", "arrived_at": now, "ingested_at": now, "batch_id": 0,
           "event_date": day}
    schema = tables.arrow_schema(tables.BRONZE_SCHEMA)
    store.append(tables.bronze(topic), pa.Table.from_pylist([{name: row.get(name) for name in schema.names}] * lines,
                                                            schema))


def test_auto_runs_a_moderate_day_on_a_local_masters_driver(settings, monkeypatch):
    settings = settings.model_copy(update={"batch_engine": "auto"})
    store = open_store(settings)
    land(store, "orders", DAY, 3)
    days = input_days(store, settings, DAY)
    assert recompute.on_driver(store, settings, days)
    monkeypatch.setattr(recompute, "DRIVER_MAX_ROWS", 2)  # a day too large to hold on the driver
    assert not recompute.on_driver(store, settings, days)
    assert recompute.on_driver(store, settings.model_copy(update={"batch_engine": "duckdb"}), days)
    on_cluster = settings.model_copy(update={"spark_master": "spark://master:7077"})
    assert not recompute.on_driver(store, on_cluster, days)
    monkeypatch.setattr(recompute, "DRIVER_MAX_ROWS", 3)
    assert recompute.on_driver(store, settings, days)
    assert not recompute.on_driver(store, settings.model_copy(update={"batch_engine": "spark"}), days)


def test_duckdb_is_refused_for_a_view_it_cannot_run(settings, monkeypatch):
    from include.views import VIEWS

    store = open_store(settings)
    view = VIEWS[0]
    monkeypatch.setattr(recompute, "VIEWS", [replace(view, declared_in_sql=False), *VIEWS[1:]])
    with pytest.raises(ConfigError, match=f"LAMBDALAKE_BATCH_ENGINE=duckdb: {view.name} not declared in SQL"):
        recompute.on_driver(store, settings.model_copy(update={"batch_engine": "duckdb"}), {})
    assert not recompute.on_driver(store, settings.model_copy(update={"batch_engine": "auto"}), {})  # Spark runs it


def test_both_engines_rebuild_and_reconcile_a_day_alike(streamed_lake, tmp_path):
    """The same streamed day rebuilt and reconciled by DuckDB on the driver and by Spark: the same
    batch rows, reconciliation and differences (the dimensions and alerts have no speed rows here,
    so their differences are the batch's every row)."""
    from batch_layer.reconcile import reconcile_day
    from include.views import VIEWS

    def rows(store, table):
        if not store.exists(table):
            return []
        return sorted(store.read(table).drop("detected_at", "computed_at").toArrow().to_pylist(), key=repr)

    tables_read = [table for view in VIEWS for table in (view.batch_table, view.differences and view.differences.table)
                   if table]
    seen = {}
    for engine in ("duckdb", "spark"):
        settings = streamed_lake.copy_to(tmp_path / engine).model_copy(update={"batch_engine": engine})
        store = open_store(settings)
        written = recompute.recompute_day(store, settings, DAY)
        reconciled = sorted((r["view"], r["metric"], r["speed_value"], r["batch_value"])
                            for r in reconcile_day(store, settings, DAY))
        seen[engine] = written, reconciled, {table: rows(store, table) for table in [*tables_read, "reconciliation"]}
    assert seen["duckdb"] == seen["spark"]
    written, reconciled, _ = seen["duckdb"]
    assert written["batch/order_payments"] > 0 and ("order_payments", "late_matches_recovered") in {
        (view, metric) for view, metric, *_ in reconciled}


def test_the_driver_reads_a_days_events_as_spark_does(settings, spark):
    """events_on_driver (the driver's parser, Spark for odd lines, first copies in Arrow) gives
    :func:`recompute.events`' rows: valid, odd, rejected and repeated lines, copies that differ
    in arrival, source or bytes, and a line of another day."""
    store = open_store(settings, spark)
    schema = tables.arrow_schema(tables.BRONZE_SCHEMA)
    store.ensure_table(tables.bronze("orders"), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
    at = datetime(2026, 11, 20, 10, tzinfo=timezone.utc)

    def order(order_id: str, time: str = "2026-11-20T09:00:00Z", amount: str = "12.5") -> bytes:
        return (f'{{"order_id": "{order_id}", "user_id": "u1", "product_id": "p1", "category": "books", '
                f'"amount": {amount}, '
                f'"event_time": "{time}"}}').encode()

    lines = [
        (order("o1"), "b", at), (order("o1"), "a", at), (order("o1", amount="12.50"), "a", at),  # copies
        (order("o2"), "a", at.replace(hour=11)), (order("o2", amount="13"), "z", at),
        (order("o3", "2026-11-20T09:00:00.123456789Z"), "a", at),  # odd: Spark decides it
        (order("o4", amount='"12.50 EUR"'), "a", at), (order("o5")[:30], "a", at),  # rejected
        (order("o6", "2026-11-21T01:00:00Z"), "a", at),  # another day
        (order("o7", "2026-11-20T23:00:00-02:00"), "a", at), (order("o7", "2026-11-21T01:00:00Z"), "a", at),
    ]
    rows = [{"value": value, "topic": "orders", "source": source, "arrived_at": arrived, "ingested_at": at,
             "batch_id": 0, "event_date": date(2026, 11, 21) if b"11-21" in value else DAY}
            for value, source, arrived in lines]
    store.append(tables.bronze("orders"), pa.Table.from_pylist([{n: r.get(n) for n in schema.names} for r in rows],
                                                               schema))
    for days in ([DAY], [DAY, date(2026, 11, 21)]):
        theirs = recompute.events(store, settings, "orders", days).toArrow()
        mine = recompute.events_on_driver(store, settings, "orders", days)
        assert mine.schema == theirs.schema
        assert sorted(mine.to_pylist(), key=repr) == sorted(theirs.to_pylist(), key=repr)
        assert {"o1", "o2", "o3"} <= set(mine["order_id"].to_pylist()) and "o4" not in mine["order_id"].to_pylist()
