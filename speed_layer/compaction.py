"""Compaction while the stream runs: the tables it appends to every micro-batch get a small
file per micro-batch, 600 every ten minutes, and every commit and read of such a table handles
all of them until the nightly maintenance. A thread beside the queries compacts them on a
clock (``LAMBDALAKE_STREAM_COMPACTION_INTERVAL``).

Only append-only tables: compaction and a blind append do not conflict, so neither waits for
the other. The speed tables that take a merge every micro-batch rewrite their own newest files
as they go, and a compaction there would conflict with the merges (the daily maintenance does
them). A compacted table's small files stay on disk until maintenance vacuums them, so readers
of an older version still find them.
"""

from __future__ import annotations

import logging
import threading
import time

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore, open_reader
from include.schemas import TOPIC_NAMES
from include.views import speed_views

log = logging.getLogger(__name__)


def appended_tables(settings: Settings) -> list[str]:
    """The tables the stream only appends to."""
    names = [tables.DLQ, tables.LATE_EVENTS, tables.INGEST_BATCHES, tables.STREAM_METRICS]
    names += [tables.silver(topic) for topic in TOPIC_NAMES] + [tables.bronze(topic) for topic in TOPIC_NAMES]
    names += [view.speed_table for view in speed_views(settings) if view.merged_when_read]
    return names


class StreamCompaction:
    """Compacts :func:`appended_tables` every ``settings.stream_compaction_interval``, each by the
    engine that writes it (the stream's metrics by delta-rs)."""

    def __init__(self, settings: Settings, store: LakehouseStore) -> None:
        self.store, self.ops_store, self.names = store, open_reader(settings), appended_tables(settings)
        self.every = settings.stream_compaction_interval.total_seconds()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every):
            self.compact(stop)

    def compact(self, stop: threading.Event | None = None) -> dict[str, dict]:
        """One round; a table that fails is logged and tried again next round."""
        done = {}
        for name in self.names:
            if stop is not None and stop.is_set():
                break
            store = self.ops_store if name in tables.OPS_TABLES else self.store
            if not store.exists(name):
                continue
            started = time.perf_counter()
            try:
                metrics = store.optimize(name)
            except Exception as error:  # noqa: BLE001 - the stream goes on; next round retries
                log.warning("compaction of %s failed (tried again in %.0f s): %s", name, self.every, error)
                continue
            done[name] = metrics
            if metrics.get("numFilesRemoved"):
                log.info("compacted %s: %s files into %s in %.1f s", name, metrics.get("numFilesRemoved"),
                         metrics.get("numFilesAdded"), time.perf_counter() - started)
        return done


__all__ = ["StreamCompaction", "appended_tables"]
