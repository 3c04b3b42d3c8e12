"""What ``lambdalake stream --available-now`` shows while it works: landed files ingested of
those waiting when it started, events and events/s; then the views' micro-batches."""

from __future__ import annotations

import time

from include.backlog import landing_backlog, total
from include.config import Settings
from include.progress import Progress
from speed_layer import ingest
from speed_layer.metrics import StreamMetrics


class StreamProgress:
    """Progress of the ingest phase: the landing zone's backlog (:mod:`include.backlog`) and the
    listener's counts."""

    def __init__(self, settings: Settings, metrics: StreamMetrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.landing = settings.event_source == "landing"
        self.waiting = self._waiting() if self.landing else 0
        self.started = time.monotonic()
        self.bar = Progress("ingest", self.waiting if self.landing else None, "files" if self.landing else "events")

    def _waiting(self) -> int:
        return total(landing_backlog(self.settings)).files

    def tick(self) -> None:
        events = self.metrics.input_rows(ingest.QUERY)
        rate = events / max(time.monotonic() - self.started, 1e-9)
        note = f"{events:,} events, {rate:,.0f} events/s"
        done = min(max(0, self.waiting - self._waiting()), self.waiting) if self.landing else events
        self.bar.update(done, note)

    def close(self) -> None:
        self.tick()
        self.bar.close()
