"""The orders family: revenue per category in 5-minute windows, and each order with its first
payment in the join window."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from include.registry import (
    Differences, Partials, Speed, ViewContext, ViewSpec, best_per_key, best_per_key_sql, view,
)
from include.views.rules import (
    distinct_count_sql, merged_distinct_count, money_sum_sql, sketch_of, window_start_sql,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

REVENUE_WINDOW = "5 minutes"


@view(
    inputs=("orders",),
    fields="window_start timestamp, window_end timestamp, category string, revenue double, "
    "orders bigint, unique_buyers bigint, date date",
    keys=("window_start", "category"),
    key_time="window_start",
    metrics={
        "rows": "count(*)",
        "revenue": money_sum_sql("revenue"),
        "orders": "sum(orders)",
        "unique_buyers": "sum(unique_buyers)",
    },
    drift_metrics=("rows", "revenue", "orders"),
    speed=Speed(freshness_time="window_start", partials=Partials(
        merge={"revenue": money_sum_sql("revenue"), "orders": "CAST(sum(orders) AS BIGINT)",
               **merged_distinct_count("unique_buyers")},
    ), state=f"{sketch_of('unique_buyers')} binary"),
    declared_in_sql=True,
)
def revenue_by_category_5m(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Tumbling 5-minute windows on order time: revenue, orders and distinct buyers per category."""
    return f"""
        SELECT window_start, window_start + INTERVAL {REVENUE_WINDOW} AS window_end, category,
               {money_sum_sql("amount")} AS revenue, count(1) AS orders,
               {distinct_count_sql("user_id", "unique_buyers", context)}, to_date(window_start) AS date
        FROM (SELECT *, {window_start_sql("event_time", 300)} AS window_start FROM {{orders}})
        GROUP BY window_start, category"""


def order_precedence(row: str) -> list[str]:
    """Which row of an order counts: paid (window matched) before unpaid (window closed) before
    pending (window open); of two payments the earlier, then the lower id."""
    status_rank = f"CASE {row}status WHEN 'paid' THEN 0 WHEN 'unpaid' THEN 1 ELSE 2 END"
    return [status_rank, f"{row}pay_time", f"{row}payment_id"]


def best_order_status(rows: DataFrame) -> DataFrame:
    """One row per order, by :func:`order_precedence`."""
    return best_per_key(rows, ["order_id"], order_precedence)


def late_paid_orders(spec: ViewSpec) -> str:
    """Orders paid in the batch view whose speed row is missing or not paid."""
    return f"""
        SELECT {", ".join(f"b.{name}" for name in ORDER_PAYMENTS_COLUMNS)}, s.status AS speed_status
        FROM {{batch}} AS b LEFT JOIN {{speed}} AS s ON s.order_id = b.order_id
        WHERE b.status = 'paid' AND (s.status IS NULL OR s.status <> 'paid')"""


@view(
    inputs=("orders", "payments"),
    fields="order_id string, user_id string, category string, amount double, order_time timestamp, "
    "payment_id string, paid_amount double, pay_time timestamp, status string, date date",
    keys=("order_id",),
    key_time="order_time",
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
    # A left-outer stream-stream join: Spark's state store holds the open orders and the waiting
    # payments; every order also comes out at once as `pending`, and readers keep the first row of
    # an order by its precedence.
    speed=Speed(freshness_time="order_time", precedence=order_precedence, stateful_query=True),
    declared_in_sql=True,
)
def order_payments(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Each order with the first payment whose time lies in ``[order_time, order_time + join
    window]``; ``unpaid`` when there is none. The speed layer also emits every new order as
    ``pending`` (its window is open); the stored row then follows :func:`order_precedence`."""
    window = int(context.settings.join_window.total_seconds())
    joined = f"""
        SELECT o.order_id, o.user_id, o.category, o.amount, o.event_time AS order_time, p.payment_id,
               p.amount AS paid_amount, p.event_time AS pay_time,
               CASE WHEN p.payment_id IS NULL THEN 'unpaid' ELSE 'paid' END AS status, to_date(o.event_time) AS date
        FROM {{orders}} AS o LEFT JOIN {{payments}} AS p ON p.order_id = o.order_id
             AND p.event_time >= o.event_time AND p.event_time <= o.event_time + INTERVAL {window} SECONDS"""
    if context.exact:
        return best_per_key_sql(joined, ("order_id",), order_precedence, ORDER_PAYMENTS_COLUMNS)
    return f"""{joined}
        UNION ALL
        SELECT order_id, user_id, category, amount, event_time AS order_time, CAST(NULL AS STRING) AS payment_id,
               CAST(NULL AS DOUBLE) AS paid_amount, CAST(NULL AS TIMESTAMP) AS pay_time, 'pending' AS status,
               to_date(event_time) AS date
        FROM {{orders}}"""


ORDER_PAYMENTS_COLUMNS = ("order_id", "user_id", "category", "amount", "order_time", "payment_id", "paid_amount",
                          "pay_time", "status", "date")
