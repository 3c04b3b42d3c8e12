"""Lakehouse table names and schemas, shared by the speed, batch and serving layers."""

from __future__ import annotations

import pyarrow as pa

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from include.schemas import TOPICS


def arrow_schema(schema: StructType) -> pa.Schema:
    """A table schema as Arrow (timestamps in UTC), for rows built on the driver."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def bronze(topic: str) -> str:
    return f"bronze/{topic}"


def silver(topic: str) -> str:
    return f"silver/{topic}"


# Tables that take a merge every micro-batch (the speed views). A merge rewrites each file that
# holds a matched row, with all its other rows; at Delta's default 100 MB per file that is soon
# the whole table, every micro-batch. 1 MB files keep a rewrite to the few newest files
# (benchmarks/DECISIONS.md).
MERGED_TABLE_PROPERTIES = {"delta.targetFileSize": str(1024 * 1024)}
DLQ = "dlq"
LATE_EVENTS = "late_events"
INGEST_BATCHES = "ops/ingest_batches"
STREAM_METRICS = "ops/stream_metrics"
RECONCILIATION = "reconciliation"
BATCH_COVERAGE = "ops/batch_coverage"

# Where a line came from and when: the same for every source (landing file, Kafka, rate).
INGEST_METADATA = [
    StructField("source", StringType()),  # file path, or topic/partition/offset
    StructField("arrived_at", TimestampType()),  # file modification time or Kafka timestamp
    StructField("ingested_at", TimestampType()),
    StructField("batch_id", LongType()),
]

BRONZE_SCHEMA = StructType(
    [StructField("value", BinaryType()), *INGEST_METADATA, StructField("event_date", DateType())]
)
BRONZE_PARTITIONS = ["event_date"]


def nullable(schema: StructType) -> StructType:
    """The same schema with every field, nested ones too, nullable (tables hold partial rows)."""
    return StructType(
        [
            StructField(f.name, nullable(f.dataType) if isinstance(f.dataType, StructType) else f.dataType, True)
            for f in schema.fields
        ]
    )


def silver_schema(topic: str) -> StructType:
    """The topic's typed fields, its event id and time, ingestion metadata and the event date."""
    fields = list(nullable(TOPICS[topic].schema).fields)
    names = TOPICS[topic].schema.fieldNames()
    if "event_time" not in names:  # CDC: derived from ts_ms
        fields.append(StructField("event_time", TimestampType()))
    if "event_id" not in names:
        fields.append(StructField("event_id", StringType()))
    return StructType(
        [
            *fields,
            *INGEST_METADATA,
            StructField("is_late", BooleanType()),
            StructField("date", DateType()),
        ]
    )


SILVER_PARTITIONS = ["date"]

DLQ_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("raw", StringType()),
        StructField("reason", StringType()),
        StructField("source", StringType()),
        StructField("ingested_at", TimestampType()),
        StructField("batch_id", LongType()),
    ]
)

LATE_EVENTS_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("event_id", StringType()),
        StructField("event_time", TimestampType()),
        StructField("arrived_at", TimestampType()),
        StructField("watermark_at_arrival", TimestampType()),
        StructField("lateness_seconds", DoubleType()),
        StructField("batch_id", LongType()),
    ]
)

# One row per query, micro-batch and topic: the speed layer's accounting. ``speed_bronze`` fills
# bronze_rows; ``speed_ingest`` the rest, and its max_event_time is the ingest watermark's state.
# Duplicates removed = Bronze - Silver - DLQ (a duplicate never reaches Silver or the DLQ).
INGEST_BATCHES_SCHEMA = StructType(
    [
        StructField("query", StringType()),
        StructField("batch_id", LongType()),
        StructField("topic", StringType()),
        StructField("bronze_rows", LongType()),
        StructField("dlq_rows", LongType()),
        StructField("silver_rows", LongType()),
        StructField("late_rows", LongType()),
        StructField("max_event_time", TimestampType()),
        StructField("watermark", TimestampType()),
        StructField("processed_at", TimestampType()),
    ]
)

STREAM_METRICS_SCHEMA = StructType(
    [
        StructField("query", StringType()),
        StructField("run_id", StringType()),
        StructField("batch_id", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("input_rows", LongType()),
        StructField("input_rows_per_second", DoubleType()),
        StructField("processed_rows_per_second", DoubleType()),
        StructField("batch_duration_ms", LongType()),
        StructField("duration_ms", StringType()),  # JSON: Spark's durationMs breakdown
        StructField("watermark", TimestampType()),
        StructField("state_rows", LongType()),
        StructField("rows_dropped_by_watermark", LongType()),
        StructField("output_rows", LongType()),
        StructField("max_event_time", TimestampType()),  # the newest event time the batch read
    ]
)

RECONCILIATION_SCHEMA = StructType(
    [
        StructField("view", StringType()),
        StructField("date", DateType()),
        StructField("metric", StringType()),
        StructField("speed_value", DoubleType()),
        StructField("batch_value", DoubleType()),
        StructField("diff", DoubleType()),
        StructField("computed_at", TimestampType()),
    ]
)

# A day is batch-covered once its row is here; bronze_rows fingerprints the input it was built from.
BATCH_COVERAGE_SCHEMA = StructType(
    [
        StructField("date", DateType()),
        StructField("covered_at", TimestampType()),
        StructField("bronze_rows", StringType()),
    ]
)

ALERTS = "ops/alerts"
ALERTS_SCHEMA = StructType(
    [
        StructField("at", TimestampType()),
        StructField("source", StringType()),
        StructField("severity", StringType()),
        StructField("message", StringType()),
        StructField("details", StringType()),
    ]
)

# Every decision of the stream supervisor (speed_layer/supervisor.py).
SUPERVISOR_EVENTS = "ops/supervisor_events"
SUPERVISOR_EVENTS_SCHEMA = StructType(
    [
        StructField("at", TimestampType()),
        StructField("state", StringType()),
        StructField("decision", StringType()),
        StructField("reason", StringType()),
        StructField("pid", LongType()),
        StructField("restarts_last_hour", IntegerType()),
    ]
)
