"""### lambda_nightly_batch

The Lambda architecture's batch layer, one run per event-time day (UTC). Runs come from two
sources, one run at a time:

- **the clock**: daily at 00:30 UTC (catchup on); a run with logical date D processes day D-1,
  the day that just ended;
- **the stream**: when every topic's watermark has passed a day's end plus the allowed lateness,
  the stream posts an event of the asset `lambdalake://stream/day_complete` (extra
  `{"date": "YYYY-MM-DD"}`) through Airflow's REST API; the run it triggers processes that day.

Trigger with conf `{"date": "YYYY-MM-DD"}` to process (or re-process) another day, or backfill a
date range.

1. **day_to_process** picks the day: the conf's, the stream's event's, or the day before.
2. **wait_until_day_complete** (sensor, reschedule mode) waits until no more on-time events can
   come: the stream's watermark passed the day's end plus the allowed lateness, or the wall clock
   did and the stream has consumed everything landed (a quiet stream does not block the night).
   It is the fallback when no event comes; after an event it passes at its first poke.
3. **batch_needed** skips the rest (but not the restatements) when another run has covered the day
   and its Bronze input is unchanged, so the scheduled and the event's run do the work once.
4. **bronze_fingerprint** records the Bronze input the run reads (to detect restatements).
5. **recompute** and **reconcile** run as Spark applications (`SparkJobOperator`: spark-submit
   from the installed pyspark, the `lambdalake_spark` connection or else
   `LAMBDALAKE_SPARK_MASTER`, default `local[*]`), so the heavy work runs in its own JVM and a
   cluster can take it. When Spark cannot run at all the task fails at once, without retries.
6. **data_quality** fails the run loudly unless the numbers add up (accounting identities,
   reconciliation drift).
7. **publish_coverage** marks the day batch-covered and publishes the run: the version of every
   table it wrote; the serving layer then answers the day from those versions, all at once (a
   rerun that fails before it leaves the day served from the previous run). Its outlets, the
   assets `lambdalake://batch/<view>`, schedule `lakehouse_maintenance`.
8. **restate_stale_day** re-runs any covered day whose Bronze input changed since it was built.

With OpenLineage on (`docs/lineage.md`), the tasks report the tables they read and write: Bronze's
partitions → `batch/<view>` → `reconciliation`, and the ops tables.

A Deadline Alert fires when a run is not done 3 hours after it was queued; the miss is recorded
in `ops/alerts` (and sent to the webhook when configured).
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import (
    DAG, Asset, AssetOrTimeSchedule, AsyncCallback, CronTriggerTimetable, DeadlineAlert, DeadlineReference, task,
)

from batch_layer.job import lineage as job_lineage
from include.airflow_compat import unless_dags_test
from include.assets import BATCH_VIEWS, DAY_COMPLETE
from include.notifier import deadline_missed, task_failed
from include.config import load_settings
from include.spark_submit import SparkJobOperator

PROJECT = Path(__file__).resolve().parent.parent
SPARK_JOB = str(PROJECT / "batch_layer" / "job.py")
# The Spark application runs the same Python (and so the same packages) as Airflow.
SPARK_CONF = {"spark.pyspark.python": sys.executable, "spark.pyspark.driver.python": sys.executable}
DAY = "{{ ti.xcom_pull(task_ids='day_to_process') }}"
DAY_COMPLETE_ASSET = Asset(DAY_COMPLETE)


def spark_step(step: str) -> SparkJobOperator:
    return SparkJobOperator(
        task_id=step, application=SPARK_JOB, application_args=[step, "--date", DAY],
        conf=SPARK_CONF, name=f"lambdalake-{step}", lineage=job_lineage,
    )


with DAG(
    dag_id="lambda_nightly_batch",
    doc_md=__doc__,
    schedule=AssetOrTimeSchedule(timetable=CronTriggerTimetable("30 0 * * *", timezone="UTC"),
                                 assets=[DAY_COMPLETE_ASSET]),
    start_date=datetime.combine(load_settings().batch_start_date, datetime.min.time()),
    catchup=True,
    max_active_runs=1,
    tags=["lambdalake", "batch-layer"],
    default_args={"owner": "data-platform", "retries": 2, "retry_delay": timedelta(minutes=5),
                  "on_failure_callback": task_failed},
    deadline=unless_dags_test(DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(hours=3),
        callback=AsyncCallback(deadline_missed, kwargs={"dag_id": "lambda_nightly_batch"}),
    )),
) as dag:

    @task
    def day_to_process(**context) -> str:
        from batch_layer.nightly import day_for_run

        dag_run = context["dag_run"]
        events = context["triggering_asset_events"].get(DAY_COMPLETE_ASSET, [])
        announced = [event.extra["date"] for event in events if "date" in event.extra]
        return day_for_run(dag_run.logical_date or dag_run.run_after, dag_run.conf, announced)

    @task.sensor(poke_interval=300, timeout=12 * 3600, mode="reschedule")
    def wait_until_day_complete(day: str) -> bool:
        from batch_layer.nightly import day_is_complete
        from include.config import load_settings

        return day_is_complete(load_settings(), day)

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def batch_needed(day: str, **context) -> bool:
        from batch_layer.nightly import batch_needed
        from include.config import load_settings

        return batch_needed(load_settings(), day, context["dag_run"].conf)

    @task(multiple_outputs=True)
    def bronze_fingerprint(day: str) -> dict:
        from datetime import date

        from include.coverage import bronze_fingerprint
        from include.config import load_settings
        from include.lakehouse import open_reader

        settings = load_settings()
        return bronze_fingerprint(open_reader(settings), settings, date.fromisoformat(day))

    @task
    def data_quality(day: str, **context) -> list[str]:
        from datetime import date

        from batch_layer.nightly import check_data_quality, data_quality_lineage
        from include.config import load_settings
        from include.lineage import report

        settings, day = load_settings(), date.fromisoformat(day)
        report(settings, data_quality_lineage(day), context["task"])
        return check_data_quality(settings, day)

    @task(outlets=[Asset(uri) for uri in BATCH_VIEWS])
    def publish_coverage(day: str, fingerprint: dict, **context) -> str:
        from datetime import date

        from include import tables
        from include.coverage import mark_covered
        from include.config import load_settings
        from include.lakehouse import open_reader
        from include.lineage import Lineage, report

        settings = load_settings()
        mark_covered(open_reader(settings), date.fromisoformat(day), fingerprint, context["run_id"])
        report(settings, Lineage(writes={tables.BATCH_COVERAGE: []}), context["task"])
        return day

    @task(trigger_rule="none_failed")  # also after a run that had nothing to do
    def stale_days() -> list[list[str]]:
        from include.coverage import stale_days
        from include.config import load_settings
        from include.lakehouse import open_reader

        settings = load_settings()
        return [["batch", "--date", day.isoformat()] for day in stale_days(open_reader(settings), settings)]

    day = day_to_process()
    fingerprint = bronze_fingerprint(day)
    published = publish_coverage(day, fingerprint)
    stale = stale_days()
    restate = SparkJobOperator.partial(
        task_id="restate_stale_day", application=SPARK_JOB, conf=SPARK_CONF, name="lambdalake-restate",
        lineage=job_lineage,
    ).expand(application_args=stale)
    recompute, reconcile = spark_step("recompute"), spark_step("reconcile")
    wait_until_day_complete(day) >> batch_needed(day) >> fingerprint
    fingerprint >> recompute >> reconcile >> data_quality(day) >> published >> stale


if __name__ == "__main__":
    dag.deadline = None  # Airflow 3.3.2's dag.test() bug: see include/airflow_compat.unless_dags_test
    dag.test()
