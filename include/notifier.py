"""One notifier for the whole platform: every alert goes to the log and the ``ops/alerts`` table,
to a webhook when ``LAMBDALAKE_ALERT_WEBHOOK_URL`` is set, and by e-mail (Airflow's SMTP notifier)
when ``LAMBDALAKE_ALERT_EMAIL_TO`` is set and the Airflow connection ``lambdalake_smtp`` exists."""

from __future__ import annotations

import asyncio
import html
import json
import logging
import urllib.request
from datetime import datetime, timezone
from typing import Any

from include.config import Settings, load_settings

# Imported by DAG files at parse time: heavy imports (pyarrow, pyspark) stay inside functions.
log = logging.getLogger("lambdalake.alerts")
SMTP_CONN_ID = "lambdalake_smtp"


def notify(settings: Settings, source: str, message: str, severity: str = "error", **details: Any) -> None:
    """Record an alert where on-call people look: the log, the alerts table, the webhook, e-mail."""
    row = _row(source, severity, message, details)
    _record(settings, [row])
    _post(settings, row)
    if settings.alert_email_to:
        _email(settings, row)


def announce_alerts(settings: Settings, alerts: list[dict[str, Any]], txn: Any = None) -> None:
    """The speed layer's newly raised data alerts (rows of the ``alerts`` view) to the log, the
    alerts table (once per micro-batch ``txn``) and the webhook. Each carries its ``alert_id``,
    so a receiver can drop the repeat a crash between recording and storing may cause."""
    rows = []
    for alert in sorted(alerts, key=lambda a: a["alert_id"]):
        value = f"{alert['value']:.2f}" if alert["kind"] != "order_velocity" else f"{alert['value']:.0f} orders"
        message = (f"{alert['kind']}: {alert['entity_id']} at {alert['event_time']:%Y-%m-%d %H:%M:%S} UTC, "
                   f"{value} (threshold {alert['threshold']:g})")
        details = {key: alert[key] for key in alert if key != "date"}
        rows.append(_row("alerts", "warning", message, details, logging.INFO))
    _record(settings, rows, txn)
    for row in rows:
        _post(settings, row)


def _row(source: str, severity: str, message: str, details: dict[str, Any], level: int | None = None) -> dict[str, Any]:
    """An ``ops/alerts`` row, logged (data alerts at INFO: there can be many; they are in the table)."""
    level = level or (logging.ERROR if severity == "error" else logging.WARNING)
    log.log(level, "[%s] %s %s", source, message, details or "")
    return {"at": datetime.now(timezone.utc), "source": source, "severity": severity,
            "message": message, "details": json.dumps(details, default=str, sort_keys=True)}


def _record(settings: Settings, rows: list[dict[str, Any]], txn: Any = None) -> None:
    import pyarrow as pa

    from include.lakehouse import open_reader
    from include.tables import ALERTS, ALERTS_FIELDS, ALERTS_SCHEMA, arrow_schema

    store = open_reader(settings)
    store.ensure_table(ALERTS, ALERTS_SCHEMA)
    store.append(ALERTS, pa.Table.from_pylist(rows, schema=arrow_schema(ALERTS_FIELDS)), txn)


def _post(settings: Settings, row: dict[str, Any]) -> None:
    if not settings.alert_webhook_url:
        return
    request = urllib.request.Request(
        settings.alert_webhook_url, data=json.dumps(row, default=str).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except OSError as exc:  # the alert is already recorded; say the webhook failed
        log.error("alert webhook %s failed: %s", settings.alert_webhook_url, exc)


def _email(settings: Settings, row: dict[str, Any]) -> None:
    """Send the alert through Airflow's SMTP notifier; a failure is logged (the alert is recorded)."""
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier
    from airflow.sdk import Connection
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        Connection.get(SMTP_CONN_ID)
    except AirflowNotFoundException:
        log.error("alert e-mail to %s not sent: the Airflow connection '%s' is not defined",
                  settings.alert_email_to, SMTP_CONN_ID)
        return
    notifier = SmtpNotifier(
        to=[address.strip() for address in settings.alert_email_to.split(",") if address.strip()],
        from_email=settings.alert_email_from or None,
        subject=f"[lambdalake {row['severity']}] {row['source']}: {row['message']}",
        html_content=(f"<p>{html.escape(row['message'])}</p><p>source: {html.escape(row['source'])}, "
                      f"at {row['at']:%Y-%m-%d %H:%M:%S} UTC</p><pre>{html.escape(row['details'])}</pre>"),
        smtp_conn_id=SMTP_CONN_ID,
    )
    try:
        notifier.notify({})
    except Exception as exc:  # noqa: BLE001 - any SMTP or connection failure: the alert is already recorded
        log.error("alert e-mail to %s failed: %s", settings.alert_email_to, exc)


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
