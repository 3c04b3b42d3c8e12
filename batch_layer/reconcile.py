"""Reconciliation: a day's speed views against its exact batch views.

One row per (view, day, metric) into ``reconciliation``, for every metric each view declares;
a view that declares differences (order_payments: ``late_matches_recovered``; alerts: missed and
unconfirmed per kind; revenue_by_segment_1h: orders enriched differently; the dimensions:
differing customers) also gets them counted and kept in their own table. A dimension is compared
as of the day's end: the speed rows not changed since against the batch's rebuild.

Every step is Spark SQL (the metrics, :func:`include.registry.speed_rows_sql`, the differences).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow as pa

from batch_layer.recompute import in_parallel
from include import ddl, tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.lakehouse.base import sql_literal
from include.registry import ViewSpec, column_names, dimension_as_of_sql, speed_rows_sql
from include.views import VIEWS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class Engine:
    """Reads a view table's rows and runs SQL on them with Spark."""

    store: LakehouseStore

    def read(self, table: str, fields: str, day: date | None) -> DataFrame:
        """``fields`` of the table's rows of ``day`` (all rows without one; none without a table)."""
        store, columns = self.store, column_names(fields)
        if not store.exists(table):
            return store.spark.createDataFrame([], ddl.spark_schema(fields))
        rows = store.read(table).select(*columns)
        return rows if day is None else rows.where(f"date = {sql_literal(day)}")

    @staticmethod
    def run(sql: str, inputs: Mapping[str, DataFrame]) -> DataFrame:
        from include.views.sql import spark_rows

        return spark_rows(sql, inputs)

    def first(self, sql: str, inputs: Mapping[str, DataFrame]) -> dict:
        return self.run(sql, inputs).first().asDict()

    @staticmethod
    def with_day(rows: DataFrame, day: date) -> DataFrame:
        """The rows with ``date`` set to ``day``."""
        from pyspark.sql import functions as F

        return rows.withColumn("date", F.lit(day))


def reconcile_day(store: LakehouseStore, settings: Settings, day: date) -> list[dict]:
    """Compare the day's speed and batch views; write and return the reconciliation rows."""
    computed_at = datetime.now(timezone.utc)
    engine = Engine(store)
    per_view = in_parallel({view.name: (_reconcile_view, engine, view, day, computed_at) for view in VIEWS})
    rows = [row for view in VIEWS for row in per_view[view.name]]
    store.ensure_table(tables.RECONCILIATION, tables.RECONCILIATION_SCHEMA, ["date"])
    written = pa.Table.from_pylist(rows, tables.arrow_schema(tables.RECONCILIATION_FIELDS))
    store.replace_partition(tables.RECONCILIATION, written, {"date": day})
    return rows


def _reconcile_view(engine: Engine, view: ViewSpec, day: date, computed_at: datetime) -> list[dict]:
    """One view's reconciliation rows; its differences written to their own table."""
    batch = engine.read(view.batch_table, view.fields, day)
    if view.kind == "dimension":  # the speed's state as of the day's end, against the rebuild
        cut = datetime.combine(day + timedelta(days=1), time.min, timezone.utc)
        speed = engine.with_day(engine.read(view.speed_table, view.fields, None), day)
        speed_as_of, batch_as_of = dimension_as_of_sql(view, cut)
        speed, batch = (engine.run(speed_as_of, {"speed": speed}),
                        engine.run(batch_as_of, {"speed": speed, "batch": batch}))
    else:
        speed = engine.run(speed_rows_sql(view, "{speed}"),
                           {"speed": engine.read(view.speed_table, view.speed_fields, day)})
    speed_values, batch_values = _measure(engine, view.metrics, speed), _measure(engine, view.metrics, batch)
    rows = [_row(view.name, day, metric, speed_values[metric], batch_values[metric], computed_at)
            for metric in view.metrics]
    if view.differences:
        differences = view.differences
        differing = engine.run(differences.rows(view), {"speed": speed, "batch": batch}).cache()
        engine.store.ensure_table(differences.table, view.differences_schema, ["date"])
        engine.store.replace_partition(differences.table, differing, {"date": day})
        counted = _measure(engine, differences.metrics, differing)
        rows += [_row(view.name, day, metric, 0.0, counted[metric], computed_at) for metric in differences.metrics]
        differing.unpersist()
    return rows


def _measure(engine: Engine, metrics: Mapping[str, str], rows: DataFrame) -> dict[str, float]:
    measured = engine.first(f"SELECT {', '.join(f'{sql} AS {name}' for name, sql in metrics.items())} FROM {{rows}}",
                            {"rows": rows})
    return {name: float(measured[name] or 0) for name in metrics}


def _row(view: str, day: date, metric: str, speed: float, batch: float, computed_at: datetime) -> dict:
    return {
        "view": view, "date": day, "metric": metric, "speed_value": speed,
        "batch_value": batch, "diff": batch - speed, "computed_at": computed_at,
    }
