"""Stream supervision (run by the ``speed_layer_supervisor`` DAG every few minutes).

Each run diagnoses the stream from its pid file, heartbeat and input backlog
(:mod:`include.backlog`): ``absent`` (never started), ``dead`` (no process, or a process whose
heartbeat stopped), ``stalled`` (alive, but no progress for ``stall_after`` while input waits),
``behind`` (progressing, but its oldest waiting input has waited longer than ``stall_after``:
slower than input lands) or ``healthy``; starts or restarts a stream that is absent, dead or
stalled with exponential backoff and at most ``max_restarts_per_hour`` restarts, after which it
alerts instead of looping; alerts when it is behind (a restart would not help); and alerts when
the Gold views' event-time lag exceeds ``freshness_sla``. Every
decision is logged and appended to ``ops/supervisor_events``, which ``lambdalake status`` shows.

The stream is a detached local driver process (``lambdalake stream``); with a cluster master
configured (``LAMBDALAKE_SPARK_MASTER=spark://…``) that driver submits its work to the cluster.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
from include import tables
from include.notifier import notify
from include.backlog import INGEST_QUERY, landing_backlog, total
from include.config import Settings
from include.lakehouse import open_reader
from include.processes import group_alive, process_alive, stop_group
from include.heartbeat import HEARTBEAT_FILE, read_heartbeat

log = logging.getLogger(__name__)
PID_FILE = "stream.pid"
# The runner rewrites its heartbeat every 2 s; this much silence means the process is hung.
HEARTBEAT_TIMEOUT = timedelta(seconds=60)
RESTARTING = ("start", "restart")


@dataclass(frozen=True)
class Diagnosis:
    state: str  # absent | dead | stalled | behind | healthy
    reason: str
    pid: int | None


def stream_pid(settings: Settings) -> int | None:
    path = settings.run_dir / PID_FILE
    return int(path.read_text()) if path.exists() else None


def diagnose(settings: Settings, now: datetime | None = None) -> Diagnosis:
    now = now or datetime.now(timezone.utc)
    pid = stream_pid(settings)
    beat = read_heartbeat(settings.run_dir)
    if pid is None and beat is None:
        return Diagnosis("absent", "the stream has never been started", None)
    if not process_alive(pid):
        return Diagnosis("dead", f"no stream process (pid {pid})", pid)
    heartbeat_at = datetime.fromisoformat(beat["heartbeat_at"]) if beat else None
    if beat is None or beat.get("pid") != pid or now - heartbeat_at > HEARTBEAT_TIMEOUT:
        return Diagnosis("dead", f"process {pid} alive but its heartbeat stopped (last {heartbeat_at})", pid)
    ingest = beat.get("queries", {}).get(INGEST_QUERY, {})
    since = datetime.fromisoformat(ingest.get("last_progress_at") or beat["started_at"])
    if settings.event_source == "kafka":
        behind = ingest.get("records_behind") or 0
        if behind and now - since > settings.stall_after:
            return Diagnosis("stalled", f"no progress since {since} while {behind:,} records wait", pid)
        return Diagnosis("healthy", f"heartbeat {heartbeat_at}, last progress {since}", pid)
    waiting = total(landing_backlog(settings))
    if waiting.files and now - since > settings.stall_after:
        return Diagnosis("stalled", f"no progress since {since} while {waiting.files:,} landed files wait", pid)
    lag = waiting.lag(now)
    if lag > settings.stall_after:  # it makes progress, but slower than input lands
        return Diagnosis("behind", f"running but {_seconds(lag)} behind: {waiting.files:,} landed files "
                         f"({waiting.bytes / 1e6:,.1f} MB) wait, the oldest since {waiting.oldest_arrival}", pid)
    return Diagnosis("healthy", f"heartbeat {heartbeat_at}, last progress {since}, input lag {_seconds(lag)}", pid)


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():,.0f} s"


def start_stream(settings: Settings, env: dict[str, str] | None = None) -> int:
    """Start ``lambdalake stream`` detached, with ``env`` added to this process's environment;
    returns its pid (also written to run/stream.pid)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    (settings.run_dir / HEARTBEAT_FILE).unlink(missing_ok=True)  # the new process writes its own
    command = [str(Path(sys.executable).parent / "lambdalake"), "stream", "--home", str(settings.home)]
    with (settings.run_dir / "stream.log").open("ab") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    (settings.run_dir / PID_FILE).write_text(str(process.pid))
    return process.pid


