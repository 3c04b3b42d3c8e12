"""### lakehouse_maintenance

Daily housekeeping, safe while the stream writes (the store retries conflicting commits):
compaction of every Delta table (z-ordered by event time for Silver), vacuum of files older than
a week, and checkpoint hygiene (consumed feed files, abandoned temporary files).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from include.notifier import task_failed

with DAG(
    dag_id="lakehouse_maintenance",
    doc_md=__doc__,
    schedule="0 3 * * *",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lambdalake", "maintenance"],
    default_args={"owner": "data-platform", "retries": 2, "retry_delay": timedelta(minutes=10),
                  "on_failure_callback": task_failed},
) as dag:

    @task
    def compact_and_vacuum() -> list[dict]:
        from batch_layer.maintenance import compact_and_vacuum
        from include.config import load_settings

        return compact_and_vacuum(load_settings())

    @task(multiple_outputs=True)
    def checkpoint_hygiene() -> dict:
        from batch_layer.maintenance import checkpoint_hygiene
        from include.config import load_settings

        return checkpoint_hygiene(load_settings())

    compact_and_vacuum() >> checkpoint_hygiene()


if __name__ == "__main__":
    dag.test()
