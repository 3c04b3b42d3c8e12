"""The ingest query: landed lines into Silver, the DLQ and late_events, and the Gold feeds.

Everything runs on Spark's executors. Per micro-batch: each topic's lines
are parsed with the shared parser; Spark's state store drops copies of an event already ingested
within the dedup window (:func:`include.views.rules.first_copies`); then, in ``foreachBatch``,
lateness is flagged against each topic's watermark, and the executors write Silver, the DLQ,
late_events and the on-time events the Gold queries read (``feeds/<topic>/``), and ingest's pass
computes the views it keeps (:mod:`speed_layer.view_pass`). Each table's commit has the transaction id
``(speed_ingest, batch_id)``: a micro-batch replayed after a crash (even ``kill -9``) commits
nothing twice, and computes the same rows, because its watermarks come from the accounting of
earlier batches and the dedup state from Spark's checkpoint.

Rules (docs/architecture.md): a topic's watermark is the max event time seen in earlier micro-batches
minus the watermark delay; an event at or behind it is *late*: kept in Silver (flagged), listed
in ``late_events`` and left out of the Gold feeds, so the speed views leave out exactly what
``late_events`` lists. Dimensions are the exception: a change is state, not a window, so a late
CDC change is listed and still fed (sequenced by ``ts_ms`` in the view).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from include import tables
from include.checkpoints import batch_time
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.parsing import DEFAULT_MAX_LINE_BYTES, parse_topic, with_reason
from include.registry import input_topics
from include.schemas import TOPICS
from include.spark import with_batch_values
from include.views import VIEWS, speed_trigger_intervals, speed_views
from include.views.rules import first_copies
from speed_layer.view_pass import STATE_TOPICS, MicroBatch, ViewPass

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

QUERY = "speed_ingest"
# Topics whose on-time events the Gold queries read; late ones too for topics a dimension reads.
FEED_TOPICS = input_topics(VIEWS)
DLQ_RAW_LIMIT = 8192
ROWS_PER_WRITE_TASK = 100_000
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def record_column(topic: str) -> str:
    return f"record_{topic}"


def feed_schema() -> StructType:
    """Feed files: each feed topic's typed record (null on other topics' rows), event time and
    arrival time."""
    fields = [StructField(record_column(t), tables.nullable(TOPICS[t].schema)) for t in FEED_TOPICS]
    times = [f for f in tables.silver_schema(FEED_TOPICS[0]).fields if f.name in ("event_time", "arrived_at")]
    return StructType([*fields, *times])


def view_events(batch: DataFrame, topic: str) -> DataFrame:
    """What the views read of a topic in a flagged micro-batch: its on-time events (all of them
    for a topic a dimension reads), as typed fields, event, arrival and ingestion time."""
    extra = [] if "event_time" in TOPICS[topic].schema.fieldNames() else ["event_time"]
    return batch.where((F.col("topic") == topic) & ~F.col("rejected") & _wanted()).select(
        f"{record_column(topic)}.*", *extra, "arrived_at", "ingested_at")


def _wanted():  # noqa: ANN202 - Column
    return ~F.col("is_late") | F.col("topic").isin(*STATE_TOPICS)


def parsed_events(raw: dict[str, DataFrame], settings: Settings) -> DataFrame:
    """Every topic's lines as one stream, parsed, first copies only (rejected lines all pass)."""
    events = spark_parsed(raw, record_topics(tuple(raw)), max_line_bytes=settings.max_line_bytes)
    # current_timestamp() is the micro-batch's time, recorded in the offset log: a replay sees
    # the same value. A rejected line gets a key of its own, so none is taken for a duplicate.
    events = events.withColumns(
        {
            "ingested_at": F.current_timestamp(),
            "copy_key": F.coalesce(F.col("event_id"), F.concat(F.lit("rejected|"), F.expr("uuid()"))),
        }
    )
    return first_copies(events, ["topic", "copy_key"], settings.dedup_window)


