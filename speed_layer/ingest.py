"""The ingest query: landed lines into Silver, the DLQ and late_events, and the Gold feeds.

With the Spark pass, everything runs on Spark's executors. Per micro-batch: each topic's lines
are parsed with the shared parser; Spark's state store drops copies of an event already ingested
within the dedup window (:func:`include.views.rules.first_copies`); then, in ``foreachBatch``,
lateness is flagged against each topic's watermark, and the executors write Silver, the DLQ,
late_events and the on-time events the Gold queries read (``feeds/<topic>/``). With the pass on
the driver, ``foreachBatch`` gets the lines as they landed and does all of that on the driver
(:mod:`speed_layer.driver_pass`). Either way each table's commit has the transaction id
``(speed_ingest, batch_id)``: a micro-batch replayed after a crash (even ``kill -9``) commits
nothing twice, and computes the same rows, because its watermarks come from the accounting of
earlier batches and the dedup state from Spark's checkpoint or Silver.

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
from functools import cache, lru_cache, partial
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

from include import tables
from include.checkpoints import batch_time
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.line_parser import topic_parser
from include.parsing import DEFAULT_MAX_LINE_BYTES, bronze_event_date, parse_topic, with_reason
from include.registry import input_topics
from include.schemas import TOPICS
from include.spark import with_batch_values
from include.views import VIEWS, speed_trigger_intervals, speed_views
from include.views.rules import first_copies
from speed_layer import driver_pass
from speed_layer.dedup import SeenEvents
from speed_layer.freed_memory import trimmer
from speed_layer.recent import RecentEvents, horizons
from speed_layer.sources import RAW_COLUMNS
from speed_layer.view_pass import STATE_TOPICS, MicroBatch, ViewPass

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)

QUERY = "speed_ingest"
# Topics whose on-time events the Gold queries read; late ones too for topics a dimension reads.
FEED_TOPICS = input_topics(VIEWS)
VIEW_TIMES = ("event_time", "arrived_at", "ingested_at")  # the views' events' columns besides their fields
DLQ_RAW_LIMIT = 8192
LINE_COLUMNS = ["value", "bronze_date", "reason", "dlq_raw"]  # on the driver, what only Bronze and the DLQ read
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


def collect_view_events(batch: DataFrame, topics: list[str]) -> dict[str, pa.Table]:
    """:func:`view_events` of several topics on the driver, in one Spark job."""
    columns = [record_column(topic) for topic in topics]
    rows = batch.where(F.col("topic").isin(*topics) & ~F.col("rejected") & _wanted()).select(
        "topic", *columns, *VIEW_TIMES).toArrow()
    return split_view_events(rows, topics)


def split_view_events(rows: pa.Table, topics: list[str]) -> dict[str, pa.Table]:
    """Per topic, its rows of an Arrow micro-batch of wanted events as :func:`view_events` gives them."""
    collected = {}
    for topic in topics:
        record = [field.name for field in rows.schema.field(record_column(topic)).type]
        times = [name for name in VIEW_TIMES if name not in record]
        collected[topic] = driver_pass.records(rows, topic, record_column(topic)).select([*record, *times])
    return collected


def wanted_arrow(rows: pa.Table) -> pa.Table:
    """:func:`_wanted` valid rows of an Arrow micro-batch."""
    keep = pc.and_(pc.invert(rows["rejected"]),
                   pc.or_(pc.invert(rows["is_late"].fill_null(False)), pc.is_in(rows["topic"], pa.array(STATE_TOPICS))))
    return rows.filter(keep)


def parsed_events(raw: dict[str, DataFrame], settings: Settings) -> DataFrame:
    """Every topic's lines as one stream. With the pass on the driver, as they are: the driver
    parses them (:func:`parse_on_driver`) and drops copies (:mod:`speed_layer.dedup`), so the
    query keeps no state and runs no parser. Else parsed, first copies only (rejected lines all
    pass)."""
    if settings.pass_on_driver:
        return _union([stream.select(*RAW_COLUMNS) for stream in raw.values()])
    events = spark_parsed(raw, record_topics(tuple(raw)), keep_lines=False, max_line_bytes=settings.max_line_bytes)
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


def spark_parsed(raw: dict[str, DataFrame], columns: tuple[str, ...], keep_lines: bool,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """Lines of each topic parsed by the shared parser, as one frame: a record column per topic
    of ``columns``. With ``keep_lines`` (the driver pass) every line keeps its bytes and gets
    Bronze's event date; else only a rejected line's bytes go further (into the DLQ), not a valid
    one's across the dedup's shuffle and cache."""
    parts = []
    for topic, stream in raw.items():
        application = stream.sparkSession.sparkContext.applicationId
        parsed = parse_topic(stream, topic, max_line_bytes)
        parts.append(parsed.select(*_parsed_columns(topic, columns, keep_lines, application)))
    return _union(parts)


@lru_cache(maxsize=64)
def _parsed_columns(topic: str, columns: tuple[str, ...], keep_lines: bool, application: str) -> list[Column]:
    """:func:`spark_parsed`'s columns of one topic, built once per Spark application (each is a
    call into the JVM, and the driver pass parses a few lines every micro-batch)."""
    records = [
        (F.col("record") if other == topic else F.lit(None).cast(tables.nullable(TOPICS[other].schema)))
        .alias(record_column(other))
        for other in columns
    ]
    raw_line = F.col("value") if keep_lines else F.when(F.col("rejected"), F.col("value")).alias("value")
    # Bronze's date: the event date, or where the parser found none, read cheaply (the Bronze query's rule).
    bronze = [F.coalesce("event_date", bronze_event_date(topic)).alias("bronze_date")] if keep_lines else []
    return ["topic", raw_line, "source", "arrived_at", "rejected", "event_id", "event_time", *bronze, *records]


def _union(parts: list[DataFrame]) -> DataFrame:
    events = parts[0]
    for part in parts[1:]:
        events = events.unionByName(part)
    return events


def driver_schema(columns: tuple[str, ...]) -> pa.Schema:
    """A micro-batch parsed on the driver (:func:`spark_parsed` with ``keep_lines``), as Arrow."""
    return pa.schema([
        ("topic", pa.string()), ("value", pa.binary()), ("source", pa.string()),
        ("arrived_at", pa.timestamp("us", "UTC")), ("rejected", pa.bool_()), ("event_id", pa.string()),
        ("event_time", pa.timestamp("us", "UTC")), ("bronze_date", pa.date32()),
        ("reason", pa.string()), ("dlq_raw", pa.string()),  # a rejected line's, for the DLQ
        *[(record_column(topic), topic_parser(topic, DEFAULT_MAX_LINE_BYTES).record_type) for topic in columns],
    ])


def parse_on_driver(lines: pa.Table, spark: SparkSession, columns: tuple[str, ...], max_line_bytes: int) -> pa.Table:
    """A micro-batch's lines (``topic``, ``value``, ``source``, ``arrived_at``) parsed as
    :func:`spark_parsed` parses them, with ``reason`` and ``dlq_raw`` for a rejected line. The
    driver's parser (:mod:`include.line_parser`) decides the lines it is sure of, accepted or
    rejected; the shared parser the others, in one small Spark job that also names the reasons,
    so every verdict and every reason is the shared parser's."""
    schema = driver_schema(columns)
    decided, doubtful = [], []
    for topic in pc.unique(lines["topic"]).to_pylist():
        part = lines.filter(pc.equal(lines["topic"], topic))
        parsed = topic_parser(topic, max_line_bytes).parse(part["value"])
        doubtful.append(part.filter(pc.invert(pc.or_(parsed.accepted, parsed.rejected))))
        accepted, rejected = part.filter(parsed.accepted), part.filter(parsed.rejected)
        decided.append(_decided(accepted, topic, columns, schema, {
            "rejected": pa.repeat(pa.scalar(False), accepted.num_rows), "event_id": parsed.events["event_id"],
            "event_time": parsed.events["event_time"], "bronze_date": parsed.events["event_date"],
            "record": parsed.events["record"]}))
        decided.append(_decided(rejected, topic, columns, schema, {
            "rejected": pa.repeat(pa.scalar(True), rejected.num_rows),
            "bronze_date": parsed.rejections["bronze_date"], "reason": parsed.rejections["reason"],
            "dlq_raw": pa.array([dlq_text(value) for value in rejected["value"].to_pylist()], pa.string())}))
    rest = pa.concat_tables(doubtful) if doubtful else lines.slice(0, 0)
    if rest.num_rows:
        frame = spark.createDataFrame(rest)
        by_topic = {topic: frame.where(F.col("topic") == topic) for topic in pc.unique(rest["topic"]).to_pylist()}
        spark_decided = with_reason(spark_parsed(by_topic, columns, keep_lines=True, max_line_bytes=max_line_bytes),
                                    max_line_bytes=max_line_bytes)
        spark_decided = spark_decided.withColumn("dlq_raw", F.when(F.col("rejected"), dlq_raw()))
        decided.append(spark_decided.toArrow().select(schema.names).cast(schema))
    return pa.concat_tables(decided) if decided else schema.empty_table()


