"""Gold view definitions, each written once (DataFrame -> DataFrame) and declared once in
:data:`VIEWS`; both layers run them.

The speed layer applies a definition to watermarked streams of on-time, deduplicated events
(``exact=False``: approximate where exactness needs unbounded state, orders still inside their
join window shown as ``pending``); the batch layer applies the same definition to a day's full
history (``exact=True``). Event dedup, the first-payment rule and the ``pending`` rule live here
too, so the layers cannot drift apart.

Adding a view: its definition and :class:`ViewSpec` here, its ground truth in the generator, its
tests. Nothing else names it. (DAG files import :data:`VIEWS` at parse time, so pyspark is
imported inside the definitions, not at the top of this module.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from include.alerts import announce_alerts
from include.config import ConfigError, Settings, spark_interval
from include.registry import Differences, ViewContext, ViewSpec, best_per_key, rows_that_differ

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

REVENUE_WINDOW = "5 minutes"
DEVICE_WINDOW = "5 minutes"
TRAFFIC_WINDOW, TRAFFIC_SLIDE = "10 minutes", "5 minutes"
SESSION_GAP = timedelta(minutes=30)
ANOMALY_LOOKBACK = timedelta(minutes=15)
VELOCITY_WINDOW = "5 minutes"
SEGMENT_WINDOW = "1 hour"
UNKNOWN_SEGMENT = "unknown"
ALERT_KINDS = ("high_temperature", "temperature_anomaly", "order_velocity")
# The continuous stream updates these views this often (``ViewSpec.refresh``), not every
# trigger: windows of ten minutes or more, sessions that close after 30 idle minutes, a device
# dashboard (urgent readings are alerts), the customer dimensions and the hourly view that looks
# them up. order_payments, revenue_by_category_5m and alerts keep every trigger.
DASHBOARD_REFRESH = timedelta(seconds=30)
# Which copy of a duplicated event counts, in both layers: the first to arrive (then the
# first file, then the smallest bytes, so equal arrivals still pick one copy deterministically).
FIRST_COPY_ORDER = ("arrived_at", "source", "value")


# ---- shared rules ------------------------------------------------------------------------
def money_sum_sql(column: str) -> str:
    """Exact sum of currency amounts (decimal arithmetic, so any summation order agrees)."""
    return f"CAST(sum(CAST({column} AS DECIMAL(18,2))) AS DOUBLE)"


def hll_lg_k(rsd: float) -> int:
    """log2 of the buckets a DataSketches HLL sketch needs for a relative standard deviation of
    at most ``rsd`` (its error is about 1.04/sqrt(buckets)), within Spark's 4..21."""
    return min(21, max(4, math.ceil(math.log2((1.04 / rsd) ** 2))))


def distinct_count(column: str, context: ViewContext) -> Column:
    """Exact in the batch; in the stream an HLL sketch (``LAMBDALAKE_APPROX_DISTINCT_RSD``), since
    exact distinct counts would keep every value of every open window in state.

    DataSketches' ``hll_sketch_agg``, not ``approx_count_distinct``: HyperLogLog++'s buffer is one
    field per 10 registers (410 at 2%), and Spark generates code for a buffer of that width in every
    task of the aggregation, which took about 40% of the stream's CPU. A DataSketches sketch is one
    binary field, and exact while a window has few distinct values."""
    from pyspark.sql import functions as F

    if context.exact:
        return F.count_distinct(column)
    return F.hll_sketch_estimate(F.hll_sketch_agg(column, hll_lg_k(context.settings.approx_distinct_rsd)))


