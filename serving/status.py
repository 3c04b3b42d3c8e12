"""``lambdalake status``: stream health, batch coverage, stale days, freshness, table versions."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from include.backlog import INGEST_QUERY, landing_backlog, total
from include.coverage import covered_days, stale_days
from include.config import Settings
from include.lakehouse import LakehouseStore, open_reader
from include.processes import process_alive
from include.views import VIEWS
from serving.engine import COVERAGE, ServingEngine, batch_relation, internal, speed_relation
from include.heartbeat import read_heartbeat


def stream_health(settings: Settings) -> dict[str, Any]:
    """The stream process as its heartbeat tells it: state, pid alive, heartbeat age, and how
    often it refreshes each view (empty unless it runs continuously)."""
    beat = read_heartbeat(settings.run_dir)
    if beat is None:
        return {"stream_state": "never started", "heartbeat_at": None, "refresh": {}}
    state = beat["state"]
    if state != "stopped" and not process_alive(beat["pid"]):
        state = "dead"
    refresh = beat.get("view_refresh_seconds", {}) if state in ("starting", "running") else {}
    return {"stream_state": state, "heartbeat_at": datetime.fromisoformat(beat["heartbeat_at"]), "refresh": refresh}


def latest(engine: ServingEngine, view: str, columns: list[str]) -> dict[str, Any]:
    """The newest row (by its first column, a timestamp) of an ops view, or empty values."""
    listed = ", ".join(f'"{column}"' for column in columns)  # `at` is a keyword in DuckDB
    rows = engine.rows(f'SELECT {listed} FROM {view} ORDER BY "{columns[0]}" DESC LIMIT 1')
    return rows[0] if rows else dict.fromkeys(columns)


def input_waiting(settings: Settings, now: datetime) -> dict[str, Any]:
    """The stream's input backlog (:mod:`include.backlog`): landed files and bytes not read yet
    and the oldest one's age, or on Kafka the records the stream last reported behind."""
    if settings.event_source == "kafka":
        ingest = ((read_heartbeat(settings.run_dir) or {}).get("queries") or {}).get(INGEST_QUERY, {})
        return {"input_waiting_files": None, "input_waiting_bytes": None, "input_lag_seconds": None,
                "input_waiting_records": ingest.get("records_behind")}
    waiting = total(landing_backlog(settings))
    return {"input_waiting_files": waiting.files, "input_waiting_bytes": waiting.bytes,
            "input_lag_seconds": round(waiting.lag(now).total_seconds(), 1), "input_waiting_records": None}


def view_progress(engine: ServingEngine) -> dict[str, dict[str, Any]]:
    """Per speed query, from its progress: the newest event time its micro-batches read and when
    its last micro-batch that read input ended."""
    rows = engine.rows(
        "SELECT query, max(max_event_time) AS counted, "
        "max(timestamp + to_milliseconds(batch_duration_ms)) FILTER (WHERE input_rows > 0) AS refreshed "
        "FROM stream_metrics GROUP BY query"
    )
    return {row["query"]: row for row in rows}


