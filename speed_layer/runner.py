"""The stream runner: all speed-layer queries in one Spark application.

``available_now`` processes everything landed so far and returns: first the Bronze and ingest
queries (in small micro-batches, so watermarks advance between them: see
:func:`speed_layer.sources.landing_admission`), then the Gold queries of the views outside
ingest's pass over the feeds ingest wrote (the dimensions they look up are in the pass, so every
change landed before an order is applied when it is enriched). Otherwise all queries run
continuously on a processing-time trigger, each micro-batch taking what is waiting, until
SIGTERM/SIGINT, which stops them after their current micro-batch. With the Airflow connection
``lambdalake_airflow`` in its environment, the runner also tells Airflow when a day is complete
(:mod:`speed_layer.announce`).
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from include.config import Settings
from include.disk_space import as_no_space_left
from include.doctor import torn_checkpoint_logs
from include.lakehouse import LakehouseStore, open_reader, open_store
from include.spark import LOCAL_MASTER, get_spark
from include.views import speed_trigger_intervals
from speed_layer import bronze, ingest
from speed_layer.announce import DayCompleteAnnouncer
from speed_layer.compaction import StreamCompaction
from speed_layer.gold import gold_writers, runs_no_data_batches, trigger_intervals
from speed_layer.metrics import StreamMetrics
from speed_layer.stream_progress import StreamProgress
from speed_layer.sources import open_source

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

log = logging.getLogger(__name__)
HEARTBEAT_SECONDS = 2.0
GRACEFUL_STOP_SECONDS = 120
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
CACHE_COMPRESSED = "spark.sql.inMemoryColumnarStorage.compressed"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"


class StreamFailed(RuntimeError):
    """A streaming query died; the message names it and says why."""


def ingest_writers(spark: SparkSession, settings: Settings, store: LakehouseStore,
                   available_now: bool = False) -> dict[str, DataStreamWriter]:
    """The Bronze query (every line) and the ingest query (Silver, DLQ, late_events, the views
    of ingest's pass, feeds), each reading the source with a source of its own."""
    raw = open_source(spark, settings, available_now)
    topics = tuple(raw)
    events = ingest.parsed_events(raw, settings)
    lines = bronze.with_event_date(raw).writeStream.queryName(bronze.QUERY)
    return {
        ingest.QUERY: events.writeStream.queryName(ingest.QUERY)
        .foreachBatch(ingest.IngestBatch(settings, store, topics, continuous=not available_now)),
        bronze.QUERY: lines.foreachBatch(bronze.BronzeBatch(store, topics)),
    }


def query_trigger_intervals(settings: Settings) -> dict[str, timedelta]:
    """Each query's micro-batch interval when running continuously."""
    bronze_interval = settings.bronze_trigger_interval or max(settings.trigger_interval, bronze.DEFAULT_TRIGGER)
    return {bronze.QUERY: bronze_interval, ingest.QUERY: settings.trigger_interval, **trigger_intervals(settings)}


def stream_shuffle_partitions(spark: SparkSession, settings: Settings) -> int:
    """The stream's queries' shuffle and state partitions (a checkpoint keeps those it began with).

    On one machine, one per task slot: each stateful stage's task costs a fixed amount, and the
    dozen queries run side by side on the same cores (measured: ``benchmarks/DECISIONS.md``)."""
    if settings.stream_shuffle_partitions:
        return settings.stream_shuffle_partitions
    if LOCAL_MASTER.fullmatch(settings.spark_master):
        return spark.sparkContext.defaultParallelism
    return settings.shuffle_partitions  # a cluster's executors may not have registered yet


def _start(spark: SparkSession, settings: Settings, writer: DataStreamWriter, name: str,
           available_now: bool) -> StreamingQuery:
    checkpoint = settings.checkpoints_dir / name
    remove_torn_writes(checkpoint)
    spark.conf.set(NO_DATA_BATCHES, str(runs_no_data_batches(name)).lower())
    spark.conf.set(SHUFFLE_PARTITIONS, str(stream_shuffle_partitions(spark, settings)))
    # Ingest caches each micro-batch for the seconds its writes read it, and compressing that cache
    # cost as much as building it. The other queries start with Spark's default again.
    spark.conf.set(CACHE_COMPRESSED, str(name != ingest.QUERY).lower())
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        interval = query_trigger_intervals(settings)[name]
        writer = writer.trigger(processingTime=f"{interval.total_seconds()} seconds")
    query = writer.option("checkpointLocation", str(checkpoint)).start()
    _take_settings_now(query)
    return query


def remove_torn_writes(checkpoint: Path) -> None:
    """Delete what a killed run left half-written in a query's offset and commit logs.

    Spark writes each log file under a temporary name (``.<batch>.<uuid>.tmp``) and renames it;
    a ``kill -9`` in between leaves the temporary file, and Spark 4.2 then refuses to start a
    query that has committed no batch yet ("should be empty on batch 0"). Only this stream
    writes its checkpoints, and it is not running yet."""
    for log_dir in (checkpoint / "offsets", checkpoint / "commits"):
        for leftover in [*log_dir.glob(".*.tmp"), *log_dir.glob(".*.tmp.crc")]:
            log.warning("removing %s, left half-written by a run that was killed", leftover)
            leftover.unlink(missing_ok=True)


def _take_settings_now(query: StreamingQuery) -> None:
    """Make the query's copy of the session now, with the settings just set (Spark makes it
    lazily, maybe after the next query's settings); Spark has no public hook for it."""
    query._jsq.streamingQuery().sparkSessionForStream().sessionState()  # noqa: SLF001


def _finished_batch(query: StreamingQuery) -> int:
    progress = query.lastProgress
    return progress["batchId"] if progress else -1


def _stop_gracefully(queries: list[StreamingQuery]) -> None:
    """Let the micro-batch each query is in finish, then stop it.

    Spark has no "stop after this batch"; a batch that starts in the instant between is
    interrupted, which is safe: its writes carry transaction ids and it is replayed on restart.
    """
    in_flight = {
        query.id: _finished_batch(query) for query in queries if query.isActive and query.status["isTriggerActive"]
    }
    deadline = time.monotonic() + GRACEFUL_STOP_SECONDS
    for query in queries:
        if query.id in in_flight:
            while query.isActive and _finished_batch(query) <= in_flight[query.id] and time.monotonic() < deadline:
                time.sleep(0.05)
        query.stop()


def _supervise(queries: list[StreamingQuery], metrics: StreamMetrics, stop: threading.Event,
               tick: Callable[[], None] | None = None, checkpoints_dir: Path | None = None) -> None:
    """Wait until the queries end (or ``stop``), keeping metrics, the heartbeat and ``tick``
    (progress) fresh. ``checkpoints_dir``: where a failed query's full disk is told to be when
    nothing more precise is known (Spark's own checkpoint writes name no file)."""
    stopped_by_us = False
    try:
        while any(query.isActive for query in queries):
            if any(not query.isActive and query.exception() is not None for query in queries):
                break  # one query failed: the stream fails now (below), not once the others end
            if stop.is_set():
                log.info("stop requested: finishing the current micro-batches")
                _stop_gracefully(queries)
                stopped_by_us = True
                break
            try:
                metrics.flush()
                metrics.write_heartbeat("running")
            except Exception as error:
                full = as_no_space_left(error, metrics.heartbeat_path)
                if full is None:
                    raise
                _stop_gracefully([query for query in queries if query.isActive])
                raise StreamFailed(f"stream metrics failed: {full}") from error
            if tick:
                tick()
            stop.wait(HEARTBEAT_SECONDS)
    finally:
        for query in queries:
            error = query.exception()
            if error is None:
                continue
            if stopped_by_us:  # an interruption we caused; the batch replays on restart
                log.warning("query '%s' interrupted while stopping: %s", query.name, _root_cause(str(error)))
                continue
            _stop_gracefully([q for q in queries if q.isActive])
            where = checkpoints_dir / query.name if checkpoints_dir else f"the checkpoint of '{query.name}'"
            full = as_no_space_left(str(error), where)
            raise StreamFailed(f"streaming query '{query.name}' failed: {full or _root_cause(str(error))}")


def _deliver_queued_events(spark: SparkSession) -> None:
    """Spark hands query progress to listeners on a queue of its own: a query's last micro-batch
    may still be queued when the query ends, and would miss ``stream_metrics``."""
    try:
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()
    except Exception as error:  # noqa: BLE001 - a JVM going down loses only metrics
        log.warning("stream metrics may miss the last micro-batches: %s", _root_cause(str(error)))


def _root_cause(message: str) -> str:
    """The innermost 'SomeError: message' line of a (Python-in-JVM) traceback."""
    causes = [
        line.strip() for line in message.splitlines()
        if re.match(r"^\s*[\w.]+(Error|Exception|Invalid|Conflict)\b[^:]*: ", line)
    ]
    return causes[-1] if causes else message.strip().splitlines()[0]


def run_stream(
    settings: Settings,
    available_now: bool = False,
    stop: threading.Event | None = None,
    on_started: Callable[[SparkSession], None] | None = None,
    show_progress: bool = False,
) -> LakehouseStore:
    """Run the speed layer; returns the store it wrote to. Raises :class:`StreamFailed`.
    ``on_started`` gets the run's own Spark session (its ``streams`` are the queries) before they
    start. ``show_progress`` (with ``available_now``): the ingest phase's progress on stderr."""
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
    # A session of its own: the queries' settings (see _start) leave the caller's session, which
    # the demo's batch layer shares, as it was.
    spark = get_spark(settings, app_name="lambdalake-stream").newSession()
    store = open_store(settings, spark)
    metrics = StreamMetrics(open_reader(settings), settings.run_dir)  # an ops table: delta-rs
    spark.streams.addListener(metrics)
    announcer = DayCompleteAnnouncer.from_env(settings, store)
    checkpoints = settings.checkpoints_dir
    finished = False
    try:
        ingesting = ingest_writers(spark, settings, store, available_now)
        gold = gold_writers(spark, settings, store)
        metrics.write_heartbeat("starting")
        if on_started:
            on_started(spark)
        if available_now:
            progress = StreamProgress(settings, metrics) if show_progress else None
            try:
                _supervise([_start(spark, settings, w, name, True) for name, w in ingesting.items()], metrics, stop,
                           progress.tick if progress else None, checkpoints)
            finally:
                if progress:
                    progress.close()
            if not stop.is_set():
                _supervise([_start(spark, settings, w, name, True) for name, w in gold.items()], metrics, stop,
                           checkpoints_dir=checkpoints)
            if announcer and not stop.is_set():
                announcer.check_safely()
        else:
            intervals = speed_trigger_intervals(settings)
            metrics.view_refresh_seconds = {view: interval.total_seconds() for view, interval in intervals.items()}
            writers = {**ingesting, **gold}
            queries = [_start(spark, settings, w, name, False) for name, w in writers.items()]
            if announcer:
                threading.Thread(target=announcer.run, args=(stop,), name="day-complete-events", daemon=True).start()
            ended = threading.Event()  # the queries' end: a compaction under way finishes first
            compacting = threading.Thread(target=StreamCompaction(settings, store).run, args=(ended,),
                                          name="compaction", daemon=True)
            if settings.stream_compaction_interval:
                compacting.start()
            try:
                _supervise(queries, metrics, stop, checkpoints_dir=checkpoints)
            finally:
                ended.set()
                if compacting.is_alive():
                    compacting.join()
        finished = True
    except StreamFailed as failed:
        # A torn checkpoint file; a full disk's message says what to do already.
        if as_no_space_left(str(failed), checkpoints) is not None:
            raise
        torn = torn_checkpoint_logs(settings.checkpoints_dir)
        if torn or str(settings.checkpoints_dir) in str(failed):
            named = f"; torn checkpoint files: {', '.join(map(str, torn))}" if torn else ""
            doctor = f"`lambdalake doctor --home {settings.home}` says what to do"
            raise StreamFailed(f"{failed}{named} ({doctor})") from None
        raise
    except Exception as error:  # a full disk where no query saw it: starting a query, the heartbeat
        full = as_no_space_left(error, settings.home)
        if full is None:
            raise
        raise StreamFailed(str(full)) from error
    finally:
        _deliver_queued_events(spark)
        try:
            metrics.flush()
            metrics.write_heartbeat("stopped")
        except Exception as error:
            full = as_no_space_left(error, settings.run_dir)
            if finished or full is None:
                raise
            # The stream failed already: that error is the news, not this one.
            log.warning("stream metrics and heartbeat not saved: %s", full)
        spark.streams.removeListener(metrics)
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return store
