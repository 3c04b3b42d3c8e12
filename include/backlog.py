"""What the speed layer has not read yet: its input backlog and lag, for ``status``, the
dashboard and the supervisor.

On the landing zone a topic's waiting input is every landed file newer than the newest one the
ingest query has taken into a micro-batch: Spark's file source takes a topic's files oldest
first, by modification time, and records each file it takes in the query's checkpoint. The lag
is the age of the oldest waiting file: it stays within a micro-batch or two while the stream
keeps up and grows while it falls behind. (On Kafka the stream reports the records it is behind
the latest offsets instead, in its progress.)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from include.schemas import TOPIC_NAMES

if TYPE_CHECKING:
    from include.config import Settings

INGEST_QUERY = "speed_ingest"
# The newest entries of a source log file are at its end; every 10th file is a compaction of all
# before it, so only its tail is read.
LOG_TAIL_BYTES = 256 * 1024


@dataclass(frozen=True)
class Backlog:
    """Landed input the stream has not read: how many files, their bytes, the oldest's arrival."""

    files: int = 0
    bytes: int = 0
    oldest_arrival: datetime | None = None

    def lag(self, now: datetime) -> timedelta:
        """How long the oldest waiting input has waited (zero when nothing waits)."""
        return max(timedelta(0), now - self.oldest_arrival) if self.oldest_arrival else timedelta(0)

    def __add__(self, other: Backlog) -> Backlog:
        arrivals = [moment for moment in (self.oldest_arrival, other.oldest_arrival) if moment]
        return Backlog(self.files + other.files, self.bytes + other.bytes, min(arrivals) if arrivals else None)


@dataclass(frozen=True)
class LandedFile:
    topic: str
    path: Path
    modified_ms: int  # as Spark sees a file's modification time
    size: int


def landed_files(folder: Path, topic: str, known: dict[str, LandedFile] | None = None) -> list[LandedFile]:
    """The topic's complete landing files (``*.jsonl``, not hidden: a file is written under
    another name and renamed), oldest first, as the stream takes them. ``known``: the files an
    earlier listing found, by path, updated here; a landed file does not change (it is renamed
    in complete), so only a new one is looked at: a listing every trigger costs little however
    many files the day has landed."""
    found = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        entries = []
    for entry in entries:
        if not entry.name.endswith(".jsonl") or entry.name.startswith((".", "_")):
            continue
        landed = known.get(entry.path) if known is not None else None
        if landed is None:
            try:
                stat = entry.stat()
            except FileNotFoundError:  # moved away while listed
                continue
            landed = LandedFile(topic, Path(entry.path), stat.st_mtime_ns // 1_000_000, stat.st_size)
        found[entry.path] = landed
    if known is not None:
        known.clear()
        known.update(found)
    return sorted(found.values(), key=lambda file: (file.modified_ms, file.path.name))


def _millis(moment_ms: int) -> datetime:
    return datetime.fromtimestamp(moment_ms / 1000, timezone.utc)


def taken_through(settings: Settings) -> dict[str, datetime]:
    """Per topic, the modification time of the newest landing file the ingest query has taken.

    Read from each file source's log in the query's checkpoint (``sources/<n>/<batch>``: a
    version line, then one JSON object per file taken: ``path``, ``timestamp`` in ms,
    ``batchId``), the newest batch's file only."""
    through: dict[str, datetime] = {}
    sources = settings.checkpoints_dir / INGEST_QUERY / "sources"
    for source in sorted(sources.iterdir()) if sources.is_dir() else []:
        batches = [entry for entry in source.iterdir() if entry.name.split(".")[0].isdigit()]
        if not batches:
            continue
        newest = max(batches, key=lambda entry: int(entry.name.split(".")[0]))
        with newest.open("rb") as log:
            log.seek(max(0, newest.stat().st_size - LOG_TAIL_BYTES))
            lines = log.read().decode("utf-8", "replace").splitlines()
        for line in lines:
            try:
                entry = json.loads(line)
                path, moment = Path(unquote(urlparse(entry["path"]).path)), _millis(entry["timestamp"])
            except (ValueError, TypeError, KeyError):  # the version line, or one cut by the tail
                continue
            topic = path.parent.name
            through[topic] = max(moment, through.get(topic, moment))
    return through


def landing_backlog(settings: Settings, through: Mapping[str, datetime] | None = None) -> dict[str, Backlog]:
    """Per topic, the landed files newer than the newest one taken (``through``, else
    :func:`taken_through`)."""
    through = taken_through(settings) if through is None else through
    backlog = {}
    for topic in TOPIC_NAMES:
        folder = settings.landing_topic_dir(topic)
        newest_taken = through.get(topic)
        files, size, oldest = 0, 0, None
        for landed in landed_files(folder, topic):
            arrival = _millis(landed.modified_ms)
            if newest_taken is None or arrival > newest_taken:
                files, size = files + 1, size + landed.size
                oldest = arrival if oldest is None else min(oldest, arrival)
        backlog[topic] = Backlog(files, size, oldest)
    return backlog


def total(backlog: Mapping[str, Backlog]) -> Backlog:
    return sum(backlog.values(), Backlog())
