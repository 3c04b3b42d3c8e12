"""The devices family: sensor readings per device in 5-minute windows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from include.registry import Speed, ViewContext, view
from include.views.rules import DASHBOARD_REFRESH, exact_sum_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEVICE_WINDOW = "5 minutes"


@view(
    inputs=("sensors",),
    fields="window_start timestamp, window_end timestamp, device_id string, readings bigint, avg_temperature double, "
    "min_temperature double, max_temperature double, stddev_temperature double, avg_humidity double, date date",
    keys=("window_start", "device_id"),
    key_time="window_start",
    metrics={
        "rows": "count(*)",
        "readings": "sum(readings)",
        "max_temperature": "max(max_temperature)",
    },
    drift_metrics=("rows", "readings"),
    speed=Speed(mode="update", freshness_time="window_start", refresh=DASHBOARD_REFRESH),
)
def device_health_5m(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Tumbling 5-minute windows per device: readings, temperature mean/min/max/sample standard
    deviation (null for one reading), mean humidity. Means and deviation come from exact decimal
    sums (n, Σx, Σx²), so both layers give the same doubles."""
    from pyspark.sql import functions as F

    temperature = "CAST(temperature AS DECIMAL(18,2))"
    return (
        inputs["sensors"].groupBy(F.window("event_time", DEVICE_WINDOW).alias("window"), "device_id")
        .agg(
            F.count(F.lit(1)).alias("readings"),
            F.expr(exact_sum_sql("temperature")).alias("_t"),
            F.expr(f"sum({temperature} * {temperature})").alias("_t2"),
            F.min("temperature").alias("min_temperature"),
            F.max("temperature").alias("max_temperature"),
            F.expr(exact_sum_sql("humidity")).alias("_h"),
        )
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "device_id",
            "readings",
            F.expr("CAST(_t / readings AS DOUBLE)").alias("avg_temperature"),
            "min_temperature",
            "max_temperature",
            # n·Σx² − (Σx)² is exact and never negative; one reading has no sample deviation.
            F.expr("CASE WHEN readings > 1 THEN sqrt(CAST(readings * _t2 - _t * _t AS DOUBLE) / (readings * (readings - 1))) END")
            .alias("stddev_temperature"),
            F.expr("CAST(_h / readings AS DOUBLE)").alias("avg_humidity"),
            F.to_date("window.start").alias("date"),
        )
    )
