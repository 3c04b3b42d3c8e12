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
