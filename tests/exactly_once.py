"""The checks every crash test ends with: each landed line in Bronze once, each valid event in
Silver once, each corrupt line in the DLQ, against the generator's ledger; and the speed views
holding no row twice, the dimensions as the truth says, each alert raised and told once."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import functions as F

from include import tables
from include.lakehouse.base import LakehouseStore
from include.schemas import TOPIC_NAMES
from include.views import VIEWS_BY_NAME


def assert_every_line_once(store: LakehouseStore, ledger: dict) -> None:
    for topic in TOPIC_NAMES:
        truth = ledger["topics"][topic]
        assert store.read(tables.bronze(topic)).count() == truth["lines"], topic
        silver = store.read(tables.silver(topic))
        assert silver.count() == truth["valid"] == silver.select("event_id").distinct().count(), topic
    assert store.read(tables.DLQ).count() == sum(t["corrupt"] for t in ledger["topics"].values())


def iso(value: datetime) -> str:
    """A collected timestamp (naive UTC) as the truth writes it."""
    return value.replace(tzinfo=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def assert_speed_views_once(store: LakehouseStore, truth_dir: Path) -> None:
    """After every line of the truth's run is streamed (the stream's views, not the batch's)."""
    ingest = store.read(tables.INGEST_BATCHES)
    assert ingest.count() == ingest.select("query", "batch_id", "topic").distinct().count()
    revenue = store.read(VIEWS_BY_NAME["revenue_by_category_5m"].speed_table)
    assert revenue.count() == revenue.select("window_start", "category").distinct().count()
    on_time_orders = store.read(tables.silver("orders")).where("NOT is_late").count()
    assert revenue.agg(F.sum("orders")).first()[0] == on_time_orders
    # The join's rows are appended: none twice (a replayed micro-batch appends nothing).
    payments = store.read(VIEWS_BY_NAME["order_payments"].speed_table)
    assert payments.count() == payments.select("order_id", "status", "payment_id").distinct().count()
    # The customer dimension is what the truth says: no change lost or applied twice.
    for view, columns in (("customers", ("customer_id", "segment", "email", "updated_at")),
                          ("customers_history", ("customer_id", "segment", "valid_from", "valid_to"))):
        with (truth_dir / f"{view}.csv").open() as handle:
            truth_rows = sorted(tuple(row[c] or None for c in columns) for row in csv.DictReader(handle))
        stored = store.read(VIEWS_BY_NAME[view].speed_table).where("NOT deleted").collect()
        assert sorted(tuple(iso(row[c]) if isinstance(row[c], datetime) else row[c] for c in columns)
                      for row in stored) == truth_rows, view
    # Every alert raised once, and told to the notifier once.
    raised = [r["alert_id"] for r in store.read(VIEWS_BY_NAME["alerts"].speed_table).collect()]
    assert raised and len(raised) == len(set(raised))
    announced = [json.loads(r["details"])["alert_id"]
                 for r in store.read(tables.ALERTS).where("source = 'alerts'").collect()]
    assert sorted(announced) == sorted(raised)
