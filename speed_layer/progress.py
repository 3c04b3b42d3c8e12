"""What ``lambdalake stream --available-now`` shows while it works: landed files ingested of
those waiting when it started, events and events/s; then the views' micro-batches."""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from include.config import Settings
from include.progress import Progress
from speed_layer import ingest
from speed_layer.metrics import StreamMetrics


def ingested_files(checkpoint: Path) -> set[Path]:
    """The files the ingest query's file sources have committed. Spark's source log: one file per
    micro-batch (or a compaction of earlier ones), a version line, then one JSON line per file."""
    paths = set()
    for log in checkpoint.glob("sources/*/*"):
        if log.name[:1].isdigit():
            for line in log.read_text(encoding="utf-8").splitlines()[1:]:
                paths.add(Path(unquote(urlparse(json.loads(line)["path"]).path)))
    return paths


def landed_files(settings: Settings) -> set[Path]:
    return set(settings.landing_dir.glob("*/*.jsonl"))


class StreamProgress:
    """Progress of the ingest phase, read from the checkpoint and the listener's counts."""

    def __init__(self, settings: Settings, metrics: StreamMetrics) -> None:
        self.checkpoint = settings.checkpoints_dir / ingest.QUERY
        self.metrics = metrics
        self.landing = settings.event_source == "landing"
        waiting = landed_files(settings) - ingested_files(self.checkpoint) if self.landing else set()
        self.waiting = len(waiting)
        self.already = self._ingested() if self.landing else 0
        self.started = time.monotonic()
        self.bar = Progress("ingest", self.waiting if self.landing else None, "files" if self.landing else "events")

    def _ingested(self) -> int:
        return len(ingested_files(self.checkpoint))

    def tick(self) -> None:
        events = self.metrics.input_rows(ingest.QUERY)
        rate = events / max(time.monotonic() - self.started, 1e-9)
        note = f"{events:,} events, {rate:,.0f} events/s"
        done = min(self._ingested() - self.already, self.waiting) if self.landing else events
        self.bar.update(done, note)

    def close(self) -> None:
        self.tick()
        self.bar.close()
