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


def landing_source(spark: SparkSession, settings: Settings, topics: Sequence[str] = TOPIC_NAMES) -> dict[str, DataFrame]:
    """JSON Lines files in ``landing/<topic>/``, oldest first, ``max_files_per_trigger`` per topic."""
    streams = {}
    for topic in topics:
        folder = settings.landing_topic_dir(topic)
        folder.mkdir(parents=True, exist_ok=True)
        stream = (
            spark.readStream.format("text")
            .option("maxFilesPerTrigger", settings.max_files_per_trigger)
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


def kafka_unavailable_reason() -> str | None:
    """None when Spark's Kafka connector is on the classpath; otherwise why not."""
    import zipfile
    from pathlib import Path

    import pyspark

    for jar in (Path(pyspark.__file__).parent / "jars").glob("spark-sql-kafka*.jar"):
        with zipfile.ZipFile(jar) as archive:
            if KAFKA_PROVIDER_CLASS in archive.namelist():
                return None
    return "the Spark-Kafka connector (spark-sql-kafka) is not on Spark's classpath and Maven is unreachable here"


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
        .option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
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


def open_source(spark: SparkSession, settings: Settings) -> dict[str, DataFrame]:
    """The configured event source (``LAMBDALAKE_EVENT_SOURCE``): a raw stream per topic."""
    if settings.event_source == "kafka":
        reason = kafka_unavailable_reason()
        if reason:
            raise RuntimeError(f"event source 'kafka' cannot run here: {reason}")
        return kafka_source(spark, settings)
    if settings.event_source == "rate":
        return rate_source(spark, settings)
    return landing_source(spark, settings)
