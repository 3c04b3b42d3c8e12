"""The alerts family: high temperatures, temperature anomalies and order velocity, one row per
alert, raised within seconds by the stream and recomputed exactly by the batch."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from include.notifier import announce_alerts
from include.registry import Differences, Speed, ViewContext, ViewSpec, view

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ANOMALY_LOOKBACK = timedelta(minutes=15)
VELOCITY_WINDOW = "5 minutes"
ALERT_KINDS = ("high_temperature", "temperature_anomaly", "order_velocity")


def alert_rules(context: ViewContext):  # noqa: ANN201 - include.processors.AlertRules
    from include.processors import AlertRules

    return AlertRules(context.settings.temperature_limit, context.settings.velocity_limit,
                      anomaly_lookback_us=int(ANOMALY_LOOKBACK / timedelta(microseconds=1)))


def exact_alerts(sensors: DataFrame, orders: DataFrame, context: ViewContext) -> DataFrame:
    """Every alert the full history holds: ``kind, entity_id, event_time, value, threshold``.
    The anomaly test is in exact integers of hundredths of a degree, like the stream's."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rules = alert_rules(context)
    high = sensors.where(F.col("temperature") > rules.temperature_limit).select(
        F.lit("high_temperature").alias("kind"), F.col("device_id").alias("entity_id"), "event_time",
        F.col("temperature").alias("value"), F.lit(float(rules.temperature_limit)).alias("threshold"),
    )
    before = (Window.partitionBy("device_id").orderBy(F.unix_micros("event_time"))
              .rangeBetween(-rules.anomaly_lookback_us, -1))
    centi = F.round(F.col("temperature") * 100).cast("decimal(38,0)")
    stats = sensors.withColumns({"x": centi, "n": F.count(F.lit(1)).over(before).cast("decimal(38,0)"),
                                 "s": F.sum(centi).over(before), "q": F.sum(centi * centi).over(before)})
    stats = stats.withColumns({"spread": F.expr("n * q - s * s"), "distance": F.expr("n * x - s")})
    anomaly = stats.where(
        (F.col("n") >= rules.anomaly_min_readings) & (F.col("spread") > 0)
        & (F.expr("distance * distance * (n - 1)") > F.expr(f"{rules.anomaly_sigmas ** 2} * n * spread"))
    ).select(
        F.lit("temperature_anomaly").alias("kind"), F.col("device_id").alias("entity_id"), "event_time",
        F.expr("CAST(distance AS DOUBLE) / sqrt(CAST(n * spread AS DOUBLE) / CAST(n - 1 AS DOUBLE))").alias("value"),
        F.lit(float(rules.anomaly_sigmas)).alias("threshold"),
    )
    velocity = (
        orders.groupBy("user_id", F.window("event_time", VELOCITY_WINDOW).alias("window"))
        .agg(F.count(F.lit(1)).alias("orders"))
        .where(F.col("orders") > rules.velocity_limit)
        .select(F.lit("order_velocity").alias("kind"), F.col("user_id").alias("entity_id"),
                F.col("window.start").alias("event_time"),
                F.col("orders").cast("double").alias("value"), F.lit(float(rules.velocity_limit)).alias("threshold"))
    )
    return high.unionByName(anomaly).unionByName(velocity)


def alert_precedence(row: str) -> list[str]:
    """The first detection of an alert stands; of the same detection the larger count (an
    order-velocity window that grew after it was raised)."""
    return [f"{row}detected_at", f"-{row}value"]


def alert_differences(speed: DataFrame, batch: DataFrame, spec: ViewSpec) -> DataFrame:
    """Alerts the batch found and the stream did not (``missed``: late data) and alerts the stream
    raised that the batch does not confirm (``unconfirmed``)."""
    from pyspark.sql import functions as F

    missed = batch.join(speed.select("alert_id"), "alert_id", "left_anti").withColumn("difference", F.lit("missed"))
    unconfirmed = (speed.join(batch.select("alert_id"), "alert_id", "left_anti")
                   .withColumn("difference", F.lit("unconfirmed")))
    return missed.unionByName(unconfirmed)


@view(
    inputs=("sensors", "orders"),
    fields="alert_id string, kind string, entity_id string, event_time timestamp, value double, threshold double, "
    "detected_at timestamp, date date",
    keys=("alert_id",),
    key_time="event_time",
    lookbehind={"sensors": lambda settings: ANOMALY_LOOKBACK},
    metrics={"rows": "count(*)", **{kind: f"count_if(kind = '{kind}')" for kind in ALERT_KINDS}},
    differences=Differences(
        table="alert_differences",
        extra_fields="difference string",
        rows=alert_differences,
        metrics={
            f"{difference}_{kind}": f"count_if(difference = '{difference}' AND kind = '{kind}')"
            for difference in ("missed", "unconfirmed") for kind in ALERT_KINDS
        },
    ),
    speed=Speed(mode="update", freshness_time="event_time", precedence=alert_precedence, announce=announce_alerts),
)
def alerts(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """``high_temperature``, ``temperature_anomaly`` and ``order_velocity``, one row per
    ``alert_id``. The stream raises them in :class:`include.processors.AlertDetector` (the
    micro-batch's time is ``detected_at``); the batch recomputes them (its run's time)."""
    from pyspark.sql import functions as F

    sensors, orders = inputs["sensors"], inputs["orders"]
    if context.exact:
        raised = exact_alerts(sensors, orders, context).withColumn("detected_at", F.current_timestamp())
    else:
        from include.processors import ALERT_OUTPUT, AlertDetector

        events = sensors.select(F.lit("sensors").alias("topic"), F.col("device_id").alias("entity_id"),
                                F.unix_micros("event_time").alias("event_us"), "temperature").unionByName(
            orders.select(F.lit("orders").alias("topic"), F.col("user_id").alias("entity_id"),
                          F.unix_micros("event_time").alias("event_us"),
                          F.lit(None).cast("double").alias("temperature")))
        raised = events.groupBy("topic", "entity_id").transformWithState(
            AlertDetector(alert_rules(context)), ALERT_OUTPUT, "Update", "EventTime"
        ).select("kind", "entity_id", F.timestamp_micros("event_us").alias("event_time"), "value", "threshold",
                 F.timestamp_micros("detected_us").alias("detected_at"))
    alert_id = F.concat_ws("|", "kind", "entity_id", F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"))
    return raised.select(alert_id.alias("alert_id"), "kind", "entity_id", "event_time", "value", "threshold",
                         "detected_at", F.to_date("event_time").alias("date"))
