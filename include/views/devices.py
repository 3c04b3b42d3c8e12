"""The devices family: sensor readings per device in 5-minute windows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from include import ddl
from include.registry import Partials, Speed, ViewContext, column_names, view
from include.views.rules import exact_sum_sql, window_start_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

DEVICE_WINDOW, DEVICE_WINDOW_SECONDS = "5 minutes", 300


# Exact decimal sums (the types Spark gives their sums), so any split into micro-batches agrees
# with the whole to the last digit.
SUMS = "temperature_sum decimal(28,2), temperature_squares decimal(38,4), humidity_sum decimal(28,2)"


def statistics_sql(readings: str, temperature: str, squares: str, humidity: str) -> dict[str, str]:
    """The served statistics from the count and the exact sums (n, Σx, Σx²): the definition's
    from its aggregates, the merge's from the merged partial sums."""
    # A mean is one IEEE division of exact doubles (hundredths), rounded alike in any order of
    # the partial sums.
    return {
        "avg_temperature": f"CAST({temperature} * 100 AS DOUBLE) / (100 * {readings})",
        # n·Σx² − (Σx)² is exact and never negative; one reading has no sample deviation.
        "stddev_temperature": f"CASE WHEN {readings} > 1 THEN sqrt(CAST({readings} * {squares} "
        f"- {temperature} * {temperature} AS DOUBLE) / ({readings} * ({readings} - 1))) END",
        "avg_humidity": f"CAST({humidity} * 100 AS DOUBLE) / (100 * {readings})",
    }


def _merged_sums() -> dict[str, str]:
    merged = {field.name: f"CAST(sum({field.name}) AS {field.type.upper()})" for field in ddl.parse(SUMS)}
    return {"readings": "sum(readings)", "min_temperature": "min(min_temperature)",
            "max_temperature": "max(max_temperature)", **merged, **statistics_sql("sum(readings)", *merged.values())}


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
    speed=Speed(freshness_time="window_start", partials=Partials(merge=_merged_sums()), state=SUMS),
    declared_in_sql=True,
)
def device_health_5m(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Tumbling 5-minute windows per device: readings, temperature mean/min/max/sample standard
    deviation (null for one reading), mean humidity. Means and deviation come from exact decimal
    sums (n, Σx, Σx²), so both layers give the same doubles."""
    temperature = "CAST(temperature AS DECIMAL(18,2))"
    statistics = statistics_sql("readings", "temperature_sum", "temperature_squares", "humidity_sum")
    sums = [] if context.exact else column_names(SUMS)
    return f"""
        SELECT window_start, window_start + INTERVAL {DEVICE_WINDOW} AS window_end, device_id, readings,
               {statistics["avg_temperature"]} AS avg_temperature, min_temperature, max_temperature,
               {statistics["stddev_temperature"]} AS stddev_temperature, {statistics["avg_humidity"]} AS avg_humidity,
               {"".join(f"{name}, " for name in sums)}to_date(window_start) AS date
        FROM (SELECT window_start, device_id, count(1) AS readings, {exact_sum_sql("temperature")} AS temperature_sum,
                     sum({temperature} * {temperature}) AS temperature_squares,
                     {exact_sum_sql("humidity")} AS humidity_sum, min(temperature) AS min_temperature,
                     max(temperature) AS max_temperature
              FROM (SELECT *, {window_start_sql("event_time", DEVICE_WINDOW_SECONDS)} AS window_start FROM {{sensors}})
              GROUP BY window_start, device_id)"""
