"""Nightly data-quality checks on real tables: pass when the numbers add up, fail loudly when not."""

from __future__ import annotations

from datetime import date, datetime, timezone

import pyarrow as pa
import pytest

from batch_layer.nightly import DataQualityError, check_data_quality
from include import tables
from include.lakehouse import open_store

DAY = date(2026, 11, 20)


def reconciliation(store, speed_rows, batch_rows, speed_orders, batch_orders):
    at = datetime.now(timezone.utc)
    rows = [
        ("revenue_by_category_5m", "rows", speed_rows, batch_rows),
        ("revenue_by_category_5m", "orders", speed_orders, batch_orders),
        ("order_payments", "rows", speed_orders, batch_orders),
        ("revenue_by_segment_1h", "orders", speed_orders, batch_orders),
    ]
    data = [{"view": v, "date": DAY, "metric": m, "speed_value": float(s), "batch_value": float(b),
             "diff": float(b - s), "computed_at": at} for v, m, s, b in rows]
    store.ensure_table(tables.RECONCILIATION, tables.RECONCILIATION_SCHEMA, ["date"])
    store.append(tables.RECONCILIATION,
                 pa.Table.from_pylist(data, schema=tables.arrow_schema(tables.RECONCILIATION_SCHEMA)))
    store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA)


def test_passes_when_the_numbers_add_up(settings):
    store = open_store(settings)
    reconciliation(store, speed_rows=95, batch_rows=100, speed_orders=190, batch_orders=200)
    passed = check_data_quality(settings, DAY, store)
    assert "revenue_by_category_5m.orders = order_payments.rows" in passed


def test_a_backfilled_day_without_speed_rows_is_not_drift(settings):
    store = open_store(settings)
    reconciliation(store, speed_rows=0, batch_rows=100, speed_orders=0, batch_orders=200)
    check_data_quality(settings, DAY, store)


def test_fails_loudly_on_drift(settings):
    store = open_store(settings)
    reconciliation(store, speed_rows=10, batch_rows=100, speed_orders=20, batch_orders=200)
    with pytest.raises(DataQualityError,
                       match=r"revenue_by_category_5m.orders: speed within 50% of batch fails: drift 90.0%"):
        check_data_quality(settings, DAY, store)


def test_bronze_of_a_micro_batch_killed_before_its_accounting_is_not_a_lost_line(settings):
    """The stream writes a micro-batch's Bronze beside its other tables and the accounting row
    last: killed in between, Bronze holds a batch the accounting does not count yet (its replay
    will). A line missing from a counted batch still fails the check."""
    store = open_store(settings)
    reconciliation(store, speed_rows=95, batch_rows=100, speed_orders=190, batch_orders=200)
    store.ensure_table(tables.bronze("orders"), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
    at = datetime.now(timezone.utc)

    def bronze(batch_id, lines):
        rows = [{"value": b"{}", "source": "f", "arrived_at": at, "ingested_at": at,
                 "batch_id": batch_id, "event_date": DAY} for _ in range(lines)]
        schema = tables.arrow_schema(tables.BRONZE_FIELDS)
        store.append(tables.bronze("orders"), pa.Table.from_pylist(rows, schema=schema).select(schema.names))

    def accounted(batch_id, lines):
        row = {"query": "speed_ingest", "batch_id": batch_id, "topic": "orders", "bronze_rows": lines,
               "silver_rows": lines, "dlq_rows": 0, "late_rows": 0, "processed_at": at}
        store.append(tables.INGEST_BATCHES,
                     pa.Table.from_pylist([row], schema=tables.arrow_schema(tables.INGEST_BATCHES_FIELDS)))

    bronze(0, 3)
    accounted(0, 3)
    bronze(1, 2)  # killed before its accounting row
    check_data_quality(settings, DAY, store)
    accounted(1, 3)  # a line of batch 1 lost
    with pytest.raises(DataQualityError, match=r"orders: every landed line is in Bronze fails: 5 in Bronze, 6"):
        check_data_quality(settings, DAY, store)


def test_ingest_a_micro_batch_ahead_of_bronze_is_no_failure_but_a_line_ingested_twice_is(settings):
    """Bronze and ingest read the landing zone as two queries: stopped (or checked) between
    their micro-batches, ingest may have taken a file Bronze's accounting does not count yet."""
    store = open_store(settings)
    reconciliation(store, speed_rows=95, batch_rows=100, speed_orders=190, batch_orders=200)
    at = datetime.now(timezone.utc)
    bronze, silver = tables.bronze("orders"), tables.silver("orders")
    store.ensure_table(bronze, tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
    store.ensure_table(silver, tables.silver_schema("orders"), tables.SILVER_PARTITIONS)

    def rows(name, fields, source, batch_id, lines):
        schema = tables.arrow_schema(fields)
        data = [{"value": b"{}", "event_id": f"{source}-{i}", "source": source, "arrived_at": at, "ingested_at": at,
                 "batch_id": batch_id, "event_date": DAY, "date": DAY, "is_late": False} for i in range(lines)]
        store.append(name, pa.Table.from_pylist(data, schema=schema).select(schema.names))

    def accounted(query, batch_id, column, lines):
        row = {"query": query, "batch_id": batch_id, "topic": "orders", column: lines, "processed_at": at}
        store.append(tables.INGEST_BATCHES,
                     pa.Table.from_pylist([row], schema=tables.arrow_schema(tables.INGEST_BATCHES_FIELDS)))

    rows(bronze, tables.BRONZE_FIELDS, "a.jsonl", 0, 3)
    accounted("speed_bronze", 0, "bronze_rows", 3)
    for batch_id, source in enumerate(["a.jsonl", "b.jsonl"]):  # ingest has taken b too
        rows(silver, tables.silver_fields("orders"), source, batch_id, 3)
        accounted("speed_ingest", batch_id, "silver_rows", 3)
    assert "orders: Silver + DLQ <= Bronze" in check_data_quality(settings, DAY, store)
    rows(silver, tables.silver_fields("orders"), "a.jsonl", 2, 1)  # a line of a ingested again
    accounted("speed_ingest", 2, "silver_rows", 1)
    with pytest.raises(DataQualityError, match=r"orders: Silver \+ DLQ <= Bronze fails: 4 > 3 in the landed files"):
        check_data_quality(settings, DAY, store)
