"""The orders family: revenue per category in 5-minute windows, and each order with its first
payment in the join window."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

from include import ddl
from include.registry import (
    Differences, HeldRows, Partials, PassStep, Speed, ViewContext, ViewSpec, best_per_key, best_per_key_sql,
    column_names, sql_time, view,
)
from include.views.rules import (
    distinct_count_sql, merged_distinct_count, money_sum_sql, sketch_of, window_start_sql,
)

if TYPE_CHECKING:
    import pyarrow as pa
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
    speed=Speed(mode="update", freshness_time="window_start", partials=Partials(
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
    speed=Speed(mode="append", freshness_time="order_time", precedence=order_precedence,
                incremental=lambda step: order_payments_step(step)),
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
ORDER_FIELDS = "order_id string, user_id string, category string, amount double, event_time timestamp"
PAYMENT_FIELDS = "payment_id string, order_id string, amount double, event_time timestamp"
# What the stream holds of an order whose window is open (PassStep.held): its fields, and whether it is paid.
OPEN_ORDER_FIELDS = ("order_id string, user_id string, category string, amount double, order_time timestamp, "
                     "paid boolean")
OPEN_ORDERS, WAITING_PAYMENTS = "order_payments/open_orders", "order_payments/waiting_payments"


def order_payments_step(step: PassStep) -> pa.Table:
    """``order_payments`` kept by the ingest pass: the definition re-run on what one micro-batch
    touches: its on-time orders, the open orders its payments may pay and those whose window it
    closes, and its payments with those that came before their order. Open orders and waiting
    payments are held in memory (:meth:`PassStep.held`): an order until the payments' watermark
    passes its window's end, a payment until the orders' watermark passes it (an on-time order
    comes after that watermark, so it pays no earlier payment). A join row left without a
    payment is not ``unpaid`` yet: the order stays ``pending`` until its window closes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from include.lakehouse.base import sql_literal

    paid_by, paid_until = step.watermark("payments"), step.watermark("payments", after=True)
    closes_at = paid_until - step.settings.join_window if paid_until else None
    open_orders = step.held(OPEN_ORDERS, OPEN_ORDER_FIELDS, "order_id", lambda: stored_open_orders(step, paid_by))
    waiting = step.held(WAITING_PAYMENTS, PAYMENT_FIELDS, "payment_id",
                        lambda: earlier_waiting_payments(step, step.watermark("orders"), open_orders))
    new_orders = step.events("orders").select(column_names(ORDER_FIELDS))
    new_payments = step.events("payments").select(column_names(PAYMENT_FIELDS))
    closing = (open_orders.take(f"order_time <= {sql_literal(closes_at)}") if closes_at
               else ddl.arrow_schema(OPEN_ORDER_FIELDS).empty_table())
    paying = pc.unique(new_payments["order_id"])
    known = open_orders.get("order_id", paying.to_pylist())  # open orders these payments may pay
    # Closing orders to run again: those the payments may pay, and the pending ones (now unpaid).
    closing = closing.filter(pc.or_(pc.is_in(closing["order_id"], paying), pc.invert(closing["paid"])))
    orders = pa.concat_tables([new_orders, *(held.drop_columns(["paid"]).rename_columns(new_orders.column_names)
                                             .cast(new_orders.schema) for held in (known, closing))])
    new_ids = pc.unique(new_orders["order_id"])
    payments = pa.concat_tables([new_payments, waiting.take_matching("order_id", new_ids.to_pylist())])

    # The closing time as a table, not a literal: the query's text stays the same (translated once).
    columns = ", ".join(name if name != "status" else
                        "CASE WHEN status = 'pending' AND order_time <= (SELECT at FROM {closes_at}) THEN 'unpaid' "
                        "ELSE status END AS status" for name in ORDER_PAYMENTS_COLUMNS)
    definition = order_payments.sql(ViewContext(step.settings, exact=False))
    rows = step.query(f"SELECT {columns} FROM ({definition}) AS rows WHERE status <> 'unpaid'",
                      {"orders": orders, "payments": payments,
                       "closes_at": pa.table({"at": pa.array([closes_at], pa.timestamp("us", "UTC"))})})

    paid = pc.unique(rows.filter(pc.equal(rows["status"], "paid"))["order_id"])
    arrived = new_orders.rename_columns(["order_time" if name == "event_time" else name
                                         for name in new_orders.column_names])
    arrived = arrived.append_column("paid", pc.is_in(arrived["order_id"], paid)).cast(known.schema)
    if closes_at:  # an order whose window closed as it arrived is not held
        arrived = arrived.filter(pc.greater(arrived["order_time"], pa.scalar(closes_at, arrived["order_time"].type)))
    open_orders.put(arrived)
    newly_paid = known.filter(pc.and_(pc.invert(known["paid"]), pc.is_in(known["order_id"], paid)))
    open_orders.put(newly_paid.set_column(known.schema.get_field_index("paid"), "paid",
                                          pa.array([True] * newly_paid.num_rows, pa.bool_())))
    seen = pa.concat_arrays([new_ids, known["order_id"].combine_chunks(), closing["order_id"].combine_chunks()])
    waiting.put(new_payments.filter(pc.invert(pc.is_in(new_payments["order_id"], seen))))
    orders_until = step.watermark("orders", after=True)
    if orders_until:
        waiting.take(f"event_time <= {sql_literal(orders_until)}")
    return rows


def stored_open_orders(step: PassStep, paid_by: datetime | None) -> pa.Table:
    """The orders whose window the payments' watermark ``paid_by`` has not closed, from the speed
    table: a new process's :data:`OPEN_ORDERS`."""
    import pyarrow.compute as pc

    still_open = f"order_time > {sql_time(paid_by - step.settings.join_window)}" if paid_by else "true"
    rows = step.stored(order_payments.speed_table, "order_id string, user_id string, category string, "
                       "amount double, order_time timestamp, status string", f"status <> 'unpaid' AND {still_open}")
    return rows.append_column("paid", pc.equal(rows["status"], "paid")).drop_columns(["status"])


def earlier_waiting_payments(step: PassStep, orders_seen_to: datetime | None, open_orders: HeldRows) -> pa.Table:
    """The earlier micro-batches' payments that no order seen so far took and an on-time order
    may still take (after the orders' watermark): a new process's :data:`WAITING_PAYMENTS`."""
    import pyarrow.compute as pc

    payments = step.earlier("payments", PAYMENT_FIELDS,
                            f"event_time > {sql_time(orders_seen_to)}" if orders_seen_to else "true")
    seen = open_orders.get("order_id", pc.unique(payments["order_id"]).to_pylist())["order_id"]
    return payments.filter(pc.invert(pc.is_in(payments["order_id"], seen.combine_chunks())))