def dlq_raw() -> Column:
    """A rejected line as the DLQ shows it: its text (invalid UTF-8 replaced), cut at
    :data:`DLQ_RAW_LIMIT` characters (the whole line stays in Bronze)."""
    text = F.expr("make_valid_utf8(cast(value AS STRING))")
    return F.when(
        F.length("value") > DLQ_RAW_LIMIT,
        F.format_string("%s… [%d bytes; full line in bronze]", F.substring(text, 1, DLQ_RAW_LIMIT), F.length("value")),
    ).otherwise(text)


def record_topics(topics: tuple[str, ...]) -> tuple[str, ...]:
    """The topics with a record column in a parsed micro-batch: those read, and every feed topic."""
    return tuple(dict.fromkeys([*topics, *FEED_TOPICS]))


def spark_parsed(raw: dict[str, DataFrame], columns: tuple[str, ...],
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """Lines of each topic parsed by the shared parser, as one frame: a record column per topic
    of ``columns``. Only a rejected line's bytes go further (into the DLQ), not a valid one's
    across the dedup's shuffle and cache."""
    parts = []
    for topic, stream in raw.items():
        parsed = parse_topic(stream, topic, max_line_bytes)
        records = [
            (F.col("record") if other == topic else F.lit(None).cast(tables.nullable(TOPICS[other].schema)))
            .alias(record_column(other))
            for other in columns
        ]
        raw_line = F.when(F.col("rejected"), F.col("value")).alias("value")
        parts.append(parsed.select("topic", raw_line, "source", "arrived_at", "rejected", "event_id", "event_time",
                                   *records))
    return _union(parts)


def _union(parts: list[DataFrame]) -> DataFrame:
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    return events


def _instant(micros: int | None) -> datetime | None:
    return None if micros is None else EPOCH + timedelta(microseconds=micros)


class IngestBatch:
    """The ``foreachBatch`` function of the ingest query, whose checkpoint is
    ``checkpoints/speed_ingest`` (each micro-batch's time is read there). ``continuous``: the
    stream runs on its trigger, so the views on an interval of their own run less often."""

    def __init__(self, settings: Settings, store: LakehouseStore, topics: tuple[str, ...],
                 continuous: bool = False) -> None:
        self.settings, self.store, self.topics = settings, store, topics
        views = speed_views(settings)
        self.view_pass = ViewPass(settings, store, views, speed_trigger_intervals(settings) if continuous else None)
        self.record_topics = record_topics(topics)
        # What the Gold queries will read.
        self.feed_topics = input_topics([view for view in views if view not in self.view_pass.computed])
        each_batch = tables.STREAM_TABLE_PROPERTIES
        for topic in topics:
            store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS, each_batch)
        store.ensure_table(tables.DLQ, tables.DLQ_SCHEMA, (), each_batch)
        store.ensure_table(tables.LATE_EVENTS, tables.LATE_EVENTS_SCHEMA, (), each_batch)
        store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA, (), each_batch)
        # Max event time per topic through batch ``_through``: the watermarks' state.
        self._maxima: dict[str, datetime] = {}
        self._through: int | None = None
        self._timings: dict[str, float] = {}  # seconds per step of the current micro-batch, for its log line
        # One pool for every micro-batch: its writes run in parallel.
        self._writers = ThreadPoolExecutor(max_workers=len(topics) + 3, thread_name_prefix="ingest-write")

    def watermarks(self, batch_id: int) -> dict[str, datetime | None]:
        """Per topic: max event time of the batches before ``batch_id``, minus the delay."""
        if self._through != batch_id - 1:  # first batch of this run, or a replay: read the state
            rows = self.store.select_arrow(
                tables.INGEST_BATCHES, ["topic", "max_event_time"],
                f"query = '{QUERY}' AND batch_id < {batch_id} AND max_event_time IS NOT NULL",
            )
            latest = rows.group_by("topic").aggregate([("max_event_time", "max")]).to_pylist()
            self._maxima = {row["topic"]: row["max_event_time_max"] for row in latest}
        delay = self.settings.watermark_delay
        return {topic: (self._maxima[topic] - delay if topic in self._maxima else None) for topic in self.topics}

    def _batch_values(self, batch_id: int, watermarks: dict[str, datetime | None]) -> dict[str, pa.Array]:
        """What every row of a topic gets from its micro-batch."""
        return {
            "topic": pa.array(self.topics, pa.string()),
            "batch_id": pa.array([batch_id] * len(self.topics), pa.int64()),
            "watermark_at_arrival": pa.array([watermarks[topic] for topic in self.topics], pa.timestamp("us", "UTC")),
        }

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        # What current_timestamp() gives the micro-batch; Spark would compile it into the plan's
        # code anew each micro-batch.
        at = batch_time(self.settings.checkpoints_dir / QUERY, batch_id)
        watermarks = self.watermarks(batch_id)
        valid = ~F.col("rejected")
        batch = with_batch_values(batch, pa.table(self._batch_values(batch_id, watermarks)), on="topic")
        late = valid & F.coalesce(F.col("event_time") <= F.col("watermark_at_arrival"), F.lit(False))
        batch = batch.withColumn("is_late", late).persist()  # its writes each read it
        started = time.perf_counter()
        try:
            summary = batch.groupBy("topic").agg(
                F.count(F.when(valid, 1)).alias("silver_rows"),
                F.count(F.when(~valid, 1)).alias("dlq_rows"),
                F.count(F.when(F.col("is_late"), 1)).alias("late_rows"),
                F.max(F.when(valid, F.unix_micros("event_time"))).alias("max_event_micros"),
            ).collect()
            counts = {row["topic"]: {**row.asDict(), "max_event_time": _instant(row["max_event_micros"])}
                      for row in summary}
            self._timings = {"read, parse, dedup": time.perf_counter() - started}
            if counts:
                tasks = self._write_tasks(batch, counts)
                self._write(batch.sparkSession, batch.coalesce(tasks), tasks, batch_id, at, counts, watermarks)
        finally:
            batch.unpersist()
        self._done(batch_id, counts)

    def _done(self, batch_id: int, counts: dict[str, dict]) -> None:
        """The state the next micro-batch starts from: each topic's max event time."""
        for topic, count in counts.items():
            if count["max_event_time"] is not None:
                self._maxima[topic] = max(count["max_event_time"], self._maxima.get(topic, count["max_event_time"]))
        self._through = batch_id

    @staticmethod
    def _write_tasks(batch: DataFrame, counts: dict[str, dict]) -> int:
        """As many write tasks as the rows need: a small micro-batch writes one file per table
        instead of one per shuffle partition (fewer files, less fixed cost per task)."""
        rows = sum(count["silver_rows"] + count["dlq_rows"] for count in counts.values())
        cores = batch.sparkSession.sparkContext.defaultParallelism
        return max(1, min(cores, rows // ROWS_PER_WRITE_TASK))

    def _write(self, spark: SparkSession, batch: DataFrame, tasks: int, batch_id: int, at: datetime,
               counts: dict[str, dict], watermarks: dict) -> None:
        """Every write of the micro-batch, then its accounting row."""
        txn = Txn(QUERY, batch_id)
        feed_topics = [t for t in self.feed_topics if counts.get(t, {}).get("silver_rows")]
        appends = {tables.silver(topic): self._silver_rows(batch, topic)
                   for topic, count in sorted(counts.items()) if count["silver_rows"]}
        if any(count["late_rows"] for count in counts.values()):
            appends[tables.LATE_EVENTS] = self._late_rows(batch)
        # Each write is a small Spark job over the cached batch with a fixed cost of its own;
        # submitted together, their start-up overlaps instead of adding up.
        writes = {name: partial(self.store.append, name, rows, txn) for name, rows in appends.items()}
        if any(count["dlq_rows"] for count in counts.values()):  # its plan too is built beside the others
            writes[tables.DLQ] = partial(self._append_dlq, batch, txn)
        writes["feeds"] = partial(self._write_feeds, batch, tasks, batch_id, feed_topics)
        delay = self.settings.watermark_delay
        after = {topic: max(filter(None, (counts.get(topic, {}).get("max_event_time"), self._maxima.get(topic))),
                            default=None) for topic in self.topics}
        micro_batch = MicroBatch(
            spark=spark, txn=txn, at=at,
            fed={topic for topic, count in counts.items()
                 if count["silver_rows"] > (0 if topic in STATE_TOPICS else count["late_rows"])},
            events=lambda topic: view_events(batch, topic),
            watermarks=watermarks,
            watermarks_after={topic: latest - delay if latest else None for topic, latest in after.items()})
        writes |= self.view_pass.writes(micro_batch)
        running = [self._writers.submit(self._timed, name, write) for name, write in writes.items()]
        wait(running)  # all of them, even when one fails: none may still write once the stream stops
        for done in running:
            done.result()
        now = datetime.now(timezone.utc)
        accounting = [
            {"query": QUERY, "batch_id": batch_id, "topic": topic, "watermark": watermarks.get(topic),
             "processed_at": now,
             **{key: count.get(key) for key in ("bronze_rows", "silver_rows", "dlq_rows", "late_rows",
                                                 "max_event_time")}}
            for topic, count in sorted(counts.items())
        ]
        # Last: a batch's accounting row means all of its writes are committed.
        self._timed("accounting", partial(
            self.store.append, tables.INGEST_BATCHES,
            pa.Table.from_pylist(accounting, schema=tables.arrow_schema(tables.INGEST_BATCHES_SCHEMA)), txn))
        log.info("ingest batch %d: %s rows; seconds: %s", batch_id,
                 {t: c["silver_rows"] + c["dlq_rows"] for t, c in counts.items()},
                 ", ".join(f"{name} {seconds:.2f}" for name, seconds in self._timings.items()))

    def _timed(self, name: str, write: Callable[[], object]) -> None:
        """Run one write, keeping its wall time for the micro-batch's log line (where time goes)."""
        started = time.perf_counter()
        try:
            write()
        finally:
            self._timings[name] = time.perf_counter() - started

    @staticmethod
    def _silver_rows(batch: DataFrame, topic: str) -> DataFrame:
        record = TOPICS[topic].schema.fieldNames()
        extra = [name for name in tables.silver_schema(topic).fieldNames() if name not in record and name != "date"]
        return batch.where((F.col("topic") == topic) & ~F.col("rejected")).select(
            f"{record_column(topic)}.*", *extra, F.to_date("event_time").alias("date")
        )

    def _append_dlq(self, batch: DataFrame, txn: Txn) -> None:
        """The micro-batch's rejected lines into the DLQ, their reasons named here, for these lines only."""
        rejected = with_reason(batch.where("rejected"), max_line_bytes=self.settings.max_line_bytes)
        self.store.append(tables.DLQ, rejected.select("topic", dlq_raw().alias("raw"), "reason", "source",
                                                      "ingested_at", "batch_id"), txn)

    @staticmethod
    def _late_rows(batch: DataFrame) -> DataFrame:
        behind = F.unix_micros("watermark_at_arrival") - F.unix_micros("event_time")
        return batch.where("is_late").select(
            "topic", "event_id", "event_time", "arrived_at", "watermark_at_arrival",
            (behind / 1e6).alias("lateness_seconds"), "batch_id",
        )

    def _write_feeds(self, batch: DataFrame, tasks: int, batch_id: int, topics: list[str]) -> None:
        """One Parquet file per feed topic and batch, named by batch id: a replay replaces it. A
        topic a dimension reads gets its late events too (they are still listed in late_events).
        A batch in one task writes one file per topic as it is; a larger one is shuffled by topic."""
        if not topics:
            return
        staging = self.settings.feeds_dir / "_staging" / f"{batch_id:012d}"
        shutil.rmtree(staging, ignore_errors=True)
        on_time = batch.where(F.col("topic").isin(*topics) & ~F.col("rejected") & _wanted())
        columns = [field.name for field in feed_schema().fields]
        rows = on_time.select("topic", *columns)
        (rows if tasks == 1 else rows.repartition("topic")).write.partitionBy("topic").parquet(str(staging))
        for topic in topics:
            files = sorted((staging / f"topic={topic}").glob("*.parquet"))
            if not files:
                continue
            folder = self.settings.feeds_dir / topic
            folder.mkdir(parents=True, exist_ok=True)
            os.replace(files[0], folder / f"{batch_id:012d}.parquet")  # one file: one task per topic
        shutil.rmtree(staging, ignore_errors=True)


__all__ = ["FEED_TOPICS", "QUERY", "STATE_TOPICS", "IngestBatch", "feed_schema", "parsed_events", "record_column"]
