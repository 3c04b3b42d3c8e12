"""The alerts family: high temperatures, temperature anomalies and order velocity, one row per
alert, raised within seconds by the stream and recomputed exactly by the batch."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from include.notifier import announce_alerts
from include.registry import (
    Differences, Lookback, PassStep, Speed, ViewContext, ViewSpec, column_names, sql_time, view,
)
from include.views.rules import window_start_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

ANOMALY_LOOKBACK = timedelta(minutes=15)
ANOMALY_MIN_READINGS, ANOMALY_SIGMAS = 5, 3
# The anomaly test's readings, in exact hundredths of a degree, and the look-back's statistics of
# them: the same window in both layers (PassStep.lookback).
HUNDREDTHS = "CAST(round(temperature * 100) AS DECIMAL(38,0))"
ANOMALY = Lookback(topic="sensors", entity="device_id", value=HUNDREDTHS, span=ANOMALY_LOOKBACK)
VELOCITY_WINDOW = timedelta(minutes=5)
ALERT_KINDS = ("high_temperature", "temperature_anomaly", "order_velocity")
# The stream's inputs also carry ``ingested_at`` (its micro-batch's time), its orders ``fresh``
# (in this micro-batch, not one of the earlier ones read from Silver) and its readings the
# look-back's ``lookback_count``, ``lookback_sum`` and ``lookback_squares``: see :func:`alerts_step`.
FRESH, INGESTED = "fresh", "ingested_at"


def alert_precedence(row: str) -> list[str]:
    """The first detection of an alert stands; of the same detection the larger count (an
    order-velocity window that grew after it was raised)."""
    return [f"{row}detected_at", f"-{row}value"]


def alert_differences(spec: ViewSpec) -> str:
    """Alerts the batch found and the stream did not (``missed``: late data) and alerts the stream
    raised that the batch does not confirm (``unconfirmed``)."""
    columns = ", ".join(column_names(spec.fields))
    return f"""
        SELECT {columns}, 'missed' AS difference FROM {{batch}} AS b
        WHERE NOT EXISTS (SELECT 1 FROM {{speed}} AS s WHERE s.alert_id = b.alert_id)
        UNION ALL
        SELECT {columns}, 'unconfirmed' AS difference FROM {{speed}} AS s
        WHERE NOT EXISTS (SELECT 1 FROM {{batch}} AS b WHERE b.alert_id = s.alert_id)"""


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
    speed=Speed(freshness_time="event_time", precedence=alert_precedence, announce=announce_alerts,
                incremental=lambda step: alerts_step(step)),
    declared_in_sql=True,
)
def alerts(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """``high_temperature``, ``temperature_anomaly`` and ``order_velocity``, one row per
    ``alert_id``. The anomaly test is in exact integers of hundredths of a degree (decimals), so
    both layers and both engines agree to the last alert. The batch's ``detected_at`` is its
    run's time. The stream runs this on a micro-batch's readings, with their look-back's
    statistics, and its orders with the recent ones of the same users and windows (:func:`alerts_step`), and
    keeps the alerts its fresh events raise, each detected at the micro-batch that brought its
    reading, or the order that passed the limit."""
    settings, stream = context.settings, not context.exact
    limit, window = settings.velocity_limit, int(VELOCITY_WINDOW.total_seconds())
    detected = INGESTED if stream else "current_timestamp()"
    moments = ("lookback_count AS n, lookback_sum AS s, lookback_squares AS q" if stream else
               "CAST(count(1) OVER before AS DECIMAL(38,0)) AS n, sum(x) OVER before AS s, sum(x * x) OVER before AS q")
    before = "" if stream else f"WINDOW before AS ({ANOMALY.window})"
    velocity_detected = (f"min(CASE WHEN arrival = {limit + 1} THEN {INGESTED} END)" if stream
                         else "current_timestamp()")
    arrival = (f", row_number() OVER (PARTITION BY user_id, window_start ORDER BY {INGESTED}) AS arrival" if stream
               else "")
    return f"""
        WITH readings AS (
            SELECT *, {HUNDREDTHS} AS x, {detected} AS detected_at FROM {{sensors}}),
        stats AS (
            SELECT *, n * q - s * s AS spread, n * x - s AS distance
            FROM (SELECT *, {moments} FROM readings {before})),
        windows AS (
            SELECT *{arrival}
            FROM (SELECT *, {window_start_sql("event_time", window)} AS window_start FROM {{orders}})),
        raised AS (
            SELECT 'high_temperature' AS kind, device_id AS entity_id, event_time, temperature AS value,
                   CAST({float(settings.temperature_limit)} AS DOUBLE) AS threshold, detected_at
            FROM readings WHERE temperature > {float(settings.temperature_limit)}
            UNION ALL
            SELECT 'temperature_anomaly', device_id, event_time,
                   CAST(distance AS DOUBLE) / sqrt(CAST(n * spread AS DOUBLE) / CAST(n - 1 AS DOUBLE)),
                   CAST({ANOMALY_SIGMAS} AS DOUBLE), detected_at
            FROM stats
            WHERE n >= {ANOMALY_MIN_READINGS} AND spread > 0
              AND distance * distance * (n - 1) > {ANOMALY_SIGMAS ** 2} * n * spread
            UNION ALL
            SELECT 'order_velocity', user_id, window_start, CAST(count(1) AS DOUBLE), CAST({limit} AS DOUBLE),
                   {velocity_detected}
            FROM windows GROUP BY user_id, window_start
            HAVING count(1) > {limit} {"AND count_if(" + FRESH + ") > 0" if stream else ""})
        SELECT concat_ws('|', kind, entity_id, date_format(event_time, "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")) AS alert_id,
               kind, entity_id, event_time, value, threshold, detected_at, to_date(event_time) AS date
        FROM raised"""


def alerts_step(step: PassStep) -> DataFrame:
    """``alerts`` kept by the ingest pass: the definition re-run on the micro-batch's readings with
    their look-back's statistics (:meth:`PassStep.lookback`), and on its orders (``fresh``) with
    the earlier ones of the same users and windows from Silver (on-time, so after the watermark
    minus the window: a fresh order is after the watermark)."""
    window = int(VELOCITY_WINDOW.total_seconds())
    new = step.events("orders")
    watermark = step.watermark("orders")
    recent = f"event_time > {sql_time(watermark - VELOCITY_WINDOW)}" if watermark else "true"
    orders = step.query(f"""
        WITH fresh AS (SELECT *, {window_start_sql("event_time", window)} AS window_start FROM {{new}}),
        old AS (SELECT *, {window_start_sql("event_time", window)} AS window_start FROM {{earlier}})
        SELECT * EXCEPT (window_start), true AS {FRESH} FROM fresh
        UNION ALL
        SELECT * EXCEPT (window_start), false AS {FRESH} FROM old
        WHERE (user_id, window_start) IN (SELECT user_id, window_start FROM fresh)""",
        {"new": new, "earlier": step.earlier("orders", recent)})
    return step.query(alerts.sql(ViewContext(step.settings, exact=False)),
                      {"sensors": step.lookback(ANOMALY), "orders": orders})
