"""Ingest: one micro-batch of raw lines into Bronze, DLQ, Silver, late_events and the Gold feeds.

One Spark job per micro-batch parses every topic's lines (the shared parser) and brings them to
the driver as Arrow; the rest is Arrow compute and Delta commits. Each table is written with the
transaction id ``(speed_ingest, batch_id)``, so a micro-batch replayed after a crash writes
nothing twice. A replay also computes the same rows: the watermark and the dedup state are read
from what earlier batches (``batch_id`` below this one) committed.

Rules (ARCHITECTURE.md): a topic's watermark is the max event time seen in earlier micro-batches
minus the watermark delay; an event at or behind it is *late*: it is kept in Silver (flagged),
listed in ``late_events``, and left out of the streaming Gold views, exactly as Spark's stateful
operators would drop it. Duplicates (same event id as an event still within the watermark, or
earlier in the same batch) are removed from Silver and counted.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.parsing import Parser
from include.schemas import TOPICS

from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

APP_ID = "speed_ingest"
# Topics whose on-time events feed the streaming Gold views.
FEED_TOPICS = ("orders", "payments")
DLQ_RAW_LIMIT = 8192
UTC_US = pa.timestamp("us", tz="UTC")


def sql_timestamp(moment: datetime) -> str:
    return f"CAST('{moment.astimezone(timezone.utc).isoformat()}' AS TIMESTAMP)"


def feed_struct(topic: str) -> StructType:
    """The schema of a topic's feed files: its typed fields, all nullable."""
    return tables.nullable(TOPICS[topic].schema)


def pending_orders(orders: pa.Table) -> pa.Table:
    """order_payments rows for orders whose join window is still open."""
    count = orders.num_rows
    return pa.table(
        {
            "order_id": orders["order_id"], "user_id": orders["user_id"], "category": orders["category"],
            "amount": orders["amount"], "order_time": orders["event_time"],
            "payment_id": pa.nulls(count, pa.string()), "paid_amount": pa.nulls(count, pa.float64()),
            "pay_time": pa.nulls(count, UTC_US), "status": pa.array(["pending"] * count),
            "date": pc.cast(orders["event_time"], pa.date32()),
        }
    )


def ensure_ingest_tables(store: LakehouseStore, topics: tuple[str, ...]) -> None:
    for topic in topics:
        store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
        store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS)
    store.ensure_table(tables.DLQ, tables.DLQ_SCHEMA)
    store.ensure_table(tables.LATE_EVENTS, tables.LATE_EVENTS_SCHEMA)
    store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA)
    store.ensure_table(tables.SPEED_ORDER_PAYMENTS, tables.ORDER_PAYMENTS_SCHEMA, ["date"])


