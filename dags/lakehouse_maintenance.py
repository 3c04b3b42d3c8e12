"""### lakehouse_maintenance

Housekeeping, safe while the stream writes (the store retries conflicting commits): compaction of
every Delta table (z-ordered by event time for Silver), vacuum of files older than a week, and
checkpoint hygiene (consumed feed files, abandoned temporary files).

**examine_lake** then looks for what a crash or a producer left behind, as `lambdalake doctor`
does (read-only): torn checkpoint or Delta files, a landing file that grew after the stream read
it, leftovers of dead writers, a nightly rerun that never published. Each finding a person must
decide on raises an alert with the command to run. The ones `doctor --repair` fixes safely are
repaired only with `LAMBDALAKE_MAINTENANCE_REPAIRS=true` (else alerted with that command too); it
runs after a failed compaction as well.

**Data-aware**: it runs when `lambda_nightly_batch` has published the batch views (the assets
`lambdalake://batch/<view>`), not on a clock, and at most once a UTC day: **maintenance_due**
skips the run when a maintenance has finished today already (a backfill publishes many days in a
row). A run triggered by hand always maintains.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Asset, task

from include.assets import BATCH_VIEWS
from include.notifier import task_failed

with DAG(
    dag_id="lakehouse_maintenance",
    doc_md=__doc__,
    schedule=[Asset(uri) for uri in BATCH_VIEWS],
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    tags=["lambdalake", "maintenance"],
    default_args={"owner": "data-platform", "retries": 2, "retry_delay": timedelta(minutes=10),
                  "on_failure_callback": task_failed},
) as dag:

    @task.short_circuit
    def maintenance_due(**context) -> bool:
        from batch_layer.maintenance import maintenance_due
        from include.config import load_settings

        return context["dag_run"].run_type == "manual" or maintenance_due(load_settings())

    @task
    def compact_and_vacuum() -> list[dict]:
        from batch_layer.maintenance import compact_and_vacuum
        from include.config import load_settings

        return compact_and_vacuum(load_settings())

    @task(multiple_outputs=True)
    def checkpoint_hygiene() -> dict:
        from batch_layer.maintenance import checkpoint_hygiene, record_maintenance
        from include.config import load_settings

        settings = load_settings()
        removed = checkpoint_hygiene(settings)
        record_maintenance(settings)
        return removed

    @task(multiple_outputs=True, trigger_rule="none_skipped")  # also when compaction failed: a crash may be why
    def examine_lake() -> dict:
        from batch_layer.maintenance import examine_lake
        from include.config import load_settings

        return examine_lake(load_settings())

    maintenance_due() >> compact_and_vacuum() >> checkpoint_hygiene() >> examine_lake()


if __name__ == "__main__":
    dag.test()