def stop_stream(settings: Settings, timeout: float = 90.0) -> None:
    """SIGTERM the stream's process group (it finishes its micro-batch), SIGKILL what remains."""
    pid = stream_pid(settings)
    if pid and group_alive(pid):
        stop_group(pid, grace_seconds=timeout)


def _events(settings: Settings) -> list[dict]:
    store = open_reader(settings)
    if not store.exists(tables.SUPERVISOR_EVENTS):
        return []
    return store.select_arrow(tables.SUPERVISOR_EVENTS, ["at", "decision"]).to_pylist()


def _record(
    settings: Settings, diagnosis: Diagnosis, decision: str, reason: str, restarts: int, pid: int | None
) -> dict:
    row = {
        "at": datetime.now(timezone.utc), "state": diagnosis.state, "decision": decision,
        "reason": reason, "pid": pid, "restarts_last_hour": restarts,
    }
    log.info("supervisor: state=%s decision=%s (%s)", diagnosis.state, decision, reason)
    store = open_reader(settings)
    store.ensure_table(tables.SUPERVISOR_EVENTS, tables.SUPERVISOR_EVENTS_SCHEMA)
    schema = tables.arrow_schema(tables.SUPERVISOR_EVENTS_FIELDS)
    store.append(tables.SUPERVISOR_EVENTS, pa.Table.from_pylist([row], schema=schema))
    return row


def supervise(settings: Settings, now: datetime | None = None, stream_env: dict[str, str] | None = None) -> dict:
    """One supervision round; returns the decision recorded. ``stream_env``: environment a stream
    it starts gets on top of this process's (the Airflow connection it posts events with)."""
    now = now or datetime.now(timezone.utc)
    diagnosis = diagnose(settings, now)
    starts = sorted(e["at"] for e in _events(settings)
                    if e["decision"] in RESTARTING and now - e["at"] < timedelta(hours=1))
    restarts = len(starts)
    if diagnosis.state == "healthy":
        decision = _record(settings, diagnosis, "none", diagnosis.reason, restarts, diagnosis.pid)
        check_freshness(settings, now)
        return decision
    if diagnosis.state == "behind":  # a restart would only add its start-up to the backlog
        notify(settings, "speed_layer_supervisor", "stream falling behind its input", severity="warning",
               reason=diagnosis.reason)
        return _record(settings, diagnosis, "alert", diagnosis.reason, restarts, diagnosis.pid)
    if restarts >= settings.max_restarts_per_hour:
        reason = (f"{diagnosis.reason}; {restarts} (re)starts in the last hour, "
                  f"cap {settings.max_restarts_per_hour}: not restarting")
        notify(settings, "speed_layer_supervisor", f"stream {diagnosis.state} and restart cap reached", reason=reason)
        return _record(settings, diagnosis, "alert", reason, restarts, diagnosis.pid)
    wait = settings.restart_backoff * (2 ** (restarts - 1)) if restarts else timedelta(0)
    if starts and now - starts[-1] < wait:
        reason = f"{diagnosis.reason}; backing off until {starts[-1] + wait}"
        return _record(settings, diagnosis, "backoff", reason, restarts, diagnosis.pid)
    if diagnosis.state != "absent":
        stop_stream(settings)
    pid = start_stream(settings, stream_env)
    if diagnosis.state != "absent":
        notify(settings, "speed_layer_supervisor", f"stream {diagnosis.state}; restarted", severity="warning",
               reason=diagnosis.reason, pid=pid)
    decision = "start" if diagnosis.state == "absent" else "restart"
    return _record(settings, diagnosis, decision, f"{diagnosis.reason}; started pid {pid}", restarts + 1, pid)


def check_freshness(settings: Settings, now: datetime) -> timedelta | None:
    """Alert when the newest event the speed layer has ingested is older than the SLA."""
    store = open_reader(settings)
    if not store.exists(tables.INGEST_BATCHES):
        return None
    newest = store.select_arrow(tables.INGEST_BATCHES, ["max_event_time"], "max_event_time IS NOT NULL")
    if newest.num_rows == 0:
        return None
    lag = now - max(newest.column("max_event_time").to_pylist())
    if lag > settings.freshness_sla:
        notify(settings, "speed_layer_supervisor", f"speed views are {lag} behind (SLA {settings.freshness_sla})",
               severity="warning", lag_seconds=lag.total_seconds())
    return lag