class IngestBatch:
    """The ``foreachBatch`` function of the ingest query."""

    def __init__(self, settings: Settings, store: LakehouseStore, topics: tuple[str, ...]) -> None:
        self.settings = settings
        self.store = store
        self.topics = topics
        self.delay = settings.watermark_delay
        self.parser = Parser(topics, settings.max_line_bytes)

    # ---- state from earlier batches ---------------------------------------------------------
    def watermarks(self, batch_id: int) -> dict[str, datetime]:
        """Per topic: max event time of the batches before ``batch_id``, minus the delay."""
        rows = self.store.select_arrow(
            tables.INGEST_BATCHES, ["topic", "max_event_time"],
            f"batch_id < {batch_id} AND max_event_time IS NOT NULL",
        )
        if rows.num_rows == 0:
            return {}
        latest = rows.group_by("topic").aggregate([("max_event_time", "max")]).to_pylist()
        return {row["topic"]: row["max_event_time_max"] - self.delay for row in latest}

    def recent_ids(self, topic: str, batch_id: int, since: datetime) -> pa.Array:
        """Ids already in Silver from earlier batches whose event time is still within reach."""
        where = (
            f"batch_id < {batch_id} AND date >= CAST('{since.date().isoformat()}' AS DATE) "
            f"AND event_time >= {sql_timestamp(since)}"
        )
        return self.store.select_arrow(tables.silver(topic), ["event_id"], where).column("event_id").combine_chunks()

    # ---- the batch ----------------------------------------------------------------------------
    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        ingested_at = datetime.now(timezone.utc)
        parsed = self.parser.parse(batch).toArrow()
        if parsed.num_rows == 0:
            return
        watermarks = self.watermarks(batch_id)
        txn = Txn(APP_ID, batch_id)
        constants = {
            "ingested_at": pa.array([ingested_at] * parsed.num_rows, UTC_US),
            "batch_id": pa.array([batch_id] * parsed.num_rows, pa.int64()),
        }
        for name, column in constants.items():
            parsed = parsed.append_column(name, column)

        dlq_parts, late_parts, accounting = [], [], []
        for topic in self.topics:
            rows = parsed.filter(pc.equal(parsed["topic"], topic))
            if rows.num_rows == 0:
                continue
            self.store.append(tables.bronze(topic), rows.select([f.name for f in tables.BRONZE_SCHEMA.fields]), txn)
            rejected = rows.filter(pc.is_valid(rows["reason"]))
            if rejected.num_rows:
                dlq_parts.append(self._dlq_rows(topic, rejected))
            valid = rows.filter(pc.is_null(rows["reason"]))
            watermark = watermarks.get(topic)
            silver, duplicates = self._deduplicate(topic, valid, batch_id, watermark)
            late_mask = (
                pc.less_equal(silver["event_time"], pa.scalar(watermark, UTC_US))
                if watermark is not None else pa.array([False] * silver.num_rows)
            )
            silver = silver.append_column("is_late", late_mask)
            silver = silver.append_column("date", pc.cast(silver["event_time"], pa.date32()))
            if silver.num_rows:
                self.store.append(tables.silver(topic), silver, txn)
            late = silver.filter(late_mask)
            if late.num_rows:
                late_parts.append(self._late_rows(topic, late, watermark))
            if topic in FEED_TOPICS:
                on_time = silver.filter(pc.invert(late_mask))
                self._write_feed(topic, batch_id, on_time)
                if topic == "orders" and on_time.num_rows:
                    # Visible as pending until the join says paid or unpaid (it may already have).
                    self.store.merge(tables.SPEED_ORDER_PAYMENTS, pending_orders(on_time), ["order_id"], txn, insert_only=True)
            accounting.append(
                {
                    "batch_id": batch_id, "topic": topic,
                    "bronze_rows": rows.num_rows, "dlq_rows": rejected.num_rows,
                    "silver_rows": silver.num_rows, "duplicate_rows": duplicates,
                    "late_rows": late.num_rows,
                    "max_event_time": pc.max(valid["event_time"]).as_py() if valid.num_rows else None,
                    "watermark": watermark, "processed_at": ingested_at,
                }
            )
        if dlq_parts:
            self.store.append(tables.DLQ, pa.concat_tables(dlq_parts), txn)
        if late_parts:
            self.store.append(tables.LATE_EVENTS, pa.concat_tables(late_parts), txn)
        # Last: a batch's accounting row means all of its writes are committed.
        self.store.append(
            tables.INGEST_BATCHES,
            pa.Table.from_pylist(accounting, schema=tables.arrow_schema(tables.INGEST_BATCHES_SCHEMA)),
            txn,
        )
        log.info("ingest batch %d: %s", batch_id, {a["topic"]: a["bronze_rows"] for a in accounting})

    def _deduplicate(
        self, topic: str, valid: pa.Table, batch_id: int, watermark: datetime | None
    ) -> tuple[pa.Table, int]:
        """Silver rows (first copy of each event id) and how many duplicates were removed."""
        if valid.num_rows == 0:
            return self._silver_columns(valid, topic), 0
        order = pc.sort_indices(valid, [("event_id", "ascending"), ("arrived_at", "ascending"), ("source", "ascending")])
        ordered = valid.take(order).append_column("_row", pa.array(range(valid.num_rows), pa.int64()))
        first = ordered.group_by("event_id", use_threads=False).aggregate([("_row", "min")])
        unique = ordered.take(first["_row_min"])
        if watermark is not None:
            seen = self.recent_ids(topic, batch_id, watermark - self.delay)
            if len(seen):
                unique = unique.filter(pc.invert(pc.is_in(unique["event_id"], value_set=seen)))
        return self._silver_columns(unique, topic), valid.num_rows - unique.num_rows

    def _silver_columns(self, valid: pa.Table, topic: str) -> pa.Table:
        record = valid.column(self.parser.record_column(topic)).combine_chunks()
        columns = {field.name: record.field(field.name) for field in TOPICS[topic].schema.fields}
        for name in ("event_time", "event_id", "source", "arrived_at", "ingested_at", "batch_id"):
            columns.setdefault(name, valid.column(name))
        return pa.table(columns)

    @staticmethod
    def _dlq_rows(topic: str, rejected: pa.Table) -> pa.Table:
        raws = []
        for value in rejected.column("value").to_pylist():
            text = value.decode("utf-8", errors="replace")
            if len(text) > DLQ_RAW_LIMIT:  # the whole line stays in Bronze
                text = f"{text[:DLQ_RAW_LIMIT]}… [{len(value)} bytes; full line in bronze]"
            raws.append(text)
        return pa.table(
            {
                "topic": pa.array([topic] * rejected.num_rows),
                "raw": pa.array(raws, pa.string()),
                "reason": rejected.column("reason"),
                "source": rejected.column("source"),
                "ingested_at": rejected.column("ingested_at"),
                "batch_id": rejected.column("batch_id"),
            }
        )

    @staticmethod
    def _late_rows(topic: str, late: pa.Table, watermark: datetime) -> pa.Table:
        behind = pc.subtract(pa.scalar(watermark, UTC_US), late["event_time"])
        return pa.table(
            {
                "topic": pa.array([topic] * late.num_rows),
                "event_id": late["event_id"],
                "event_time": late["event_time"],
                "arrived_at": late["arrived_at"],
                "watermark_at_arrival": pa.array([watermark] * late.num_rows, UTC_US),
                "lateness_seconds": pc.divide(pc.cast(pc.cast(behind, pa.duration("us")), pa.int64()), 1e6),
                "batch_id": late["batch_id"],
            }
        )

    def _write_feed(self, topic: str, batch_id: int, on_time: pa.Table) -> None:
        """One Parquet file per batch, named by batch id: a replay rewrites the same file."""
        if on_time.num_rows == 0:
            return
        schema = tables.arrow_schema(feed_struct(topic))
        folder = self.settings.feeds_dir / topic
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{batch_id:012d}.parquet"
        temporary = folder / f".{batch_id:012d}.tmp"
        pq.write_table(on_time.select(schema.names).cast(schema), temporary)
        os.replace(temporary, final)


__all__ = ["APP_ID", "FEED_TOPICS", "IngestBatch", "ensure_ingest_tables", "feed_struct"]
