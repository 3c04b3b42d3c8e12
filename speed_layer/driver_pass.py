"""Prototype (issue 41, ``LAMBDALAKE_PASS_ENGINE=duckdb``): an ingest micro-batch on the driver.

The flagged micro-batch comes to the driver as Arrow in one Spark job. Silver, late_events and
the feeds are written from it with delta-rs and pyarrow, and the pass's views that have a DuckDB
form here run in DuckDB on it: a small micro-batch then costs no Spark job beyond that one (the
DLQ keeps its Spark job: the shared parser names a line's reason, and rejected lines are rare).

Measured side by side with the Spark pass (benchmarks/DECISIONS.md). The SQL below is a second
copy of two views' logic, kept only to measure the design; were it kept, each view would be
declared once in a form both engines run.
"""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from include import ddl, tables
from include.lakehouse import LakehouseStore, Txn
from include.registry import PassStep, ViewSpec, column_names, replaces_sql, sql_time
from include.views.orders import order_payments, order_payments_inputs


def connection() -> duckdb.DuckDBPyConnection:
    """A DuckDB of its own per step (steps run in parallel threads), on UTC and one thread."""
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'; SET threads = 1")
    return con


def counts(rows: pa.Table) -> dict[str, dict]:
    """Per topic: Silver, DLQ and late rows and the newest valid event time (ingest's summary)."""
    found = {}
    for topic in pc.unique(rows["topic"]).to_pylist():
        part = rows.filter(pc.equal(rows["topic"], topic))
        valid = part.filter(pc.invert(part["rejected"]))
        found[topic] = {"silver_rows": valid.num_rows, "dlq_rows": part.num_rows - valid.num_rows,
                        "late_rows": pc.sum(part["is_late"].fill_null(False).cast(pa.int64())).as_py() or 0,
                        "max_event_time": pc.max(valid["event_time"]).as_py() if valid.num_rows else None}
    return found


def records(rows: pa.Table, topic: str, record: str) -> pa.Table:
    """A topic's rows with its record struct's fields as columns, then the batch's other columns."""
    part = rows.filter(pc.equal(rows["topic"], topic))
    struct = part[record].combine_chunks()
    columns = {field.name: struct.field(i) for i, field in enumerate(struct.type)}
    for name in part.column_names:
        if not name.startswith("record_"):
            columns.setdefault(name, part[name].combine_chunks())
    return pa.table(columns)


def silver_rows(rows: pa.Table, topic: str, record: str) -> pa.Table:
    valid = rows.filter(pc.invert(rows["rejected"]))
    part = records(valid, topic, record)
    schema = tables.arrow_schema(tables.silver_fields(topic))
    columns = {name: part[name] for name in schema.names if name != "date"}
    columns["date"] = pc.cast(part["event_time"], pa.date32())
    return pa.table(columns).cast(schema)


def late_rows(rows: pa.Table) -> pa.Table:
    late = rows.filter(rows["is_late"].fill_null(False))
    behind = pc.subtract(late["watermark_at_arrival"].cast(pa.int64()), late["event_time"].cast(pa.int64()))
    table = late.select(["topic", "event_id", "event_time", "arrived_at", "watermark_at_arrival"])
    table = table.append_column("lateness_seconds", pc.divide(behind.cast(pa.float64()), 1e6))
    table = table.append_column("batch_id", late["batch_id"])
    return table.cast(tables.arrow_schema(tables.LATE_EVENTS_FIELDS))


def write_feeds(wanted: pa.Table, topics: list[str], columns: list[str], folder: Path, batch_id: int) -> None:
    """One Parquet file per feed topic and batch, named by batch id (a replay replaces it)."""
    for topic in topics:
        part = wanted.filter(pc.equal(wanted["topic"], topic)).select(columns)
        target = folder / topic
        target.mkdir(parents=True, exist_ok=True)
        staging = target / f".{batch_id:012d}.parquet.tmp"
        pq.write_table(part, staging)
        os.replace(staging, target / f"{batch_id:012d}.parquet")


def order_payments_rows(store: LakehouseStore, view: ViewSpec, step: PassStep) -> pa.Table:
    """``order_payments_step`` with its join and status rules in DuckDB."""
    orders, payments = order_payments_inputs(step)  # noqa: F841
    con = connection()
    join_window = step.settings.join_window
    window = int(join_window.total_seconds())
    before, after = step.watermark("payments"), step.watermark("payments", after=True)
    closed = f"order_time <= {sql_time(after - join_window)}" if after else "false"
    if after is not None:  # pending orders whose window this micro-batch closes
        since = f"AND order_time > {sql_time(before - join_window)}" if before else ""
        closing = step.stored(view.speed_table, view.fields,  # noqa: F841
                              f"status = 'pending' AND order_time <= {sql_time(after - join_window)} {since}")
    closing_sql = ("UNION ALL BY NAME SELECT order_id, user_id, category, amount, order_time, payment_id, paid_amount, "
                   "pay_time, 'unpaid' AS status FROM closing") if after is not None else ""
    precedence = ", ".join(f"{key} ASC NULLS LAST" for key in view.speed.precedence(""))
    rows = con.sql(f"""
        WITH joined AS (
            SELECT o.order_id, o.user_id, o.category, o.amount, o.event_time AS order_time, p.payment_id,
                   p.amount AS paid_amount, p.event_time AS pay_time, 'paid' AS status
            FROM orders o JOIN payments p ON o.order_id = p.order_id AND p.event_time >= o.event_time
                 AND p.event_time <= o.event_time + to_seconds({window})
            UNION ALL BY NAME
            SELECT order_id, user_id, category, amount, event_time AS order_time, NULL::VARCHAR AS payment_id,
                   NULL::DOUBLE AS paid_amount, NULL::TIMESTAMPTZ AS pay_time,
                   CASE WHEN {closed} THEN 'unpaid' ELSE 'pending' END AS status
            FROM orders
            {closing_sql}),
        ranked AS (SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY {precedence}) AS _rank FROM joined)
        SELECT * EXCLUDE (_rank), CAST(order_time AS DATE) AS date FROM ranked WHERE _rank = 1
    """).to_arrow_table()
    return rows.select(column_names(view.speed_fields)).cast(ddl.arrow_schema(view.speed_fields))


STEPS = {order_payments.name: order_payments_rows}


def keep(store: LakehouseStore, view: ViewSpec, step: PassStep, txn: Txn) -> None:
    """Compute a view's speed rows in DuckDB and merge them, exactly once."""
    if store.is_committed(view.speed_table, txn):
        return
    rows = STEPS[view.name](store, view, step)
    if rows.num_rows == 0:
        return
    rows = rows.select(column_names(view.speed_fields)).cast(ddl.arrow_schema(view.speed_fields))
    update_when = replaces_sql(view.speed.precedence) if view.speed.precedence else None
    store.merge(view.speed_table, rows, view.merge_on, txn, update_when)
