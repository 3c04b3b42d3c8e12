"""Lakehouse maintenance: compaction (z-order where queries filter), vacuum, checkpoint hygiene.

Safe while the stream writes: compaction and vacuum commit through the store, which retries
conflicting commits; vacuum keeps a week of history for time travel and running readers; feed
files are removed only once the Gold queries have had a day to consume them.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone

from include import tables
from include.config import Settings
from include.doctor import ABANDONED_AFTER_SECONDS
from include.lakehouse import all_tables, open_store
from include.schemas import TOPIC_NAMES

log = logging.getLogger(__name__)
VACUUM_RETENTION_HOURS = 168
FEED_RETENTION_SECONDS = 24 * 3600
LAST_RUN_FILE = "maintenance-last-run.json"
# Tables clustered by the column their readers filter on.
ZORDER = {tables.silver(topic): ["event_time"] for topic in TOPIC_NAMES}


def compact_and_vacuum(settings: Settings) -> list[dict]:
    store = open_store(settings)
    results = []
    for name in all_tables(settings.lakehouse_dir):
        metrics = store.optimize(name, zorder_by=ZORDER.get(name, ()))
        removed = store.vacuum(name, retention_hours=VACUUM_RETENTION_HOURS)
        results.append({"table": name, "files_added": metrics.get("numFilesAdded"),
                        "files_removed": metrics.get("numFilesRemoved"), "vacuumed": removed})
        log.info("maintenance %s: %s", name, results[-1])
    return results


def checkpoint_hygiene(settings: Settings, now: float | None = None) -> dict[str, int]:
    """Delete consumed feed files and temporary files abandoned by crashed writers."""
    now = now or time.time()
    removed = {"feed_files": 0, "temporary_files": 0}
    for path in settings.feeds_dir.glob("*/*.parquet"):
        if now - path.stat().st_mtime > FEED_RETENTION_SECONDS:
            path.unlink()
            removed["feed_files"] += 1
    for folder in (settings.feeds_dir, settings.landing_dir):
        for path in folder.glob("*/.*.tmp"):
            if now - path.stat().st_mtime > ABANDONED_AFTER_SECONDS:
                path.unlink()
                removed["temporary_files"] += 1
    log.info("checkpoint hygiene: %s", removed)
    return removed


def last_maintenance(settings: Settings) -> datetime | None:
    """When the last complete maintenance (the DAG's or ``lambdalake maintain``) finished."""
    path = settings.run_dir / LAST_RUN_FILE
    return datetime.fromisoformat(json.loads(path.read_text(encoding="utf-8"))["at"]) if path.exists() else None


def record_maintenance(settings: Settings, at: datetime | None = None) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    path = settings.run_dir / LAST_RUN_FILE
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"at": (at or datetime.now(timezone.utc)).isoformat()}), encoding="utf-8")
    os.replace(temporary, path)


def maintenance_due(settings: Settings, now: datetime | None = None) -> bool:
    """At most once a day: due unless a maintenance has finished on this UTC day already."""
    now = now or datetime.now(timezone.utc)
    last = last_maintenance(settings)
    if last is not None and last.astimezone(timezone.utc).date() == now.astimezone(timezone.utc).date():
        log.info("maintenance already ran today (%s): skipped", last.isoformat())
        return False
    return True
