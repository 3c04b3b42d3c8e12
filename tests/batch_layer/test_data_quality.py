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
