"""Reconciliation: a day's speed views against its exact batch views.

One row per (view, day, metric) into ``reconciliation``, for every metric each view declares;
a view that declares differences (order_payments: ``late_matches_recovered``; alerts: missed and
unconfirmed per kind; revenue_by_segment_1h: orders enriched differently; the dimensions:
differing customers) also gets them counted and kept in their own table. A dimension is compared
as of the day's end: the speed rows not changed since against the batch's rebuild.
"""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from batch_layer.recompute import in_parallel
from include import tables
from include.lakehouse import LakehouseStore
from include.registry import ViewSpec, combined, dimension_as_of
from include.views import VIEWS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def _all(store: LakehouseStore, table: str, view: ViewSpec) -> DataFrame:
    return store.read(table) if store.exists(table) else store.spark.createDataFrame([], view.schema)


def _day(store: LakehouseStore, table: str, view: ViewSpec, day: date) -> DataFrame:
    return _all(store, table, view).where(F.col("date") == F.lit(day))


def _measure(rows: DataFrame, view: ViewSpec) -> dict[str, float]:
    measured = rows.agg(*[F.expr(sql).alias(name) for name, sql in view.metrics.items()]).first().asDict()
    return {name: float(value or 0) for name, value in measured.items()}


def reconcile_day(store: LakehouseStore, day: date) -> list[dict]:
    """Compare the day's speed and batch views; write and return the reconciliation rows."""
    computed_at = datetime.now(timezone.utc)
    per_view = in_parallel({view.name: (_reconcile_view, store, view, day, computed_at) for view in VIEWS})
    rows = [row for view in VIEWS for row in per_view[view.name]]
    store.ensure_table(tables.RECONCILIATION, tables.RECONCILIATION_SCHEMA, ["date"])
    frame = store.spark.createDataFrame(rows, tables.RECONCILIATION_SCHEMA)
    store.replace_partition(tables.RECONCILIATION, frame, {"date": day})
    return rows


def _reconcile_view(store: LakehouseStore, view: ViewSpec, day: date, computed_at: datetime) -> list[dict]:
    """One view's reconciliation rows; its differences written to their own table."""
    batch = _day(store, view.batch_table, view, day)
    if view.kind == "dimension":  # the speed's state as of the day's end, against the rebuild
        cut = datetime.combine(day + timedelta(days=1), time.min, timezone.utc)
        speed = _all(store, view.speed_table, view).withColumn("date", F.lit(day))
        speed, batch = dimension_as_of(view, speed, batch, cut)
    else:
        speed = combined(view, _day(store, view.speed_table, view, day))
    speed_values, batch_values = _measure(speed, view), _measure(batch, view)
    rows = [_row(view.name, day, metric, speed_values[metric], batch_values[metric], computed_at)
            for metric in view.metrics]
    if view.differences:
        differing = view.differences.rows(speed, batch, view).cache()
        store.ensure_table(view.differences.table, view.differences_schema, ["date"])
        store.replace_partition(view.differences.table, differing, {"date": day})
        counted = differing.agg(
            *[F.expr(sql).alias(name) for name, sql in view.differences.metrics.items()]
        ).first()
        for metric in view.differences.metrics:
            rows.append(_row(view.name, day, metric, 0.0, float(counted[metric] or 0), computed_at))
        differing.unpersist()
    return rows


def _row(view: str, day: date, metric: str, speed: float, batch: float, computed_at: datetime) -> dict:
    return {
        "view": view, "date": day, "metric": metric, "speed_value": speed,
        "batch_value": batch, "diff": batch - speed, "computed_at": computed_at,
    }
