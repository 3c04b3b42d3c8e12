"""Gold view definitions, written once (DataFrame -> DataFrame) and used by both layers.

The speed layer applies them to watermarked streams (approximate where exactness needs unbounded
state); the batch layer applies the same functions to the full history with ``exact=True``.
"""

from __future__ import annotations

from datetime import timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from include.config import spark_interval

REVENUE_WINDOW = "5 minutes"
# Relative error of the speed layer's distinct-buyer estimate (HyperLogLog++).
APPROX_DISTINCT_RSD = 0.01


def money_sum(column: str) -> Column:
    """Exact sum of currency amounts (decimal arithmetic, so any summation order agrees)."""
    return F.sum(F.col(column).cast("decimal(18,2)")).cast("double")


def revenue_by_category_5m(orders: DataFrame, exact: bool) -> DataFrame:
    """Tumbling 5-minute windows on order time: revenue, orders and distinct buyers per category.

    ``orders`` has at least ``user_id``, ``category``, ``amount`` and ``event_time``.
    """
    buyers = F.count_distinct("user_id") if exact else F.approx_count_distinct("user_id", APPROX_DISTINCT_RSD)
    return (
        orders.groupBy(F.window("event_time", REVENUE_WINDOW).alias("window"), "category")
        .agg(money_sum("amount").alias("revenue"), F.count(F.lit(1)).alias("orders"), buyers.alias("unique_buyers"))
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


def order_payments(orders: DataFrame, payments: DataFrame, join_window: timedelta) -> DataFrame:
    """Each order with the payments whose time lies in ``[order_time, order_time + join_window]``.

    A left outer join: orders without such a payment get ``status = 'unpaid'``. An order paid
    more than once yields one row per payment; :func:`first_payment` keeps the earliest.
    """
    order = orders.select(
        "order_id", "user_id", "category", "amount", F.col("event_time").alias("order_time")
    )
    payment = payments.select(
        "payment_id",
        F.col("order_id").alias("paid_order_id"),
        F.col("amount").alias("paid_amount"),
        F.col("event_time").alias("pay_time"),
    )
    window_end = F.col("order_time") + F.expr(f"INTERVAL {spark_interval(join_window)}")
    matches = (
        (F.col("order_id") == F.col("paid_order_id"))
        & (F.col("pay_time") >= F.col("order_time"))
        & (F.col("pay_time") <= window_end)
    )
    return order.join(payment, matches, "leftOuter").select(
        "order_id", "user_id", "category", "amount", "order_time",
        "payment_id", "paid_amount", "pay_time",
        F.when(F.col("payment_id").isNull(), "unpaid").otherwise("paid").alias("status"),
        F.to_date("order_time").alias("date"),
    )


def first_payment(order_payment_rows: DataFrame) -> DataFrame:
    """One row per order: its earliest payment (then lowest payment id); unpaid rows rank last."""
    ranking = (F.col("pay_time").asc_nulls_last(), F.col("payment_id").asc_nulls_last())
    rank = F.row_number().over(Window.partitionBy("order_id").orderBy(*ranking))
    return order_payment_rows.withColumn("_rank", rank).where("_rank = 1").drop("_rank")
