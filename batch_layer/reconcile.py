"""Reconciliation: a day's speed views against its exact batch views.

One row per (view, day, metric) into ``reconciliation``; for order_payments also the metric
``late_matches_recovered`` (orders paid in the batch view but not paid in the speed view), whose
rows are kept in ``recovered_late_matches``.
"""

from __future__ import annotations

from datetime import date, datetime, timezone
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from include import tables
from include.lakehouse import LakehouseStore
from include.views import money_sum

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame



def _metrics(view: str) -> dict[str, Column]:
    if view == "revenue_by_category_5m":
        return {
            "rows": F.count(F.lit(1)),
            "revenue": money_sum("revenue"),
            "orders": F.sum("orders"),
            "unique_buyers": F.sum("unique_buyers"),
        }
    return {
        "rows": F.count(F.lit(1)),
        "paid": F.count(F.when(F.col("status") == "paid", 1)),
        "unpaid": F.count(F.when(F.col("status") == "unpaid", 1)),
        "pending": F.count(F.when(F.col("status") == "pending", 1)),
        "paid_amount": money_sum("paid_amount"),
    }


def _day(store: LakehouseStore, table: str, day: date, schema) -> DataFrame:  # noqa: ANN001
    if not store.exists(table):
        return store.spark.createDataFrame([], schema)
    return store.read(table).where(F.col("date") == F.lit(day))


def _measure(rows: DataFrame, view: str) -> dict[str, float]:
    measured = rows.agg(*[agg.alias(name) for name, agg in _metrics(view).items()]).first().asDict()
    return {name: float(value or 0) for name, value in measured.items()}


def recovered_late_matches(speed: DataFrame, batch: DataFrame) -> DataFrame:
    """Orders paid in the batch view whose speed row is missing or not paid."""
    speed_status = speed.select("order_id", F.col("status").alias("speed_status"))
    return (
        batch.where(F.col("status") == "paid")
        .join(speed_status, "order_id", "left")
        .where(F.col("speed_status").isNull() | (F.col("speed_status") != "paid"))
    )


def reconcile_day(store: LakehouseStore, day: date) -> list[dict]:
    """Compare the day's speed and batch views; write and return the reconciliation rows."""
    computed_at = datetime.now(timezone.utc)
    views = {
        "revenue_by_category_5m": (tables.SPEED_REVENUE, tables.BATCH_REVENUE, tables.REVENUE_SCHEMA),
        "order_payments": (tables.SPEED_ORDER_PAYMENTS, tables.BATCH_ORDER_PAYMENTS, tables.ORDER_PAYMENTS_SCHEMA),
    }
    rows, frames = [], {}
    for view, (speed_table, batch_table, schema) in views.items():
        speed, batch = _day(store, speed_table, day, schema), _day(store, batch_table, day, schema)
        frames[view] = (speed, batch)
        speed_values, batch_values = _measure(speed, view), _measure(batch, view)
        for metric in speed_values:
            rows.append(_row(view, day, metric, speed_values[metric], batch_values[metric], computed_at))

    recovered = recovered_late_matches(*frames["order_payments"]).cache()
    store.ensure_table(tables.RECOVERED_LATE_MATCHES, tables.RECOVERED_LATE_MATCHES_SCHEMA, ["date"])
    store.replace_partition(tables.RECOVERED_LATE_MATCHES, recovered, {"date": day})
    rows.append(_row("order_payments", day, "late_matches_recovered", 0.0, float(recovered.count()), computed_at))
    recovered.unpersist()

    store.ensure_table(tables.RECONCILIATION, tables.RECONCILIATION_SCHEMA, ["date"])
    frame = store.spark.createDataFrame(rows, tables.RECONCILIATION_SCHEMA)
    store.replace_partition(tables.RECONCILIATION, frame, {"date": day})
    return rows


def _row(view: str, day: date, metric: str, speed: float, batch: float, computed_at: datetime) -> dict:
    return {
        "view": view, "date": day, "metric": metric, "speed_value": speed,
        "batch_value": batch, "diff": batch - speed, "computed_at": computed_at,
    }
