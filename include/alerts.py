"""One notifier for the whole platform: every alert goes to the log and the ``ops/alerts`` table,
and to a webhook when ``LAMBDALAKE_ALERT_WEBHOOK_URL`` is set."""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.request
from datetime import datetime, timezone
from typing import Any

from include.config import Settings, load_settings

# Imported by DAG files at parse time: heavy imports (pyarrow, pyspark) stay inside functions.
log = logging.getLogger("lambdalake.alerts")


def notify(settings: Settings, source: str, message: str, severity: str = "error", **details: Any) -> None:
    """Record an alert where on-call people look: the log, the alerts table, the webhook."""
    import pyarrow as pa

    from include.lakehouse import open_store
    from include.tables import ALERTS, ALERTS_SCHEMA, arrow_schema

    log.log(logging.ERROR if severity == "error" else logging.WARNING, "[%s] %s %s", source, message, details or "")
    row = {"at": datetime.now(timezone.utc), "source": source, "severity": severity,
           "message": message, "details": json.dumps(details, default=str, sort_keys=True)}
    store = open_store(settings)
    store.ensure_table(ALERTS, ALERTS_SCHEMA)
    store.append(ALERTS, pa.Table.from_pylist([row], schema=arrow_schema(ALERTS_SCHEMA)))
    if settings.alert_webhook_url:
        request = urllib.request.Request(
            settings.alert_webhook_url, data=json.dumps(row, default=str).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        try:
            urllib.request.urlopen(request, timeout=10).close()
        except OSError as exc:  # the alert is already recorded; say the webhook failed
            log.error("alert webhook %s failed: %s", settings.alert_webhook_url, exc)


async def deadline_missed(context: dict, **kwargs: Any) -> None:
    """Deadline Alert callback (runs in the triggerer): record the missed deadline."""
    dag_run = context.get("dag_run")
    details = {
        "dag_id": getattr(dag_run, "dag_id", kwargs.get("dag_id")),
        "run_id": getattr(dag_run, "run_id", None),
        "deadline": str(kwargs.get("deadline", "")),
    }
    message = f"deadline missed: {details['dag_id']} run {details['run_id']} is not done in time"
    await asyncio.to_thread(notify, load_settings(), "deadline", message, "error", **details)


def task_failed(context: dict) -> None:
    """``on_failure_callback`` for every lambdalake task."""
    ti = context.get("task_instance") or context.get("ti")
    dag_id, task_id = getattr(ti, "dag_id", "?"), getattr(ti, "task_id", "?")
    notify(load_settings(), dag_id, f"task {task_id} failed", run_id=getattr(ti, "run_id", None),
           error=str(context.get("exception") or ""))
