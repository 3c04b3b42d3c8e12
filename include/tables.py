"""Lakehouse table names and schemas, shared by the speed, batch and serving layers.

Each schema is declared once as ``X_FIELDS`` (``"name type, …"``, :mod:`include.ddl`), without
Spark: serving and ``status`` read the declarations. ``X_SCHEMA`` is its Spark StructType, built
the first time it is asked for, and :func:`arrow_schema` gives its Arrow schema.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from include import ddl
from include.schemas import TOPICS

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


def arrow_schema(schema: str | StructType) -> pa.Schema:
    """A table schema as Arrow (timestamps in UTC), for rows built on the driver: from its
    declaration (no Spark), or from a Spark schema."""
    if isinstance(schema, str):
        return ddl.arrow_schema(schema)
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def bronze(topic: str) -> str:
    return f"bronze/{topic}"


def silver(topic: str) -> str:
    return f"silver/{topic}"


# Tables the stream commits to every micro-batch (86,400 commits a day at one a second). Each
# commit lists the table's whole log folder, so with Delta's default 30 days of log a commit
# slows as the day goes on (benchmarks/DECISIONS.md); these keep 10 minutes of log instead
# (cleaned at each checkpoint; delta-spark cleans only files from before the UTC day that
# reaches back to, so today's log stays until the next day). Their older versions are gone:
# `query --as-of` refuses a time before a served table's oldest version (serving/engine.py).
# Delta requires the log to outlast the default retention of removed files, which the
# maintenance's vacuum does not use (it keeps a week of them: batch_layer/maintenance.py).
STREAM_LOG_RETENTION = "10 minutes"
STREAM_TABLE_PROPERTIES = {"delta.logRetentionDuration": f"interval {STREAM_LOG_RETENTION}",
                           "delta.deletedFileRetentionDuration": f"interval {STREAM_LOG_RETENTION}"}
DLQ = "dlq"
LATE_EVENTS = "late_events"
INGEST_BATCHES = "ops/ingest_batches"
STREAM_METRICS = "ops/stream_metrics"
RECONCILIATION = "reconciliation"
BATCH_COVERAGE = "ops/batch_coverage"

# Where a line came from and when: the same for every source (landing file, Kafka, rate).
INGEST_METADATA_FIELDS = (
    "source string, "  # file path, or topic/partition/offset
    "arrived_at timestamp, "  # file modification time or Kafka timestamp
    "ingested_at timestamp, batch_id bigint"
)

BRONZE_FIELDS = f"value binary, {INGEST_METADATA_FIELDS}, event_date date"
BRONZE_PARTITIONS = ["event_date"]


def nullable(schema: StructType) -> StructType:
    """The same Spark schema with every field, nested ones too, nullable (tables hold partial
    rows); :func:`include.ddl.nullable` does it to a declaration."""
    from pyspark.sql.types import StructField, StructType

    return StructType(
        [
            StructField(f.name, nullable(f.dataType) if isinstance(f.dataType, StructType) else f.dataType, True)
            for f in schema.fields
        ]
    )


def silver_fields(topic: str) -> str:
    """The topic's typed fields, its event id and time, ingestion metadata and the event date."""
    declared = TOPICS[topic].fields
    derived = []
    if "event_time" not in ddl.names(declared):  # CDC: derived from ts_ms
        derived.append("event_time timestamp")
    if "event_id" not in ddl.names(declared):
        derived.append("event_id string")
    return ", ".join([ddl.nullable(declared), *derived, INGEST_METADATA_FIELDS, "is_late boolean, date date"])


def silver_schema(topic: str) -> StructType:
    return ddl.spark_schema(silver_fields(topic))


SILVER_PARTITIONS = ["date"]

DLQ_FIELDS = "topic string, raw string, reason string, source string, ingested_at timestamp, batch_id bigint"

LATE_EVENTS_FIELDS = (
    "topic string, event_id string, event_time timestamp, arrived_at timestamp, watermark_at_arrival timestamp, "
    "lateness_seconds double, batch_id bigint"
)

# One row per query, micro-batch and topic: the speed layer's accounting. ``speed_bronze`` fills
# bronze_rows; ``speed_ingest`` the rest, and its max_event_time is the ingest watermark's state.
# Duplicates removed = Bronze - Silver - DLQ (a duplicate never reaches Silver or the DLQ).
INGEST_BATCHES_FIELDS = (
    "query string, batch_id bigint, topic string, bronze_rows bigint, dlq_rows bigint, silver_rows bigint, "
    "late_rows bigint, max_event_time timestamp, watermark timestamp, processed_at timestamp"
)

STREAM_METRICS_FIELDS = (
    "query string, run_id string, batch_id bigint, timestamp timestamp, input_rows bigint, "
    "input_rows_per_second double, processed_rows_per_second double, batch_duration_ms bigint, "
    "duration_ms string, "  # JSON: Spark's durationMs breakdown
    "watermark timestamp, state_rows bigint, rows_dropped_by_watermark bigint, output_rows bigint, "
    "max_event_time timestamp"  # the newest event time the batch read
)

RECONCILIATION_FIELDS = (
    "view string, date date, metric string, speed_value double, batch_value double, diff double, computed_at timestamp"
)

# A day is batch-covered once its row is here; bronze_rows fingerprints the input it was built from,
# table_versions (JSON) the version of each table the run published; rerun_started_at is set while
# a later run of the day has not published (include/coverage.py).
BATCH_COVERAGE_FIELDS = (
    "date date, covered_at timestamp, bronze_rows string, run_id string, table_versions string, "
    "rerun_started_at timestamp"
)

ALERTS = "ops/alerts"
ALERTS_FIELDS = "at timestamp, source string, severity string, message string, details string"

# Every decision of the stream supervisor (speed_layer/supervisor.py).
SUPERVISOR_EVENTS = "ops/supervisor_events"
SUPERVISOR_EVENTS_FIELDS = (
    "at timestamp, state string, decision string, reason string, pid bigint, restarts_last_hour int"
)

# The ops tables delta-rs writes, from processes with or without a JVM (the notifier, the
# supervisor, the stream's metrics listener, the coverage the batch and the DAG publish); no
# Spark job writes them, so each table has one writing engine.
OPS_TABLES = frozenset({ALERTS, SUPERVISOR_EVENTS, STREAM_METRICS, BATCH_COVERAGE})

__getattr__ = ddl.spark_schemas(globals(), __name__)  # BRONZE_SCHEMA, DLQ_SCHEMA, …: built on first use
