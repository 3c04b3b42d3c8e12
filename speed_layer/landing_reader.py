"""Ingest on a local landing zone, run by the driver (the pass on the driver, ``event_source=landing``).

Spark's file source costs a Spark job, a plan and its code generation per micro-batch: on two
cores, at a micro-batch a second, that was ~0.4 of the stream's cores (benchmarks/DECISIONS.md).
Here the driver lists each topic's folder itself, reads the new files' lines as Arrow and hands
them to ingest's pass (:meth:`speed_layer.ingest.IngestBatch.ingest_lines`); Spark still parses
the few lines the driver's parser is not sure of. Kafka and the Spark pass keep Spark's sources.

It keeps Spark's file-stream checkpoint layout in ``checkpoints/speed_ingest``, so what reads a
checkpoint (the backlog, ``doctor``, maintenance, batch times) reads this one alike: a micro-batch
is first *planned* (its files in ``sources/0/N``, then ``offsets/N`` with its time), then
written (every table commit carries ``(speed_ingest, N)``), then *committed* (``commits/N``). A
restart after ``kill -9`` replays a planned, uncommitted micro-batch with the same files and
time, so it computes the same rows and commits nothing twice. Files are taken as Spark's source
takes them: oldest first by modification time, each once, bounded per topic by
:func:`speed_layer.sources.landing_admission`, files older than ``landing_max_file_age`` behind
the newest taken being ignored (and forgotten, which Spark's log never does).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from include.backlog import LandedFile, landed_files
from include.checkpoints import batch_time, committed_batch, file_source_entries
from include.config import Settings
from include.schemas import TOPIC_NAMES
from speed_layer import ingest
from speed_layer.sources import landing_admission

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from speed_layer.metrics import StreamMetrics

log = logging.getLogger(__name__)
LOG_VERSION = "v1"
COMPACT_INTERVAL = 10  # as Spark's file-source log: every 10th batch's entry holds all live ones
BATCHES_TO_RETAIN = 100  # offsets and commits kept, as Spark's minBatchesToRetain
# Characters Java's URI keeps in a path as they are (others ASCII are %-escaped, as Hadoop names files).
URI_PATH_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!~*'()/;:@&=+$,")


def file_uri(path: Path) -> str:
    """A file as Spark's ``_metadata.file_path`` and its source log name it (``file:/a/b.jsonl``)."""
    text = "".join(ch if ch in URI_PATH_SAFE or ord(ch) > 127 else "".join(f"%{b:02X}" for b in ch.encode())
                   for ch in str(path))
    return f"file:{text}"


def read_lines(files: list[LandedFile]) -> pa.Table:
    """The files' lines in ingest's raw shape (``topic``, ``value``, ``source``, ``arrived_at``),
    split as Spark's text source splits them (``\\n``, ``\\r\\n`` or ``\\r``; no final empty line)."""
    topics, values, sources, arrivals = [], [], [], []
    for file in files:
        try:
            lines = file.path.read_bytes().splitlines()
        except FileNotFoundError:
            raise FileNotFoundError(f"landing file {file.path} was planned into a micro-batch and is gone: "
                                    "a landing file must stay until the stream has committed it") from None
        values.extend(lines)
        topics.extend([file.topic] * len(lines))
        sources.extend([file_uri(file.path)] * len(lines))
        arrivals.extend([file.modified_ms * 1000] * len(lines))
    return pa.table({
        "topic": pa.array(topics, pa.string()), "value": pa.array(values, pa.binary()),
        "source": pa.array(sources, pa.string()),
        "arrived_at": pa.array(arrivals, pa.int64()).cast(pa.timestamp("us", "UTC")),
    })


@dataclass(frozen=True)
class Planned:
    batch_id: int
    at: datetime  # the micro-batch's time (ingested_at), as the offset log keeps it
    files: list[LandedFile]


