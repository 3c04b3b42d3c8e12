"""``lambdalake status``: stream health, batch coverage, stale days, freshness, table versions."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from include.coverage import covered_days, stale_days
from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.processes import process_alive
from include.views import VIEWS
from serving.engine import ServingEngine, speed_relation
from include.heartbeat import read_heartbeat

def stream_health(settings: Settings) -> dict[str, Any]:
    """The stream process as its heartbeat tells it: state, pid alive, heartbeat age."""
    beat = read_heartbeat(settings.run_dir)
    if beat is None:
        return {"stream_state": "never started", "heartbeat_at": None}
    state = beat["state"]
    if state != "stopped" and not process_alive(beat["pid"]):
        state = "dead"
    return {"stream_state": state, "heartbeat_at": datetime.fromisoformat(beat["heartbeat_at"])}


def latest(store: LakehouseStore, table: str, columns: list[str]) -> dict[str, Any]:
    """The newest row (by its first column, a timestamp) of an ops table, or empty values."""
    if not store.exists(table):
        return dict.fromkeys(columns)
    rows = store.select_arrow(table, columns)
    if rows.num_rows == 0:
        return dict.fromkeys(columns)
    return rows.sort_by([(columns[0], "descending")]).slice(0, 1).to_pylist()[0]


def view_status(settings: Settings, store: LakehouseStore) -> list[dict[str, Any]]:
    engine = ServingEngine(settings)
    covered = sorted(covered_days(store))
    stale = stale_days(store, settings)
    processed = engine.rows("SELECT max(processed_at) AS at FROM ingest_batches")[0]["at"]
    health = stream_health(settings)
    supervisor = latest(store, tables.SUPERVISOR_EVENTS, ["at", "decision", "reason"])
    alert = latest(store, tables.ALERTS, ["at", "message"])
    ops = {
        "supervisor_at": supervisor["at"], "supervisor_decision": supervisor["decision"],
        "last_alert_at": alert["at"], "last_alert": alert["message"],
    }
    rows = []
    for view in VIEWS:
        freshest = engine.connection.execute(f"SELECT max({view.freshness_time}) FROM {speed_relation(view)}").fetchone()[0]
        rows.append(
            {
                "view": view.name,
                "batch_covered_days": ", ".join(day.isoformat() for day in covered),
                "stale_days": ", ".join(day.isoformat() for day in stale),
                "speed_max_event_time": freshest,
                "speed_processed_at": processed,
                "speed_version": store.version(view.speed_table) if store.exists(view.speed_table) else None,
                "batch_version": store.version(view.batch_table) if store.exists(view.batch_table) else None,
                **health,
                **ops,
                "checked_at": datetime.now(timezone.utc),
            }
        )
    return rows
