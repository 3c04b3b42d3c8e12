"""The customers family: the customer dimension from CDC as it is now (SCD type 1) and as it
was (SCD type 2), and revenue per customer segment, which looks the dimension up."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from include.registry import Differences, Partials, PassStep, Speed, ViewContext, ViewSpec, rows_that_differ, view
from include.views.rules import DASHBOARD_REFRESH, money_sum_sql, window_start_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

CUSTOMER_FIELDS = "customer_id string, name string, email string, segment string, country string"
CUSTOMER_COLUMNS = ("name", "email", "segment", "country")
SEGMENT_WINDOW, SEGMENT_SECONDS = "1 hour", 3600
UNKNOWN_SEGMENT = "unknown"
# revenue_by_segment_1h's counted orders, each with its amount (at the same place in their lists),
# as structs.
COUNTED_ORDERS = "transform(order_ids, (order_id, at) -> struct(order_id AS order_id, order_amounts[at] AS amount))"


def customer_changes(source: str) -> str:
    """SQL: one row per CDC change of ``source`` (a relation with the topic's columns): the
    customer's image (a delete's is the ``before`` image), whether it deletes, and its sequence:
    ``ts_ms``, then arrival (equal ``ts_ms``: the later arrival wins)."""
    return f"""
        SELECT image.customer_id AS customer_id, image, deleted, ts_ms, arrived_at,
               named_struct('ts_ms', ts_ms, 'arrived_at', arrived_at) AS sequence
        FROM (SELECT CASE WHEN op = 'd' THEN before ELSE after END AS image, op = 'd' AS deleted, ts_ms, arrived_at
              FROM {source})"""


def image_columns(struct: str) -> str:
    return ", ".join(f"{struct}.{name} AS {name}" for name in CUSTOMER_COLUMNS)


@view(
    inputs=("customers_cdc",),
    fields=f"{CUSTOMER_FIELDS}, updated_at timestamp, deleted boolean, date date",
    keys=("customer_id",),
    key_time="updated_at",
    kind="dimension",
    hidden=("deleted",),
    served_when="NOT deleted",
    metrics={"rows": "count_if(NOT deleted)", "deleted": "count_if(deleted)"},
    differences=Differences(
        table="customer_differences",
        extra_fields="difference string",
        rows=rows_that_differ,
        metrics={"differing_customers": "count(DISTINCT customer_id)"},
    ),
    # The last change of a customer among partial rows is the last change of them all.
    speed=Speed(freshness_time="updated_at", partials=Partials(
        merge={**{name: f"max_by({name}, sequence)" for name in (*CUSTOMER_COLUMNS, "updated_at", "deleted", "date")},
               "sequence": "max(sequence)"},
    ), state="sequence struct<ts_ms bigint, arrived_at timestamp>"),
    declared_in_sql=True,
)
def customers(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """SCD type 1: each customer's last change by sequence; a delete leaves a hidden tombstone,
    so an older change arriving after it cannot resurrect the customer, and a newer ``c`` re-creates
    it. One grouped ``max_by`` in both layers; the stream merges each micro-batch's last changes
    into the stored ones by the same rule (one row per customer: a dimension is bounded by its
    keys, not by a watermark)."""
    state = "" if context.exact else ", last.sequence AS sequence"
    return f"""
        WITH last AS (
            SELECT customer_id, max_by(named_struct('image', image, 'deleted', deleted, 'sequence', sequence),
                                       sequence) AS last
            FROM ({customer_changes("{customers_cdc}")}) GROUP BY customer_id)
        SELECT customer_id, {image_columns("last.image")}, timestamp_millis(last.sequence.ts_ms) AS updated_at,
               last.deleted AS deleted{state}, to_date(timestamp_millis(last.sequence.ts_ms)) AS date
        FROM last"""


@view(
    inputs=("customers_cdc",),
    fields=f"{CUSTOMER_FIELDS}, valid_from timestamp, valid_to timestamp, is_current boolean, deleted boolean, "
    "date date",
    keys=("customer_id", "valid_from"),
    key_time="coalesce(valid_to, valid_from)",  # a version changes when it opens and when it closes
    kind="dimension",
    hidden=("deleted",),
    served_when="NOT deleted",
    metrics={"rows": "count_if(NOT deleted)", "current": "count_if(is_current)"},
    differences=Differences(
        table="customer_history_differences",
        extra_fields="difference string",
        rows=rows_that_differ,
        metrics={"differing_customers": "count(DISTINCT customer_id)", "differing_versions": "count(*)"},
    ),
    speed=Speed(freshness_time="valid_from", refresh=DASHBOARD_REFRESH,
                incremental=lambda step: customers_history_step(step)),
    declared_in_sql=True,
)
def customers_history(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """SCD type 2: a customer's changes in sequence, each valid until the next (``valid_to``
    null and ``is_current`` for the last). A delete closes the version before it and opens none
    (its row is a hidden tombstone). A change that lands after a newer one takes its place, and
    the neighbours' validity follows, because every change of the customer is re-sequenced: the
    stream re-runs this on each changed customer's stored versions and new changes
    (:func:`customers_history_step`) and merges the customer's versions again."""
    return history_sql("{customers_cdc}")


