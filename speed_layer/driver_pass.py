"""An ingest micro-batch on the driver (``LAMBDALAKE_PASS_ENGINE=duckdb``).

The micro-batch's lines come to the driver as Arrow in one Spark job that reads them and nothing
more. The driver parses them (``ingest.parse_on_driver``): the lines :mod:`include.line_parser`
vouches for in Python, the others (rejected lines, any it is not sure of) with the shared
parser in a small Spark job over those lines alone, which also names the rejected ones' reasons.
Bronze is written from every line, then copies are dropped (:mod:`speed_layer.dedup`); Silver,
late_events, the DLQ and the feeds are written from the rest with delta-rs and pyarrow, and the
pass's views declared in SQL run in DuckDB on it (speed_layer/view_pass.py, include/views/sql.py).
A micro-batch of valid lines costs no Spark job beyond the read.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from include import tables

BRONZE_COLUMNS = {"event_date": "bronze_date"}  # Bronze's columns by the micro-batch's names


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


def bronze_rows(rows: pa.Table, topic: str) -> pa.Table:
    """Every line of the topic, byte for byte, as Bronze keeps it."""
    part = rows.filter(pc.equal(rows["topic"], topic))
    schema = tables.arrow_schema(tables.BRONZE_FIELDS)
    return pa.table({name: part[BRONZE_COLUMNS.get(name, name)] for name in schema.names}).cast(schema)


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


def dlq_rows(rows: pa.Table) -> pa.Table:
    """The rejected lines, with the reasons the shared parser named (ingest.parse_on_driver)."""
    rejected = rows.filter(rows["rejected"]).select(["topic", "dlq_raw", "reason", "source", "ingested_at", "batch_id"])
    schema = tables.arrow_schema(tables.DLQ_FIELDS)
    return rejected.rename_columns(schema.names).cast(schema)


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
