"""Lakehouse maintenance: compaction (z-order where queries filter), vacuum, checkpoint hygiene,
and a look at what a crash or a producer left behind (``lambdalake doctor``'s examination).

Safe while the stream writes: compaction and vacuum commit through the store, which retries
conflicting commits; vacuum keeps a week of history for time travel and running readers; a feed
file is removed once every query that reads its folder has committed the batch that read it (a
query killed before its commit reads the same files again), or after a day if none reads it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from include import tables
from include.checkpoints import committed_batch, file_source_reads
from include.config import Settings
from include.doctor import ABANDONED_AFTER_SECONDS, Finding, examine, repair
from include.heartbeat import read_heartbeat
from include.lakehouse import all_tables, open_reader, open_store
from include.notifier import notify
from include.processes import process_alive
from include.schemas import TOPIC_NAMES

log = logging.getLogger(__name__)
VACUUM_RETENTION_HOURS = 168
FEED_RETENTION_SECONDS = 24 * 3600
LAST_RUN_FILE = "maintenance-last-run.json"
# Tables clustered by the column their readers filter on.
ZORDER = {tables.silver(topic): ["event_time"] for topic in TOPIC_NAMES}


def compact_and_vacuum(settings: Settings) -> list[dict]:
    """Each table by the engine that writes it (the ops tables by delta-rs, the others by delta-spark)."""
    spark_store, ops_store = open_store(settings), open_reader(settings)
    results = []
    for name in all_tables(settings.lakehouse_dir):
        store = ops_store if name in tables.OPS_TABLES else spark_store
        metrics = store.optimize(name, zorder_by=ZORDER.get(name, ()))
        removed = store.vacuum(name, retention_hours=VACUUM_RETENTION_HOURS)
        results.append({"table": name, "files_added": metrics.get("numFilesAdded"),
                        "files_removed": metrics.get("numFilesRemoved"), "vacuumed": removed})
        log.info("maintenance %s: %s", name, results[-1])
    return results


def consumed_feed_files(settings: Settings, now: float) -> list[Path]:
    """Feed files no query will read again: each query whose checkpoint has read from the file's
    folder has committed the batch that read it; in a folder no query reads, files a day old."""
    readers: dict[Path, list[set[Path]]] = {}
    for query in settings.checkpoints_dir.glob("*"):
        done = committed_batch(query)
        reads = file_source_reads(query)
        committed = {path for path, batch in reads.items() if batch <= done}
        for folder in {path.parent for path in reads if path.parent.parent == settings.feeds_dir}:
            readers.setdefault(folder, []).append(committed)
    consumed = []
    for path in settings.feeds_dir.glob("*/*.parquet"):
        if path.parent in readers:
            if all(path in committed for committed in readers[path.parent]):
                consumed.append(path)
        elif now - path.stat().st_mtime > FEED_RETENTION_SECONDS:
            consumed.append(path)
    return consumed


def checkpoint_hygiene(settings: Settings, now: float | None = None) -> dict[str, int]:
    """Delete consumed feed files and temporary files abandoned by crashed writers."""
    now = now or time.time()
    removed = {"feed_files": 0, "temporary_files": 0}
    for path in consumed_feed_files(settings, now):
        path.unlink(missing_ok=True)
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


def examine_lake(settings: Settings) -> dict[str, list[str]]:
    """What ``lambdalake doctor`` finds, on the schedule: an alert for each finding a person must
    decide on, with the command to run. The findings ``doctor --repair`` fixes safely are repaired
    when ``LAMBDALAKE_MAINTENANCE_REPAIRS`` says so (a checkpoint's files only while no stream
    runs, as ``--repair`` asks), and otherwise alerted with that command. Returns the lines of
    the findings repaired and alerted."""
    findings = examine(settings).findings
    stream_runs = _stream_runs(settings)
    repairable = [finding for finding in findings if finding.repair and settings.maintenance_repairs
                  and not (stream_runs and finding.path.is_relative_to(settings.checkpoints_dir))]
    left = repair(repairable)  # every one of them is repaired: none needs a person
    repaired = [finding.line(repaired=True) for finding in repairable if finding not in left]
    alerted = []
    for finding in (finding for finding in findings if finding not in repairable):
        command = _command_for(settings, finding, stream_runs)
        told = "" if finding.command else f"; run: {command}"  # the finding's own command is in its line
        notify(settings, "lakehouse_maintenance", f"lambdalake doctor: {finding.line()}{told}",
               "warning" if finding.repair else "error", path=str(finding.path), command=command)
        alerted.append(finding.line())
    log.info("lake examined: %d repaired, %d alerted", len(repaired), len(alerted))
    return {"repaired": repaired, "alerted": alerted}


def _command_for(settings: Settings, finding: Finding, stream_runs: bool) -> str:
    """What a person runs about ``finding``: the fix it names, else doctor itself."""
    if finding.command:
        return finding.command
    if finding.repair:
        stop = "stop the stream, then " if stream_runs and finding.path.is_relative_to(settings.checkpoints_dir) else ""
        return f"{stop}lambdalake doctor --home {settings.home} --repair"
    return f"lambdalake doctor --home {settings.home} (after restoring the file from a backup)"


def _stream_runs(settings: Settings) -> bool:
    beat = read_heartbeat(settings.run_dir)
    return beat is not None and beat["state"] != "stopped" and process_alive(beat["pid"])