def history_sql(source: str) -> str:
    """:func:`customers_history` over the CDC changes of ``source``."""
    return f"""
        WITH kept AS (  -- of the changes with the same ts_ms only the last to arrive counts
            SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY customer_id, ts_ms
                                                         ORDER BY arrived_at DESC) AS nth
                           FROM ({customer_changes(source)}))
            WHERE nth = 1),
        versions AS (
            SELECT *, lead(ts_ms) OVER (PARTITION BY customer_id ORDER BY ts_ms) AS to_ms FROM kept)
        SELECT customer_id, {image_columns("image")}, timestamp_millis(ts_ms) AS valid_from,
               timestamp_millis(to_ms) AS valid_to, to_ms IS NULL AND NOT deleted AS is_current, deleted,
               to_date(timestamp_millis(ts_ms)) AS date
        FROM versions"""


def customers_history_step(step: PassStep) -> DataFrame:
    """``customers_history`` kept by the ingest pass: the definition re-run on every change of the
    customers a micro-batch changes. Their earlier changes are their stored versions (one per
    change that counted), turned back into changes that arrived before any new one, so that a new
    change with a version's ``ts_ms`` takes its place, as the definition's rule says. Versions are
    only added or updated (a delete is a tombstone version), so merging the rows by key suffices."""
    changes = step.events("customers_cdc")
    changed = changes.selectExpr("coalesce(after.customer_id, before.customer_id) AS customer_id").distinct()
    stored = step.stored(customers_history.speed_table).join(changed, "customer_id", "left_semi")
    fields = ", ".join(f"'{name}', {name}" for name in ("customer_id", *CUSTOMER_COLUMNS))
    image = f"named_struct({fields})"
    both = f"""
        SELECT op, ts_ms, before, after, arrived_at FROM {{customers_cdc}}
        UNION ALL
        SELECT CASE WHEN deleted THEN 'd' ELSE 'u' END, unix_millis(valid_from),
               CASE WHEN deleted THEN {image} END, CASE WHEN NOT deleted THEN {image} END,
               timestamp_micros(0)
        FROM {{stored}}"""
    return step.query(history_sql(f"({both})"), {"customers_cdc": changes, "stored": stored})


def orders_enriched_differently(spec: ViewSpec) -> str:
    """Orders both layers counted under different segments (the customer's segment changed
    between the order and the stream's processing of it), with their amounts."""
    def per_order(side: str) -> str:
        return f"""
            SELECT counted.order_id, counted.amount, window_start, segment, date
            FROM (SELECT window_start, segment, date, explode({COUNTED_ORDERS}) AS counted FROM {{{side}}})"""

    return f"""
        SELECT b.order_id, b.amount, b.window_start, s.segment AS speed_segment, b.segment AS batch_segment, b.date
        FROM ({per_order("batch")}) AS b JOIN ({per_order("speed")}) AS s ON s.order_id = b.order_id
        WHERE s.segment <> b.segment"""


@view(
    inputs=("orders",),
    lookups=("customers_history",),
    fields="window_start timestamp, window_end timestamp, segment string, revenue double, orders bigint, "
    "order_ids array<string>, order_amounts array<double>, date date",
    keys=("window_start", "segment"),
    key_time="window_start",
    hidden=("order_ids", "order_amounts"),
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
    speed=Speed(freshness_time="window_start", refresh=DASHBOARD_REFRESH,
        # The counted orders grow with the window: a stateful query would rewrite its whole
        # list into state on every micro-batch, and a merged row would be rewritten likewise.
        partials=Partials(merged="read", merge={
            "revenue": money_sum_sql("revenue"),
            "orders": "CAST(sum(orders) AS BIGINT)",
            **{name: f"transform(array_sort(flatten(collect_list({COUNTED_ORDERS}))), counted -> counted.{field})"
               for name, field in (("order_ids", "order_id"), ("order_amounts", "amount"))},
        }),
    ),
    declared_in_sql=True,
)
def revenue_by_segment_1h(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Orders enriched with their customer's segment, revenue and orders per segment in tumbling
    1-hour windows. The batch joins point in time (the version of ``customers_history`` valid at
    the order's time); the stream joins the current versions as its table stands when the order's
    micro-batch runs (a stream-static join whose static side is re-read every micro-batch). No
    customer: ``unknown``. Hidden: the orders counted and their amounts, for reconciliation."""
    valid = ("v.valid_from <= o.event_time AND (v.valid_to IS NULL OR o.event_time < v.valid_to)" if context.exact
             else "v.is_current")
    counted = "array_sort(collect_list(struct(order_id, amount)))"
    return f"""
        SELECT window_start, window_start + INTERVAL {SEGMENT_WINDOW} AS window_end, segment,
               {money_sum_sql("amount")} AS revenue, count(1) AS orders,
               transform({counted}, counted -> counted.order_id) AS order_ids,
               transform({counted}, counted -> counted.amount) AS order_amounts, to_date(window_start) AS date
        FROM (SELECT /*+ BROADCAST(v) */ o.order_id, o.amount, coalesce(v.segment, '{UNKNOWN_SEGMENT}') AS segment,
                     {window_start_sql("o.event_time", SEGMENT_SECONDS)} AS window_start
              FROM {{orders}} AS o LEFT JOIN {{customers_history}} AS v
                   ON o.user_id = v.customer_id AND NOT v.deleted AND {valid})
        GROUP BY window_start, segment"""
