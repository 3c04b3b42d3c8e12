"""``lambdalake status``: stream health, batch coverage, stale days, freshness, table versions."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from typing import Any

from batch_layer.coverage import covered_days, stale_days
from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from serving.engine import ServingEngine
from speed_layer.metrics import read_heartbeat

# view -> (speed table, batch table, the speed view's event-time column)
VIEW_TABLES = {
    "revenue_by_category_5m": (tables.SPEED_REVENUE, tables.BATCH_REVENUE, "window_end"),
    "order_payments": (tables.SPEED_ORDER_PAYMENTS, tables.BATCH_ORDER_PAYMENTS, "order_time"),
}


def stream_health(settings: Settings) -> dict[str, Any]:
    """The stream process as its heartbeat tells it: state, pid alive, heartbeat age."""
    beat = read_heartbeat(settings.run_dir)
    if beat is None:
        return {"stream_state": "never started", "heartbeat_at": None}
    state = beat["state"]
    if state != "stopped" and not _alive(beat["pid"]):
        state = "dead"
    return {"stream_state": state, "heartbeat_at": datetime.fromisoformat(beat["heartbeat_at"])}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def view_status(settings: Settings, store: LakehouseStore) -> list[dict[str, Any]]:
    engine = ServingEngine(settings)
    covered = sorted(covered_days(store))
    stale = stale_days(store, settings)
    processed = engine.rows("SELECT max(processed_at) AS at FROM ingest_batches")[0]["at"]
    health = stream_health(settings)
    rows = []
    for view, (speed_table, batch_table, time_column) in VIEW_TABLES.items():
        relation = "_speed_revenue" if view == "revenue_by_category_5m" else "_speed_order_payments"
        freshest = engine.connection.execute(f"SELECT max({time_column}) FROM {relation}").fetchone()[0]
        rows.append(
            {
                "view": view,
                "batch_covered_days": ", ".join(day.isoformat() for day in covered),
                "stale_days": ", ".join(day.isoformat() for day in stale),
                "speed_max_event_time": freshest,
                "speed_processed_at": processed,
                "speed_version": store.version(speed_table) if store.exists(speed_table) else None,
                "batch_version": store.version(batch_table) if store.exists(batch_table) else None,
                **health,
                "checked_at": datetime.now(timezone.utc),
            }
        )
    return rows
