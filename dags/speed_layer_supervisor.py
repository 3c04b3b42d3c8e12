"""### speed_layer_supervisor

Keeps the speed layer running. Every 5 minutes: starts the stream if it is not running, restarts
it when it is dead (no process, or no heartbeat) or stalled (no progress while landed input
waits), with exponential backoff and a cap on restarts per hour, after which it alerts instead of
looping; and alerts when the speed views fall behind the freshness SLA (event-time lag). Every
decision is recorded in `ops/supervisor_events` (shown by `lambdalake status`).

A stream it starts gets the Airflow connection `lambdalake_airflow` when it is defined, to post
the asset events that trigger `lambda_nightly_batch` (see `include/airflow_events.py`).

**One retry, not two**: the task retries once, 30 s later, for a passing failure (a commit
conflict, a heartbeat caught mid-write). The next run, 5 minutes on, is the real retry: each run
diagnoses afresh, and a restart alone may take 90 s (the stream's graceful stop), so a second
retry would not fit in the run's 4 minutes and would only stack restarts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from include.notifier import task_failed

with DAG(
    dag_id="speed_layer_supervisor",
    doc_md=__doc__,
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=4),
    tags=["lambdalake", "speed-layer"],
    default_args={"owner": "data-platform", "retries": 1, "retry_delay": timedelta(seconds=30),
                  "on_failure_callback": task_failed},
) as dag:

    @task(multiple_outputs=True)
    def supervise_stream(**context) -> dict:
        from include import tables
        from include.airflow_events import connection_env
        from include.config import load_settings
        from include.lineage import Lineage, report
        from speed_layer.supervisor import supervise

        settings = load_settings()
        decision = supervise(settings, stream_env=connection_env())
        report(settings, Lineage(reads={tables.INGEST_BATCHES: []}, writes={tables.SUPERVISOR_EVENTS: []}),
               context["task"])
        return {key: str(value) for key, value in decision.items()}

    supervise_stream()


if __name__ == "__main__":
    dag.test()