class LandingLog:
    """The ingest checkpoint in Spark's file-stream layout (see the module's docstring), and the
    files it has taken, per topic, within ``max_file_age`` of the newest."""

    def __init__(self, checkpoint: Path, settings: Settings) -> None:
        self.checkpoint, self.settings = checkpoint, settings
        self.sources = checkpoint / "sources"
        self.max_age_ms = int(settings.landing_max_file_age.total_seconds() * 1000)
        # Per topic: each file taken, with the micro-batch that took it and its modification time.
        self.taken: dict[str, dict[Path, tuple[int, int]]] = {topic: {} for topic in TOPIC_NAMES}
        for path, (batch_id, modified_ms) in file_source_entries(checkpoint).items():
            self.taken.setdefault(path.parent.name, {})[path] = (batch_id, modified_ms)
        self._listed: dict[str, set[Path]] = {}  # per topic, the files its last listing found
        self._known: dict[str, dict[str, LandedFile]] = {topic: {} for topic in TOPIC_NAMES}  # and by path
        if not (checkpoint / "metadata").exists():
            _write_atomically(checkpoint / "metadata", json.dumps({"id": str(uuid.uuid4())}))

    def committed(self) -> int:
        return committed_batch(self.checkpoint)

    def replay(self) -> Planned | None:
        """The micro-batch planned after the last committed one, if a run ended before its commit
        (killed between its files' entry and its offsets, it gets its time now: it wrote nothing)."""
        batch_id = self.committed() + 1
        files = sorted((LandedFile(path.parent.name, path, modified_ms, 0)
                        for taken in self.taken.values() for path, (batch, modified_ms) in taken.items()
                        if batch == batch_id), key=lambda file: (file.topic, file.modified_ms, file.path.name))
        if (self.checkpoint / "offsets" / str(batch_id)).exists():
            return Planned(batch_id, batch_time(self.checkpoint, batch_id), files)
        if files:
            return self._write_offsets(batch_id, files, datetime.now(timezone.utc))
        return None

    def new_files(self, topic: str) -> list[LandedFile]:
        """The topic's landed files not taken yet, oldest first (too old ones left out)."""
        taken = self.taken.get(topic, {})
        oldest_kept = self._oldest_kept(topic)
        listed = landed_files(self.settings.landing_topic_dir(topic), topic, self._known.setdefault(topic, {}))
        self._listed[topic] = {file.path for file in listed}
        return [file for file in listed
                if file.path not in taken and (oldest_kept is None or file.modified_ms >= oldest_kept)]

    def _oldest_kept(self, topic: str) -> int | None:
        taken = self.taken.get(topic)
        return max(modified_ms for _, modified_ms in taken.values()) - self.max_age_ms if taken else None

    def plan(self, batch_id: int, files: list[LandedFile], at: datetime) -> Planned:
        """Record the files and time of micro-batch ``batch_id`` before it writes anything: each
        topic's in its own source log (``sources/<topic's number>/``), as Spark's one source per topic."""
        for file in files:
            self.taken.setdefault(file.topic, {})[file.path] = (batch_id, file.modified_ms)
        compact = (batch_id + 1) % COMPACT_INTERVAL == 0
        for number, topic in enumerate(TOPIC_NAMES):
            taken = self.taken.get(topic, {})
            if compact:  # every live entry: files still landed and not too old (the others cannot be read again)
                oldest_kept, listed = self._oldest_kept(topic), self._listed.get(topic)
                taken = self.taken[topic] = {
                    path: entry for path, entry in taken.items()
                    if entry[0] == batch_id or (entry[1] >= oldest_kept and (listed is None or path in listed))}
                entries = [(path, *entry) for path, entry in taken.items()]
            else:
                entries = [(file.path, batch_id, file.modified_ms) for file in files if file.topic == topic]
            source = self.sources / str(number)
            if not entries and not (compact and source.exists()):
                continue
            lines = [json.dumps({"path": file_uri(path), "timestamp": modified_ms, "batchId": batch})
                     for path, batch, modified_ms in sorted(entries, key=lambda entry: (entry[1], entry[2]))]
            _write_atomically(source / (f"{batch_id}.compact" if compact else str(batch_id)),
                              "\n".join([LOG_VERSION, *lines]))
            if compact:
                self._clean(source, batch_id)
        return self._write_offsets(batch_id, files, at)

    def _write_offsets(self, batch_id: int, files: list[LandedFile], at: datetime) -> Planned:
        at = at.replace(microsecond=at.microsecond // 1000 * 1000)  # the log keeps milliseconds: a replay's time
        millis = (at - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)
        metadata = {"batchWatermarkMs": 0, "batchTimestampMs": millis, "conf": {}}
        _write_atomically(self.checkpoint / "offsets" / str(batch_id),
                          "\n".join([LOG_VERSION, json.dumps(metadata), json.dumps({"logOffset": batch_id})]))
        return Planned(batch_id, at, files)

    def commit(self, batch_id: int) -> None:
        _write_atomically(self.checkpoint / "commits" / str(batch_id),
                          "\n".join([LOG_VERSION, json.dumps({"nextBatchWatermarkMs": 0})]))

    def _clean(self, source: Path, compacted: int) -> None:
        """Entries a compaction holds, and offsets and commits far behind, are deleted."""
        for log_file in source.iterdir():
            number = log_file.name.removesuffix(".compact")
            if number.isdigit() and int(number) < compacted:
                log_file.unlink(missing_ok=True)
        for folder in ("offsets", "commits"):
            for entry in (self.checkpoint / folder).glob("*"):
                if entry.name.isdigit() and int(entry.name) < compacted - BATCHES_TO_RETAIN:
                    entry.unlink(missing_ok=True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.parent / f".{path.name}.{uuid.uuid4()}.tmp"
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


class LandingIngest:
    """Ingest's micro-batches on the landing zone, on a thread of the driver; it answers as a
    Spark ``StreamingQuery`` does to the runner (``isActive``, ``exception()``, ``stop()``, …).

    Continuously, a micro-batch starts at each tick of the trigger interval when files wait (at
    once when the previous one overran); with ``available_now``, the files landed when it started
    are taken in micro-batches and it ends."""

    def __init__(self, spark: SparkSession, settings: Settings, batch: ingest.IngestBatch,
                 metrics: StreamMetrics) -> None:
        self.spark, self.settings, self.batch, self.metrics = spark, settings, batch, metrics
        self.name, self.id, self.run_id = ingest.QUERY, str(uuid.uuid4()), str(uuid.uuid4())
        self.lastProgress: dict[str, Any] | None = None
        self._stop, self._error = threading.Event(), None
        self._in_batch = False
        self._thread: threading.Thread | None = None

    def start(self, available_now: bool) -> LandingIngest:
        self.metrics.started(self.name, self.id)
        self._thread = threading.Thread(target=self._run, args=(available_now,), name="landing-ingest", daemon=True)
        self._thread.start()
        return self

    @property
    def isActive(self) -> bool:  # noqa: N802 - StreamingQuery's name
        return self._thread is not None and self._thread.is_alive()

    @property
    def status(self) -> dict[str, Any]:
        return {"isTriggerActive": self._in_batch}

    def exception(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        """Stop after the current micro-batch (a micro-batch is never cut short here)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self, available_now: bool) -> None:
        interval = self.settings.trigger_interval.total_seconds()
        admission = landing_admission(self.settings, available_now)
        try:
            log_ = LandingLog(self.settings.checkpoints_dir / self.name, self.settings)
            snapshot = ({topic: {file.path for file in log_.new_files(topic)} for topic in TOPIC_NAMES}
                        if available_now else None)
            planned = log_.replay()
            while not self._stop.is_set():
                tick = time.time()
                if planned is None:
                    files = [file for topic in TOPIC_NAMES for file in _admitted(log_.new_files(topic), admission)
                             if snapshot is None or file.path in snapshot[topic]]
                    if files:
                        planned = log_.plan(log_.committed() + 1, files, datetime.now(timezone.utc))
                    elif available_now:
                        break
                if planned is not None:
                    self._run_batch(log_, planned, tick)
                    planned = None
                if not available_now:  # the next tick of the interval, or at once after an overrun
                    self._stop.wait(max(0.0, (tick // interval + 1) * interval - time.time()))
        except BaseException as error:  # noqa: BLE001 - the runner reports it, as for a Spark query
            self._error = error
            log.error("ingest failed: %s", error)
        finally:
            self.metrics.terminated(self.id, str(self._error) if self._error else None)

    def _run_batch(self, log_: LandingLog, planned: Planned, tick: float) -> None:
        self._in_batch = True
        try:
            started = time.perf_counter()
            lines = read_lines(planned.files)
            read = time.perf_counter()
            self.batch.ingest_lines(lines, planned.batch_id, planned.at, self.spark, read_seconds=read - started)
            written = time.perf_counter()
            log_.commit(planned.batch_id)
        finally:
            self._in_batch = False
        ended = time.perf_counter()
        durations = {"latestOffset": int((read - started) * 1000), "addBatch": int((written - read) * 1000),
                     "commitOffsets": int((ended - written) * 1000), "triggerExecution": int((ended - started) * 1000)}
        self.lastProgress = {"batchId": planned.batch_id, "numInputRows": lines.num_rows}
        self.metrics.progressed({
            "query": self.name, "run_id": self.run_id, "batch_id": planned.batch_id,
            "timestamp": datetime.fromtimestamp(tick, timezone.utc), "input_rows": lines.num_rows,
            "input_rows_per_second": 0.0,
            "processed_rows_per_second": lines.num_rows / max(ended - started, 1e-9),
            "batch_duration_ms": durations["triggerExecution"], "duration_ms": json.dumps(durations),
            "watermark": None, "state_rows": 0, "rows_dropped_by_watermark": 0, "output_rows": None,
            "max_event_time": None})


def _admitted(files: list[LandedFile], admission: dict[str, int]) -> list[LandedFile]:
    """A topic's files one micro-batch takes: at most ``maxFilesPerTrigger``, or files up to
    ``maxBytesPerTrigger`` (always at least one)."""
    if "maxFilesPerTrigger" in admission:
        return files[:admission["maxFilesPerTrigger"]]
    taken, size = [], 0
    for file in files:
        if taken and size + file.size > admission["maxBytesPerTrigger"]:
            break
        taken.append(file)
        size += file.size
    return taken


def reads_landing_on_driver(settings: Settings) -> bool:
    """Ingest lists and reads the landing zone on the driver (no Spark source)."""
    return settings.event_source == "landing" and settings.pass_on_driver


__all__ = ["LandingIngest", "LandingLog", "file_uri", "read_lines", "reads_landing_on_driver"]