def _decided(lines: pa.Table, topic: str, columns: tuple[str, ...], schema: pa.Schema, values: dict) -> pa.Table:
    """Lines of ``topic`` the driver decided, in :func:`driver_schema`: ``values`` (``record``
    being the topic's record column), every other column NULL."""
    def column(name: str) -> pa.Array:
        if name in RAW_COLUMNS:
            return lines[name]
        key = "record" if name == record_column(topic) else name
        return values[key] if key in values else pa.nulls(lines.num_rows, schema.field(name).type)
    return pa.table({name: column(name) for name in schema.names}).cast(schema)


def dlq_text(line: bytes) -> str:
    """:func:`dlq_raw` of an ASCII line (the driver's parser rejects no other)."""
    text = line.decode("ascii")
    if len(line) > DLQ_RAW_LIMIT:
        return f"{text[:DLQ_RAW_LIMIT]}… [{len(line)} bytes; full line in bronze]"
    return text


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
        on_driver = settings.pass_on_driver  # speed_layer/driver_pass.py
        self.view_pass = ViewPass(settings, store, views, speed_trigger_intervals(settings) if continuous else None)
        self.record_topics = record_topics(topics)
        # What the Gold queries will read.
        self.feed_topics = input_topics([view for view in views if view not in self.view_pass.computed])
        each_batch = tables.STREAM_TABLE_PROPERTIES
        for topic in topics:
            store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS, each_batch)
        if on_driver:  # ingest writes Bronze
            for topic in topics:
                store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS, each_batch)
        store.ensure_table(tables.DLQ, tables.DLQ_SCHEMA, (), each_batch)
        store.ensure_table(tables.LATE_EVENTS, tables.LATE_EVENTS_SCHEMA, (), each_batch)
        store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA, (), each_batch)
        # Max event time per topic through batch ``_through``: the watermarks' state.
        self._maxima: dict[str, datetime] = {}
        self._through: int | None = None
        self._timings: dict[str, float] = {}  # seconds per step of the current micro-batch, for its log line
        # The on-time events the pass's steps read again (alerts' look-back, open windows), in memory.
        self.recent = RecentEvents(store, horizons(self.view_pass.computed))
        again = set(self.recent.horizons) | {view.speed.lookback.topic for view in self.view_pass.computed
                                             if view.speed.lookback}
        if again & set(STATE_TOPICS):  # those topics' view events include late ones
            raise ValueError(f"a dimension reads {sorted(again & set(STATE_TOPICS))}: "
                             "a step cannot read its events again as recent on-time events")
        # The dedup's state, on the driver with the pass (else in Spark's state store).
        self.seen = SeenEvents(store, topics, settings.dedup_window) if on_driver else None
        # One pool for every micro-batch: its writes run in parallel.
        self._writers = ThreadPoolExecutor(max_workers=len(topics) + 3, thread_name_prefix="ingest-write")
        self._trim = trimmer()  # what the micro-batches freed, back to the system now and then

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
        if self.seen is not None:  # the pass on the driver: the micro-batch's lines there, in one Spark job
            started = time.perf_counter()
            lines = batch.toArrow()
            self.ingest_lines(lines, batch_id, at, batch.sparkSession, time.perf_counter() - started)
            return
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
            recent = {}
            if counts:
                tasks = self._write_tasks(batch, counts)
                recent = self._write(batch.sparkSession, batch.coalesce(tasks), tasks, batch_id, at, counts,
                                     watermarks)
        finally:
            batch.unpersist()
        self._done(batch_id, counts, recent)

    def ingest_lines(self, lines: pa.Table, batch_id: int, at: datetime, spark: SparkSession,
                     read_seconds: float = 0.0) -> None:
        """A micro-batch of landed lines (``topic``, ``value``, ``source``, ``arrived_at``) through
        the pass on the driver; ``at`` is the micro-batch's time (``ingested_at``), the same on a replay."""
        watermarks = self.watermarks(batch_id)
        values = self._batch_values(batch_id, watermarks)
        values["ingested_at"] = pa.array([at] * len(self.topics), pa.timestamp("us", "UTC"))
        started = time.perf_counter()
        raw = self._flagged(parse_on_driver(lines, spark, self.record_topics, self.settings.max_line_bytes),
                            pa.table(values))
        parsed = time.perf_counter()
        arrow = self.seen.first_copies(raw, batch_id).drop_columns(LINE_COLUMNS)
        counts = driver_pass.counts(arrow)
        for row in raw.group_by("topic").aggregate([("topic", "count")]).to_pylist():  # all copies too
            counts.setdefault(row["topic"], {"silver_rows": 0, "dlq_rows": 0, "late_rows": 0,
                                             "max_event_time": None})["bronze_rows"] = row["topic_count"]
        self._timings = {"read": read_seconds, "parse": parsed - started, "dedup": time.perf_counter() - parsed}
        recent = self._write(spark, None, 1, batch_id, at, counts, watermarks, arrow, raw) if counts else {}
        self.seen.keep(arrow, batch_id)
        self._done(batch_id, counts, recent)

    def _done(self, batch_id: int, counts: dict[str, dict], recent: dict[str, pa.Table]) -> None:
        """The state the next micro-batch starts from: recent events, each topic's max event time."""
        self.recent.add(batch_id, recent)
        for topic, count in counts.items():
            if count["max_event_time"] is not None:
                self._maxima[topic] = max(count["max_event_time"], self._maxima.get(topic, count["max_event_time"]))
        self._through = batch_id
        self._trim()

    @staticmethod
    def _flagged(rows: pa.Table, values: pa.Table) -> pa.Table:
        """A parsed micro-batch with its topics' batch ``values`` and ``is_late``: valid and at or
        behind its topic's watermark (the Spark pass's rule, on Arrow)."""
        at = pc.index_in(rows["topic"], value_set=values["topic"])
        for name in values.column_names[1:]:
            rows = rows.append_column(name, values[name].take(at))
        behind = pc.less_equal(rows["event_time"], rows["watermark_at_arrival"]).fill_null(False)
        return rows.append_column("is_late", pc.and_(pc.invert(rows["rejected"]), behind))

    @staticmethod
    def _write_tasks(batch: DataFrame, counts: dict[str, dict]) -> int:
        """As many write tasks as the rows need: a small micro-batch writes one file per table
        instead of one per shuffle partition (fewer files, less fixed cost per task)."""
        rows = sum(count["silver_rows"] + count["dlq_rows"] for count in counts.values())
        cores = batch.sparkSession.sparkContext.defaultParallelism
        return max(1, min(cores, rows // ROWS_PER_WRITE_TASK))

    def _write(self, spark: SparkSession, batch: DataFrame | None, tasks: int, batch_id: int, at: datetime,
               counts: dict[str, dict], watermarks: dict, arrow: pa.Table | None = None, raw: pa.Table | None = None
               ) -> dict[str, pa.Table]:
        """Every write of the micro-batch (``batch`` on Spark, or ``arrow`` and ``raw`` on the
        driver); returns its on-time events of the topics the pass reads again (:mod:`speed_layer.recent`)."""
        txn = Txn(QUERY, batch_id)
        feed_topics = [t for t in self.feed_topics if counts.get(t, {}).get("silver_rows")]
        on_driver = arrow is not None  # speed_layer/driver_pass.py
        if on_driver:
            wanted = wanted_arrow(arrow)
        appends = {
            tables.silver(topic): (driver_pass.silver_rows(arrow, topic, record_column(topic)) if on_driver
                                   else self._silver_rows(batch, topic))
            for topic, count in sorted(counts.items()) if count["silver_rows"]
        }
        if on_driver:  # Bronze, every line (no Bronze query runs)
            appends |= {tables.bronze(topic): driver_pass.bronze_rows(raw, topic)
                        for topic, count in sorted(counts.items()) if count["bronze_rows"]}
        if any(count["late_rows"] for count in counts.values()):
            appends[tables.LATE_EVENTS] = driver_pass.late_rows(arrow) if on_driver else self._late_rows(batch)
        # Each write is a small Spark job over the cached batch with a fixed cost of its own;
        # submitted together, their start-up overlaps instead of adding up.
        writes = {name: partial(self.store.append, name, rows, txn) for name, rows in appends.items()}
        if any(count["dlq_rows"] for count in counts.values()):  # its plan too is built beside the others
            writes[tables.DLQ] = partial(self._append_dlq, batch, raw, txn)
        if on_driver:
            columns = [field.name for field in feed_schema().fields]
            writes["feeds"] = partial(driver_pass.write_feeds, wanted, feed_topics, columns, self.settings.feeds_dir,
                                      batch_id)
        else:
            writes["feeds"] = partial(self._write_feeds, batch, tasks, batch_id, feed_topics)
        delay = self.settings.watermark_delay
        after = {topic: max(filter(None, (counts.get(topic, {}).get("max_event_time"), self._maxima.get(topic))),
                            default=None) for topic in self.topics}
        collected: dict[str, pa.Table] = {}

        def collect(topics: list[str]) -> dict[str, pa.Table]:  # once per topic, the first time a step asks
            missing = [topic for topic in topics if topic not in collected]
            if missing:
                collected.update(split_view_events(wanted, missing) if on_driver
                                 else collect_view_events(batch, missing))
            return {topic: collected[topic] for topic in topics}

        recent_topics = list(self.recent.horizons)
        recent = cache(lambda: self.recent.before(
            batch_id, watermarks, {topic: rows.schema for topic, rows in collect(recent_topics).items()}))
        micro_batch = MicroBatch(
            spark=spark, txn=txn, at=at,
            fed={topic for topic, count in counts.items()
                 if count["silver_rows"] > (0 if topic in STATE_TOPICS else count["late_rows"])},
            # On the driver the micro-batch is not cached: a Spark step reads its Arrow events.
            events=((lambda topic: spark.createDataFrame(collect([topic])[topic])) if on_driver
                    else (lambda topic: view_events(batch, topic))),
            collect=collect, recent=lambda topic: recent()[topic],
            lookback=lambda lookback, events, query: self.recent.moments(
                lookback, batch_id, watermarks.get(lookback.topic), events, query),
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
        fed = [topic for topic in recent_topics if topic in micro_batch.fed]
        return collect(fed) if fed else {}

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

    def _append_dlq(self, batch: DataFrame, raw: pa.Table | None, txn: Txn) -> None:
        """The micro-batch's rejected lines into the DLQ. On the driver their reasons are named
        already (:func:`parse_on_driver`); else here, for these lines only."""
        if raw is not None:
            self.store.append(tables.DLQ, driver_pass.dlq_rows(raw), txn)
            return
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