def batch_runs(engine: ServingEngine) -> dict[str, str]:
    """The run each covered day is served from, and the days a later run has begun to restate
    without publishing (still served from the run before), as the engine serves them."""
    rows = engine.rows(f"SELECT date, run_id, rerun_started_at FROM {COVERAGE} ORDER BY date")
    return {
        "batch_runs": ", ".join(f"{row['date'].isoformat()}: {row['run_id'] or 'unrecorded'}" for row in rows),
        "batch_reruns_unpublished": ", ".join(
            f"{row['date'].isoformat()} (since {_iso(row['rerun_started_at'])})" for row in rows
            if row["rerun_started_at"] is not None),
    }


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def view_status(settings: Settings, engine: ServingEngine | None = None) -> list[dict[str, Any]]:
    """One row per view; ``engine`` is an open one to read through (else one is opened)."""
    engine = engine or ServingEngine(settings)
    store = open_reader(settings)  # reads metadata only: no Spark
    now = datetime.now(timezone.utc)
    covered = sorted(covered_days(store))
    stale = stale_days(store, settings)
    health = stream_health(settings)
    refresh = health.pop("refresh")
    waiting = input_waiting(settings, now)
    progress = view_progress(engine)
    runs = batch_runs(engine)
    supervisor = latest(engine, "supervisor_events", ["at", "decision", "reason"])
    alert = latest(engine, "ops_alerts", ["at", "message"])
    ops = {
        "supervisor_at": supervisor["at"], "supervisor_decision": supervisor["decision"],
        "last_alert_at": alert["at"], "last_alert": alert["message"],
    }
    rows = []
    for view in VIEWS:
        # The newest event the view's own query has read (its watermark's statistics); else (a
        # query without a watermark, or no stream here) what its rows show, never later than that.
        own = progress.get(view.speed_query, {})
        if view.in_ingest_pass:  # ingest's progress counts every topic's events
            own = {"refreshed": progress.get(INGEST_QUERY, {}).get("refreshed")}
            if refresh.get(view.name, 0) > settings.trigger_interval.total_seconds():  # it runs less often
                own = {"refreshed": _last_commit(store, view.speed_table)}
        counted = own.get("counted") or engine.query(
            f"SELECT max({view.speed.freshness_time}) FROM {internal(speed_relation(view))}"
        )[1][0][0]
        rows.append(
            {
                "view": view.name,
                "batch_covered_days": ", ".join(day.isoformat() for day in covered),
                "stale_days": ", ".join(day.isoformat() for day in stale),
                **runs,
                "speed_max_event_time": counted,
                # When the view's query last read new input (None: never, here).
                "speed_refreshed_at": own.get("refreshed"),
                # Seconds between the running stream's micro-batches of the view (None: not refreshed now).
                "speed_refresh_seconds": refresh.get(view.name),
                "speed_version": engine.version(speed_relation(view)),
                "batch_version": engine.version(batch_relation(view)),
                **health,
                **waiting,
                **ops,
                "checked_at": now,
            }
        )
    return rows


def _last_commit(store: LakehouseStore, table: str) -> datetime | None:
    """When ``table`` last changed (None: no table)."""
    return store.history(table, 1)[0].timestamp if store.exists(table) else None


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _ago(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "never"
    return f"{_duration(max(0.0, (now - moment).total_seconds()))} ago"


def _interval(seconds: float | None) -> str:
    if not seconds:
        return "-"
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _waiting(row: dict[str, Any]) -> str:
    """The input backlog in words: nothing waiting, or how much and for how long."""
    if row["input_waiting_records"] is not None:
        return f"{row['input_waiting_records']:,} records waiting (furthest-behind partitions)"
    if row["input_waiting_files"] is None:
        return "input waiting: unknown"
    if not row["input_waiting_files"]:
        return "no input waiting"
    return (f"{row['input_waiting_files']:,} landed files waiting ({row['input_waiting_bytes'] / 1e6:,.1f} MB), "
            f"the oldest for {_duration(row['input_lag_seconds'])}")


def _utc(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%MZ")


def status_summary(rows: list[dict[str, Any]]) -> str:
    """What a person needs from ``status``: the stream, one line per view, the latest alert."""
    from include.output import format_rows

    if not rows:
        return "(no views)"
    first, now = rows[0], rows[0]["checked_at"]
    stream = f"stream: {first['stream_state']}"
    if first["heartbeat_at"]:
        stream += f" (heartbeat {_ago(first['heartbeat_at'], now)})"
    stream += f"; {_waiting(first)}"
    if first["supervisor_at"]:
        stream += f"; supervisor {_ago(first['supervisor_at'], now)}: {first['supervisor_decision']}"
    views = []
    for row in rows:
        covered = [day for day in row["batch_covered_days"].split(", ") if day]
        newest = row["speed_max_event_time"]
        views.append({
            "view": row["view"],
            "newest event (speed)": f"{_utc(newest)} ({_ago(newest, now)})" if newest else "none yet",
            "updated": _ago(row["speed_refreshed_at"], now),
            "refresh": _interval(row["speed_refresh_seconds"]),  # the stream's micro-batch interval
            "batch-covered days": f"{len(covered)} (last {covered[-1]})" if covered else "none",
            "stale": row["stale_days"] or "none",
        })
    batch = ""
    if first["batch_runs"]:
        day, run = first["batch_runs"].split(", ")[-1].split(": ", 1)
        batch = f"batch: {day} served from run {run}"
    if first["batch_reruns_unpublished"]:  # what a reader sees meanwhile: the run before
        batch += (f"\nreruns not published, their days served from the run before: {first['batch_reruns_unpublished']}"
                  "\n(one that failed: run `lambdalake batch --date DAY` again)")
    alert = (f"last alert: {_utc(first['last_alert_at'])} ({_ago(first['last_alert_at'], now)}): {first['last_alert']}"
             if first["last_alert_at"] else "alerts: none")
    return "\n".join([stream, "", format_rows(views, "table"), "", *([batch] if batch else []), alert])
