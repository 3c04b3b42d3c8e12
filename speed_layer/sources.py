"""Streaming sources: one raw stream per topic, each in the same shape, so nothing downstream
cares where events came from: ``topic`` string, ``value`` binary (the line's exact bytes),
``source`` string, ``arrived_at`` timestamp. One stream per topic keeps each topic's parse
expression small (Spark plans it every micro-batch)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from include.config import Settings
from include.schemas import TOPIC_NAMES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

RAW_COLUMNS = ("topic", "value", "source", "arrived_at")
KAFKA_PROVIDER_CLASS = "org/apache/spark/sql/kafka010/KafkaSourceProvider.class"


# What a Kafka record of the landing format takes, roughly: turns the bytes bound into records.
KAFKA_RECORD_BYTES = 256


def landing_admission(settings: Settings, available_now: bool) -> dict[str, int]:
    """The file source's bound on one topic's micro-batch (Spark takes one of the two options).

    A continuous stream takes every file waiting up to ``max_bytes_per_trigger``: a micro-batch
    that ran slower than files land (a busy machine, a burst, a restart after downtime) is
    followed by one that takes the backlog, so the stream catches up. ``--available-now`` takes
    one file per topic unless told otherwise, so watermarks advance between micro-batches."""
    if settings.max_files_per_trigger:
        return {"maxFilesPerTrigger": settings.max_files_per_trigger}
    if available_now:
        return {"maxFilesPerTrigger": 1}
    return {"maxBytesPerTrigger": settings.max_bytes_per_trigger}


def kafka_records_per_trigger(settings: Settings) -> int:
    """``maxOffsetsPerTrigger`` of a Kafka topic: set, or the bytes bound in records."""
    return settings.max_offsets_per_trigger or max(1, settings.max_bytes_per_trigger // KAFKA_RECORD_BYTES)


def landing_source(spark: SparkSession, settings: Settings, topics: Sequence[str] = TOPIC_NAMES,
                   available_now: bool = False) -> dict[str, DataFrame]:
    """JSON Lines files in ``landing/<topic>/``, oldest first, as :func:`landing_admission` bounds."""
    streams = {}
    for topic in topics:
        folder = settings.landing_topic_dir(topic)
        folder.mkdir(parents=True, exist_ok=True)
        stream = (
            spark.readStream.format("text")
            .options(**landing_admission(settings, available_now))
            .option("pathGlobFilter", "*.jsonl")
            .option("maxFileAge", f"{int(settings.landing_max_file_age.total_seconds())}s")
            .load(str(folder))
        )
        streams[topic] = stream.select(
            F.lit(topic).alias("topic"),
            F.col("value").cast("binary").alias("value"),  # keeps the bytes, valid UTF-8 or not
            F.col("_metadata.file_path").alias("source"),
            F.col("_metadata.file_modification_time").alias("arrived_at"),
        )
    return streams


def kafka_unavailable_reason(settings: Settings | None = None) -> str | None:
    """None when Spark's Kafka connector is on the classpath (pyspark/jars, $SPARK_HOME/jars, the
    Spark packages `make install` fetched, LAMBDALAKE_SPARK_JARS); otherwise why not, and the fix."""
    from include.spark import jar_with_class, missing_package_reason

    settings = settings if settings is not None else Settings()
    if "spark-sql-kafka" in settings.spark_jars_packages:
        return None  # resolved from Maven when the session starts
    if jar_with_class(settings, KAFKA_PROVIDER_CLASS, "*spark-sql-kafka*.jar") is not None:
        return None
    return missing_package_reason(settings, "the Spark-Kafka connector (spark-sql-kafka)")


def kafka_source(spark: SparkSession, settings: Settings, topics: Sequence[str] = TOPIC_NAMES) -> dict[str, DataFrame]:
    """The same topics on Kafka (cluster deployment); values are the same JSON lines."""
    return {topic: _kafka_topic(spark, settings, topic) for topic in topics}


def _kafka_topic(spark: SparkSession, settings: Settings, topic: str) -> DataFrame:
    return kafka_raw(
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        .option("maxOffsetsPerTrigger", kafka_records_per_trigger(settings))
        .load()
    )


def kafka_raw(records: DataFrame) -> DataFrame:
    """Kafka source rows (``topic``, ``partition``, ``offset``, ``value``, ``timestamp``, …) in the
    raw shape; a record's source is ``topic/partition/offset``, its arrival the broker timestamp."""
    return records.select(
        "topic",
        "value",
        F.format_string("%s/%d/%d", "topic", "partition", "offset").alias("source"),
        F.col("timestamp").alias("arrived_at"),
    )


def rate_source(spark: SparkSession, settings: Settings) -> dict[str, DataFrame]:
    """Synthetic orders at ``rate_rows_per_second`` (load tests): valid JSON for topic orders."""
    categories = F.array(*[F.lit(c) for c in ("books", "electronics", "fashion", "home")])
    order = F.to_json(
        F.struct(
            F.format_string("rate-%d", "value").alias("order_id"),
            F.format_string("C%05d", F.col("value") % 500).alias("user_id"),
            F.format_string("P%04d", F.col("value") % 200).alias("product_id"),
            F.element_at(categories, (F.col("value") % 4 + 1).cast("int")).alias("category"),
            (F.col("value") % 10000 / 100 + 1).alias("amount"),
            F.date_format("timestamp", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'").alias("event_time"),
        )
    )
    return {"orders": (
        spark.readStream.format("rate")
        .option("rowsPerSecond", settings.rate_rows_per_second)
        .load()
        .select(
            F.lit("orders").alias("topic"),
            order.cast("binary").alias("value"),
            F.format_string("rate/%d", "value").alias("source"),
            F.col("timestamp").alias("arrived_at"),
        )
    )}


def open_source(spark: SparkSession, settings: Settings, available_now: bool = False) -> dict[str, DataFrame]:
    """The configured event source (``LAMBDALAKE_EVENT_SOURCE``): a raw stream per topic."""
    if settings.event_source == "kafka":
        reason = kafka_unavailable_reason(settings)
        if reason:
            raise RuntimeError(f"event source 'kafka' cannot run here: {reason}")
        return kafka_source(spark, settings)
    if settings.event_source == "rate":
        return rate_source(spark, settings)
    return landing_source(spark, settings, available_now=available_now)