def first_copies(events: DataFrame, key: Sequence[str], horizon: timedelta | None = None) -> DataFrame:
    """One row per ``key``: the first copy to arrive.

    With ``horizon`` (a stream) Spark's state store remembers keys for that long after they were
    ingested (``ingested_at``, which only moves forward, so nothing is dropped as late); a batch
    keeps the minimum by :data:`FIRST_COPY_ORDER`, the copy the stream kept.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if horizon is not None:
        # Spark drops a key once the watermark (newest ingested_at - delay) reaches its own
        # ingested_at + delay, so a delay of half the horizon keeps it for the horizon (a whole
        # one would keep it twice as long), and each micro-batch scans every key it keeps.
        delay = timedelta(seconds=math.ceil(horizon.total_seconds() / 2))
        return events.withWatermark("ingested_at", spark_interval(delay)).dropDuplicatesWithinWatermark(list(key))
    order = Window.partitionBy(*key).orderBy(*[F.col(c).asc_nulls_last() for c in FIRST_COPY_ORDER])
    return events.withColumn("_copy", F.row_number().over(order)).where("_copy = 1").drop("_copy")


# ---- revenue_by_category_5m ----------------------------------------------------------------
def revenue_by_category_5m(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Tumbling 5-minute windows on order time: revenue, orders and distinct buyers per category."""
    from pyspark.sql import functions as F

    buyers = distinct_count("user_id", context)
    return (
        inputs["orders"].groupBy(F.window("event_time", REVENUE_WINDOW).alias("window"), "category")
        .agg(F.expr(money_sum_sql("amount")).alias("revenue"), F.count(F.lit(1)).alias("orders"), buyers.alias("unique_buyers"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "category",
            "revenue",
            "orders",
            "unique_buyers",
            F.to_date("window.start").alias("date"),
        )
    )


# ---- order_payments ------------------------------------------------------------------------
def order_precedence(row: str) -> list[str]:
    """Which row of an order counts: paid (window matched) before unpaid (window closed) before
    pending (window open); of two payments the earlier, then the lower id."""
    status_rank = f"CASE {row}status WHEN 'paid' THEN 0 WHEN 'unpaid' THEN 1 ELSE 2 END"
    return [status_rank, f"{row}pay_time", f"{row}payment_id"]


def pending_orders(orders: DataFrame) -> DataFrame:
    """Orders whose join window is still open, as order_payments rows (speed layer only)."""
    from pyspark.sql import functions as F

    return orders.select(
        "order_id", "user_id", "category", "amount", F.col("event_time").alias("order_time"),
        F.lit(None).cast("string").alias("payment_id"), F.lit(None).cast("double").alias("paid_amount"),
        F.lit(None).cast("timestamp").alias("pay_time"), F.lit("pending").alias("status"),
        F.to_date("event_time").alias("date"),
    )


def best_order_status(rows: DataFrame) -> DataFrame:
    """One row per order, by :func:`order_precedence`."""
    return best_per_key(rows, ["order_id"], order_precedence)


def order_payments(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Each order with the first payment whose time lies in ``[order_time, order_time + join
    window]``; ``unpaid`` when there is none. The speed layer also emits every new order as
    ``pending`` (its window is open); the stored row then follows :func:`order_precedence`."""
    from pyspark.sql import functions as F

    orders, payments = inputs["orders"], inputs["payments"]
    order = orders.select("order_id", "user_id", "category", "amount", F.col("event_time").alias("order_time"))
    payment = payments.select(
        "payment_id",
        F.col("order_id").alias("paid_order_id"),
        F.col("amount").alias("paid_amount"),
        F.col("event_time").alias("pay_time"),
    )
    window_end = F.col("order_time") + F.expr(f"INTERVAL {spark_interval(context.settings.join_window)}")
    matches = (
        (F.col("order_id") == F.col("paid_order_id"))
        & (F.col("pay_time") >= F.col("order_time"))
        & (F.col("pay_time") <= window_end)
    )
    joined = order.join(payment, matches, "leftOuter").select(
        "order_id", "user_id", "category", "amount", "order_time",
        "payment_id", "paid_amount", "pay_time",
        F.when(F.col("payment_id").isNull(), "unpaid").otherwise("paid").alias("status"),
        F.to_date("order_time").alias("date"),
    )
    if context.exact:
        return best_order_status(joined)
    return joined.unionByName(pending_orders(orders))


def late_paid_orders(speed: DataFrame, batch: DataFrame) -> DataFrame:
    """Orders paid in the batch view whose speed row is missing or not paid."""
    from pyspark.sql import functions as F

    speed_status = speed.select("order_id", F.col("status").alias("speed_status"))
    return (
        batch.where(F.col("status") == "paid")
        .join(speed_status, "order_id", "left")
        .where(F.col("speed_status").isNull() | (F.col("speed_status") != "paid"))
    )


# ---- device_health_5m ----------------------------------------------------------------------
def exact_sum_sql(column: str, scale: int = 2) -> str:
    """Sum of a measurement with ``scale`` decimals as an exact decimal: the speed layer's partial
    sums and the batch's full sum agree to the last digit in any order."""
    return f"sum(CAST({column} AS DECIMAL(18,{scale})))"


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


# ---- traffic_by_page_10m ---------------------------------------------------------------------
def traffic_by_page_10m(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Sliding 10-minute windows every 5 minutes on click time (each click counts in two
    windows): events per action and distinct users per page."""
    from pyspark.sql import functions as F

    def count_of(action: str, name: str):  # noqa: ANN202 - Column
        return F.sum(F.when(F.col("action") == action, 1).otherwise(0)).alias(name)

    users = distinct_count("user_id", context)
    return (
        inputs["clicks"].groupBy(F.window("event_time", TRAFFIC_WINDOW, TRAFFIC_SLIDE).alias("window"), "page_url")
        .agg(count_of("view", "views"), count_of("click", "clicks"), count_of("add_to_cart", "add_to_cart"),
             users.alias("unique_users"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "page_url", "views", "clicks", "add_to_cart", "unique_users",
            F.to_date("window.start").alias("date"),
        )
    )


# ---- user_sessions ---------------------------------------------------------------------------
def user_sessions(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Session windows per user with a 30-minute inactivity gap: first and last click, clicks,
    distinct pages, whether an item was added to the cart. The batch uses ``session_window``; the
    stream :class:`include.processors.OpenSessions`, which shows sessions while they are open."""
    from pyspark.sql import functions as F

    clicks = inputs["clicks"]
    gap_us = int(SESSION_GAP / timedelta(microseconds=1))
    if context.exact:
        sessions = clicks.groupBy("user_id", F.session_window("event_time", spark_interval(SESSION_GAP))).agg(
            F.unix_micros(F.min("event_time")).alias("start_us"), F.unix_micros(F.max("event_time")).alias("end_us"),
            F.count(F.lit(1)).alias("events"), F.count_distinct("page_url").alias("pages"),
            F.max(F.col("action") == "add_to_cart").alias("converted"),
        )
    else:
        from include.processors import SESSION_OUTPUT, OpenSessions

        sessions = clicks.select("user_id", F.unix_micros("event_time").alias("event_us"), "page_url", "action").groupBy(
            "user_id"
        ).transformWithState(OpenSessions(gap_us), SESSION_OUTPUT, "Update", "EventTime")
    return sessions.select(
        "user_id",
        F.timestamp_micros("start_us").alias("session_start"),
        F.timestamp_micros("end_us").alias("session_end"),
        "events",
        "pages",
        ((F.col("end_us") - F.col("start_us")) / 1e6).alias("duration_seconds"),
        "converted",
        F.to_date(F.timestamp_micros("start_us")).alias("date"),
    )


# ---- alerts ----------------------------------------------------------------------------------
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
    before = Window.partitionBy("device_id").orderBy(F.unix_micros("event_time")).rangeBetween(-rules.anomaly_lookback_us, -1)
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
        orders.groupBy("user_id", F.window("event_time", VELOCITY_WINDOW).alias("window")).agg(F.count(F.lit(1)).alias("orders"))
        .where(F.col("orders") > rules.velocity_limit)
        .select(F.lit("order_velocity").alias("kind"), F.col("user_id").alias("entity_id"), F.col("window.start").alias("event_time"),
                F.col("orders").cast("double").alias("value"), F.lit(float(rules.velocity_limit)).alias("threshold"))
    )
    return high.unionByName(anomaly).unionByName(velocity)


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
                          F.unix_micros("event_time").alias("event_us"), F.lit(None).cast("double").alias("temperature")))
        raised = events.groupBy("topic", "entity_id").transformWithState(
            AlertDetector(alert_rules(context)), ALERT_OUTPUT, "Update", "EventTime"
        ).select("kind", "entity_id", F.timestamp_micros("event_us").alias("event_time"), "value", "threshold",
                 F.timestamp_micros("detected_us").alias("detected_at"))
    alert_id = F.concat_ws("|", "kind", "entity_id", F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"))
    return raised.select(alert_id.alias("alert_id"), "kind", "entity_id", "event_time", "value", "threshold",
                         "detected_at", F.to_date("event_time").alias("date"))


def alert_precedence(row: str) -> list[str]:
    """The first detection of an alert stands; of the same detection the larger count (an
    order-velocity window that grew after it was raised)."""
    return [f"{row}detected_at", f"-{row}value"]


def alert_differences(speed: DataFrame, batch: DataFrame) -> DataFrame:
    """Alerts the batch found and the stream did not (``missed``: late data) and alerts the stream
    raised that the batch does not confirm (``unconfirmed``)."""
    from pyspark.sql import functions as F

    missed = batch.join(speed.select("alert_id"), "alert_id", "left_anti").withColumn("difference", F.lit("missed"))
    unconfirmed = speed.join(batch.select("alert_id"), "alert_id", "left_anti").withColumn("difference", F.lit("unconfirmed"))
    return missed.unionByName(unconfirmed)


# ---- customers and customers_history (dimensions from CDC) ---------------------------------
def customer_changes(cdc: DataFrame) -> DataFrame:
    """One row per CDC change: the customer, its image (a delete's is the ``before`` image),
    whether it deletes, and its sequence: ``ts_ms``, then arrival (equal ``ts_ms``: the later
    arrival wins)."""
    from pyspark.sql import functions as F

    deletes = F.col("op") == "d"
    image = F.when(deletes, F.col("before")).otherwise(F.col("after"))
    return cdc.select(image["customer_id"].alias("customer_id"), image.alias("image"), deletes.alias("deleted"),
                      F.struct("ts_ms", "arrived_at").alias("sequence"))


def customers(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """SCD type 1: each customer's last change by sequence; a delete leaves a hidden tombstone,
    so an older change arriving after it cannot resurrect the customer, and a newer ``c`` re-creates
    it. One grouped ``max_by`` in both layers: in the stream Spark keeps one row per customer in
    its state store (a dimension is bounded by its keys, not by a watermark)."""
    from pyspark.sql import functions as F

    last = customer_changes(inputs["customers_cdc"]).groupBy("customer_id").agg(
        F.max_by(F.struct("image", "deleted", "sequence"), "sequence").alias("last"))
    updated_at = F.timestamp_millis(F.col("last.sequence.ts_ms"))
    return last.select(
        "customer_id", *[F.col(f"last.image.{name}").alias(name) for name in ("name", "email", "segment", "country")],
        updated_at.alias("updated_at"), F.col("last.deleted").alias("deleted"), F.to_date(updated_at).alias("date"),
    )


def customers_history(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """SCD type 2: a customer's changes in sequence, each valid until the next (``valid_to``
    null and ``is_current`` for the last). A delete closes the version before it and opens none
    (its row is a hidden tombstone). A change that lands after a newer one takes its place, and
    the neighbours' validity follows, because every change of the customer is re-sequenced: the
    stream keeps them all per customer (``collect_list``) and emits the customer's versions again."""
    from pyspark.sql import functions as F

    changes = customer_changes(inputs["customers_cdc"]).groupBy("customer_id").agg(
        F.array_sort(F.collect_list(F.struct("sequence", "image", "deleted"))).alias("changes"))
    ts = lambda change: change["sequence"]["ts_ms"]  # noqa: E731
    # Of changes with the same ts_ms only the last to arrive counts.
    kept = F.filter("changes", lambda change, i: ts(F.try_element_at("changes", i + 2)).isNull()
                    | (ts(F.try_element_at("changes", i + 2)) != ts(change)))
    versions = F.transform(kept, lambda change, i: F.struct(
        change["image"].alias("image"), change["deleted"].alias("deleted"), ts(change).alias("from_ms"),
        ts(F.try_element_at(kept, i + 2)).alias("to_ms")))
    rows = changes.select("customer_id", F.explode(versions).alias("v"))
    valid_from = F.timestamp_millis("v.from_ms")
    return rows.select(
        "customer_id", *[F.col(f"v.image.{name}").alias(name) for name in ("name", "email", "segment", "country")],
        valid_from.alias("valid_from"), F.timestamp_millis("v.to_ms").alias("valid_to"),
        (F.col("v.to_ms").isNull() & ~F.col("v.deleted")).alias("is_current"), F.col("v.deleted").alias("deleted"),
        F.to_date(valid_from).alias("date"),
    )


# ---- revenue_by_segment_1h -----------------------------------------------------------------
def revenue_by_segment_1h(inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
    """Orders enriched with their customer's segment, revenue and orders per segment in tumbling
    1-hour windows. The batch joins point in time (the version of ``customers_history`` valid at
    the order's time); the stream joins the current versions as its table stands when the order's
    micro-batch runs (a stream-static join whose static side is re-read every micro-batch). No
    customer: ``unknown``. Hidden: the orders counted and their amounts, for reconciliation."""
    from pyspark.sql import functions as F

    orders = inputs["orders"]
    versions = inputs["customers_history"].where(~F.col("deleted")).select(
        F.col("customer_id"), F.col("segment").alias("customer_segment"), "valid_from", "valid_to", "is_current")
    if context.exact:
        on = ((F.col("user_id") == F.col("customer_id")) & (F.col("valid_from") <= F.col("event_time"))
              & (F.col("valid_to").isNull() | (F.col("event_time") < F.col("valid_to"))))
    else:
        versions = versions.where("is_current")
        on = F.col("user_id") == F.col("customer_id")
    enriched = orders.join(F.broadcast(versions), on, "left").withColumn(
        "segment", F.coalesce("customer_segment", F.lit(UNKNOWN_SEGMENT)))
    counted = F.array_sort(F.collect_list(F.struct("order_id", "amount")))
    return (
        enriched.groupBy(F.window("event_time", SEGMENT_WINDOW).alias("window"), "segment")
        .agg(F.expr(money_sum_sql("amount")).alias("revenue"), F.count(F.lit(1)).alias("orders"), counted.alias("counted"))
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "segment", "revenue", "orders",
            F.col("counted.order_id").alias("order_ids"), F.col("counted.amount").alias("order_amounts"),
            F.to_date("window.start").alias("date"),
        )
    )


def orders_enriched_differently(speed: DataFrame, batch: DataFrame) -> DataFrame:
    """Orders both layers counted under different segments (the customer's segment changed
    between the order and the stream's processing of it), with their amounts."""
    from pyspark.sql import functions as F

    def per_order(rows: DataFrame, side: str) -> DataFrame:
        order = F.explode(F.arrays_zip("order_ids", "order_amounts")).alias("o")
        return rows.select("window_start", "segment", "date", order).select(
            F.col("o.order_ids").alias("order_id"), F.col("o.order_amounts").alias("amount"), "window_start",
            F.col("segment").alias(f"{side}_segment"), "date")

    speed_segments = per_order(speed, "speed").select("order_id", "speed_segment")
    return per_order(batch, "batch").join(speed_segments, "order_id").where(
        F.col("speed_segment") != F.col("batch_segment")
    ).select("order_id", "amount", "window_start", "speed_segment", "batch_segment", "date")


# ---- the registry --------------------------------------------------------------------------
VIEWS: list[ViewSpec] = [
    ViewSpec(
        name="revenue_by_category_5m",
        inputs=("orders",),
        define=revenue_by_category_5m,
        fields="window_start timestamp, window_end timestamp, category string, revenue double, "
        "orders bigint, unique_buyers bigint, date date",
        keys=("window_start", "category"),
        key_time="window_start",
        freshness_time="window_start",
        speed_mode="update",
        metrics={
            "rows": "count(*)",
            "revenue": money_sum_sql("revenue"),
            "orders": "sum(orders)",
            "unique_buyers": "sum(unique_buyers)",
        },
        drift_metrics=("rows", "revenue", "orders"),
    ),
    ViewSpec(
        name="order_payments",
        inputs=("orders", "payments"),
        define=order_payments,
        fields="order_id string, user_id string, category string, amount double, order_time timestamp, "
        "payment_id string, paid_amount double, pay_time timestamp, status string, date date",
        keys=("order_id",),
        key_time="order_time",
        freshness_time="order_time",
        speed_mode="append",
        precedence=order_precedence,
        lookahead={"payments": lambda settings: settings.join_window},
        metrics={
            "rows": "count(*)",
            "paid": "count_if(status = 'paid')",
            "unpaid": "count_if(status = 'unpaid')",
            "pending": "count_if(status = 'pending')",
            "paid_amount": money_sum_sql("paid_amount"),
        },
        drift_metrics=("rows",),
        differences=Differences(
            table="recovered_late_matches",
            extra_fields="speed_status string",
            rows=late_paid_orders,
            metrics={"late_matches_recovered": "count(*)"},
        ),
    ),
    ViewSpec(
        name="traffic_by_page_10m",
        refresh=DASHBOARD_REFRESH,
        inputs=("clicks",),
        define=traffic_by_page_10m,
        fields="window_start timestamp, window_end timestamp, page_url string, views bigint, clicks bigint, "
        "add_to_cart bigint, unique_users bigint, date date",
        keys=("window_start", "page_url"),
        key_time="window_start",
        freshness_time="window_start",
        speed_mode="update",
        lookahead={"clicks": lambda settings: timedelta(minutes=10)},  # a window opening at 23:55 ends after midnight
        metrics={
            "rows": "count(*)",
            "views": "sum(views)",
            "clicks": "sum(clicks)",
            "add_to_cart": "sum(add_to_cart)",
            "unique_users": "sum(unique_users)",
        },
        drift_metrics=("rows", "views", "clicks"),
    ),
    ViewSpec(
        name="device_health_5m",
        refresh=DASHBOARD_REFRESH,
        inputs=("sensors",),
        define=device_health_5m,
        fields="window_start timestamp, window_end timestamp, device_id string, readings bigint, avg_temperature double, "
        "min_temperature double, max_temperature double, stddev_temperature double, avg_humidity double, date date",
        keys=("window_start", "device_id"),
        key_time="window_start",
        freshness_time="window_start",
        speed_mode="update",
        metrics={
            "rows": "count(*)",
            "readings": "sum(readings)",
            "max_temperature": "max(max_temperature)",
        },
        drift_metrics=("rows", "readings"),
    ),
]
VIEWS += [
    ViewSpec(
        name="user_sessions",
        refresh=DASHBOARD_REFRESH,
        inputs=("clicks",),
        define=user_sessions,
        fields="user_id string, session_start timestamp, session_end timestamp, events bigint, pages bigint, "
        "duration_seconds double, converted boolean, date date",
        keys=("user_id", "session_start"),
        key_time="session_start",
        freshness_time="session_end",
        speed_mode="update",
        tombstone="s.events = 0",
        # A session starting on the day may have begun before midnight's clicks, or run past it.
        lookbehind={"clicks": lambda settings: SESSION_GAP},
        lookahead={"clicks": lambda settings: SESSION_GAP},
        metrics={
            "rows": "count(*)",
            "events": "sum(events)",
            "converted": "count_if(converted)",
        },
        drift_metrics=("events",),
    ),
    ViewSpec(
        name="alerts",
        inputs=("sensors", "orders"),
        define=alerts,
        fields="alert_id string, kind string, entity_id string, event_time timestamp, value double, threshold double, "
        "detected_at timestamp, date date",
        keys=("alert_id",),
        key_time="event_time",
        freshness_time="event_time",
        speed_mode="update",
        precedence=alert_precedence,
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
        announce=announce_alerts,
    ),
]
CUSTOMER_FIELDS = "customer_id string, name string, email string, segment string, country string"
VIEWS += [
    ViewSpec(
        name="customers",
        refresh=DASHBOARD_REFRESH,
        inputs=("customers_cdc",),
        define=customers,
        fields=f"{CUSTOMER_FIELDS}, updated_at timestamp, deleted boolean, date date",
        keys=("customer_id",),
        key_time="updated_at",
        freshness_time="updated_at",
        speed_mode="update",
        kind="dimension",
        hidden=("deleted",),
        served_when="NOT deleted",
        metrics={"rows": "count_if(NOT deleted)", "deleted": "count_if(deleted)"},
        differences=Differences(
            table="customer_differences",
            extra_fields="difference string",
            rows=rows_that_differ(f"{CUSTOMER_FIELDS}, updated_at timestamp, deleted boolean, date date", ("customer_id",)),
            metrics={"differing_customers": "count(DISTINCT customer_id)"},
        ),
    ),
    ViewSpec(
        name="customers_history",
        refresh=DASHBOARD_REFRESH,
        inputs=("customers_cdc",),
        define=customers_history,
        fields=f"{CUSTOMER_FIELDS}, valid_from timestamp, valid_to timestamp, is_current boolean, deleted boolean, date date",
        keys=("customer_id", "valid_from"),
        key_time="coalesce(valid_to, valid_from)",  # a version changes when it opens and when it closes
        freshness_time="valid_from",
        speed_mode="update",
        kind="dimension",
        hidden=("deleted",),
        served_when="NOT deleted",
        metrics={"rows": "count_if(NOT deleted)", "current": "count_if(is_current)"},
        differences=Differences(
            table="customer_history_differences",
            extra_fields="difference string",
            rows=rows_that_differ(f"{CUSTOMER_FIELDS}, valid_from timestamp, valid_to timestamp, is_current boolean, "
                                  "deleted boolean, date date", ("customer_id", "valid_from")),
            metrics={"differing_customers": "count(DISTINCT customer_id)", "differing_versions": "count(*)"},
        ),
    ),
    ViewSpec(
        name="revenue_by_segment_1h",
        refresh=DASHBOARD_REFRESH,
        inputs=("orders",),
        lookups=("customers_history",),
        define=revenue_by_segment_1h,
        fields="window_start timestamp, window_end timestamp, segment string, revenue double, orders bigint, "
        "order_ids array<string>, order_amounts array<double>, date date",
        keys=("window_start", "segment"),
        key_time="window_start",
        freshness_time="window_start",
        speed_mode="update",
        hidden=("order_ids", "order_amounts"),
        # The counted orders grow with the window: a stateful query would rewrite its whole
        # list into state on every micro-batch, and a merged row would be rewritten likewise.
        combine={
            "revenue": money_sum_sql("revenue"),
            "orders": "CAST(sum(orders) AS BIGINT)",
            **{name: f"array_sort(flatten(collect_list(arrays_zip(order_ids, order_amounts)))).{name}"
               for name in ("order_ids", "order_amounts")},
        },
        metrics={"rows": "count(*)", "revenue": money_sum_sql("revenue"), "orders": "sum(orders)"},
        drift_metrics=("revenue", "orders"),
        differences=Differences(
            table="segment_differences",
            extra_fields="order_id string, amount double, window_start timestamp, speed_segment string, "
            "batch_segment string, date date",
            rows=orders_enriched_differently,
            metrics={"orders_enriched_differently": "count(*)", "revenue_moved": money_sum_sql("amount")},
            view_fields=False,
        ),
    ),
]
VIEWS_BY_NAME: dict[str, ViewSpec] = {view.name: view for view in VIEWS}


def speed_views(settings: Settings) -> list[ViewSpec]:
    """The views the speed layer maintains (``LAMBDALAKE_SPEED_VIEWS``, default all, with the
    dimensions they look up), in registry order."""
    names = [name.strip() for name in settings.speed_views.split(",") if name.strip()]
    unknown = [name for name in names if name not in VIEWS_BY_NAME]
    if unknown:
        raise ConfigError(f"invalid setting LAMBDALAKE_SPEED_VIEWS={settings.speed_views}: unknown view "
                          f"{', '.join(map(repr, unknown))} (views: {', '.join(VIEWS_BY_NAME)})")
    wanted = set(names)
    for name in names:  # a view's lookups run with it
        wanted.update(VIEWS_BY_NAME[name].lookups)
    return [view for view in VIEWS if not names or view.name in wanted]


def speed_trigger_intervals(settings: Settings) -> dict[str, timedelta]:
    """Each speed view's micro-batch interval when the stream runs continuously: its own from
    ``LAMBDALAKE_VIEW_TRIGGERS``, else ``LAMBDALAKE_TRIGGER_INTERVAL`` or, if longer, its spec's
    ``refresh``. A view that need not be fresh within seconds, on a longer interval, leaves the
    cores to those that must be."""
    given = settings.view_trigger_intervals
    unknown = [name for name in given if name not in VIEWS_BY_NAME]
    if unknown:
        raise ConfigError(f"invalid setting LAMBDALAKE_VIEW_TRIGGERS={settings.view_triggers}: unknown view "
                          f"{', '.join(map(repr, unknown))} (views: {', '.join(VIEWS_BY_NAME)})")
    return {view.name: given.get(view.name, max(settings.trigger_interval, view.refresh or timedelta(0)))
            for view in speed_views(settings)}


# Nightly data quality: the same orders must appear in both order views.
CONSISTENT_METRICS = [(("revenue_by_category_5m", "orders"), ("order_payments", "rows")),
                      (("revenue_by_segment_1h", "orders"), ("order_payments", "rows"))]
