"""lambda_nightly_batch end to end: the standard `airflow dags test` in a fresh Airflow home with
no connection and no PATH entry for Spark, and the fail-fast path through dag.test(). (The batch's
idempotency is tested end to end in tests/e2e.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from include import tables
from include.notifier import deadline_missed
from include.coverage import covered_days
from include.lakehouse import open_store
from serving.engine import ServingEngine

PROJECT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DAY = date(2026, 11, 20)
LAKE_ENV = {"LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2"}


@pytest.fixture(scope="module")
def lake(streamed_lake, tmp_path_factory, airflow_db):
    return streamed_lake.copy_to(tmp_path_factory.mktemp("nightly") / "home"), streamed_lake.result


@pytest.fixture
def lake_env(lake, monkeypatch):
    settings, _ = lake
    for key, value in {**LAKE_ENV, "LAMBDALAKE_HOME": str(settings.home)}.items():
        monkeypatch.setenv(key, value)
    return lake


def nightly_dag():
    dag = DagBag(dag_folder=str(PROJECT / "dags")).dags["lambda_nightly_batch"]
    dag.deadline = None  # Airflow 3.3.2's dag.test() bug: see include/airflow_compat.unless_dags_test
    return dag


@pytest.mark.slow
@pytest.mark.parametrize("problem, env, line", [
    ("no such binary", {"AIRFLOW_CONN_LAMBDALAKE_SPARK": json.dumps({"conn_type": "spark", "host": "local[2]",
                                                                     "extra": {"spark-binary": "spark3-submit"}})},
     "Spark cannot run: 'spark3-submit' is neither on PATH nor in pyspark's bin"),
    ("bad master", {"LAMBDALAKE_SPARK_MASTER": "yarm"}, "Spark cannot run: master 'yarm' is not local[N]"),
])
def test_spark_that_cannot_run_fails_the_task_at_once_without_retry(lake_env, monkeypatch, capfd, problem, env, line):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    run = nightly_dag().test(run_conf={"date": DAY.isoformat()})
    # Well under the 5-minute retry delay, the tasks before it included (a busy machine takes ~40 s).
    assert time.monotonic() - started < 240
    assert run.state == "failed"
    recompute = run.get_task_instance("recompute")
    assert (recompute.state, recompute.try_number) == ("failed", 1)
    output = capfd.readouterr()
    assert line in output.out + output.err


@pytest.fixture(scope="module")
def dags_test_run(lake, tmp_path_factory):
    """One standard `airflow dags test` of the nightly DAG in a fresh Airflow home, with no
    connection and no PATH entry for Spark, and lineage on: the provider's file transport writes
    the run's OpenLineage events to a file."""
    settings, result = lake
    home = tmp_path_factory.mktemp("dags-test")
    events = home / "openlineage.jsonl"
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW_CONN_")}
    env.update(
        LAKE_ENV, LAMBDALAKE_HOME=str(settings.home), AIRFLOW_HOME=str(home / "airflow"),
        PATH=os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != VENV_BIN),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events), "append": True}),
        AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO="true",
        AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT="60",  # a busy 2-core machine: emission must not be cut off
    )
    subprocess.run([VENV_BIN / "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([VENV_BIN / "airflow", "dags", "test", "lambda_nightly_batch", "2026-11-21"],
                         env=env, capture_output=True, text=True, timeout=900)
    return settings, result, run, events


@pytest.mark.slow
def test_airflow_dags_test_in_a_fresh_home_without_connection_or_path(dags_test_run):
    settings, result, run, _ = dags_test_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    assert DAY in covered_days(open_store(settings))
    revenue = ServingEngine(settings).rows("SELECT * FROM revenue_by_category_5m")
    served = [r for r in revenue if r["window_start"].date() == DAY]
    assert {r["source"] for r in served} == {"batch"}
    assert round(sum(r["revenue"] for r in served), 2) == pytest.approx(
        result.ledger["revenue_by_category_5m"]["revenue"], abs=0.01)
    reconciliation = ServingEngine(settings).rows(
        f"SELECT metric, batch_value FROM reconciliation WHERE date = DATE '{DAY}'")
    recovered = {r["metric"]: r["batch_value"] for r in reconciliation}["late_matches_recovered"]
    assert recovered == result.ledger["order_payments"]["late_paid"]


TOPICS = ["clicks", "orders", "payments", "customers_cdc", "sensors"]
VIEWS = ["revenue_by_category_5m", "order_payments", "traffic_by_page_10m", "device_health_5m", "user_sessions",
         "alerts", "customers", "customers_history", "revenue_by_segment_1h"]


@pytest.mark.slow
def test_the_run_reports_bronze_to_batch_views_to_reconciliation_to_openlineage(dags_test_run):
    settings, _, run, events_file = dags_test_run
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines()]

    def of_task(task_id: str) -> dict[str, dict]:
        return {e["eventType"]: e for e in events if e["job"]["name"] == f"lambda_nightly_batch.{task_id}"}

    def tables_of(datasets: list[dict]) -> set[str]:
        assert {d["namespace"] for d in datasets} <= {"file"}
        return {d["name"] for d in datasets}

    lake = str(settings.lakehouse_dir)
    bronze = {f"{lake}/bronze/{topic}" for topic in TOPICS}
    batch = {f"{lake}/batch/{view}" for view in VIEWS}
    recompute, reconcile = of_task("recompute"), of_task("reconcile")
    for step in (recompute, reconcile):
        assert {"START", "COMPLETE"} <= step.keys()
    for event in (recompute["START"], recompute["COMPLETE"]):
        assert tables_of(event["inputs"]) == bronze
        assert tables_of(event["outputs"]) == batch | {f"{lake}/ops/batch_coverage"}  # a rerun marks it first
    for event in (reconcile["START"], reconcile["COMPLETE"]):
        assert batch | {f"{lake}/speed/{view}" for view in VIEWS} == tables_of(event["inputs"])
        assert f"{lake}/reconciliation" in tables_of(event["outputs"])

    # The day's partitions, as subset facets: Bronze's event day read, each view's day replaced.
    orders = next(d for d in recompute["START"]["inputs"] if d["name"] == f"{lake}/bronze/orders")
    read = orders["inputFacets"]["subset"]["inputCondition"]["partitions"]
    assert {"dimensions": {"event_date": DAY.isoformat()}} in read
    order_payments = next(d for d in recompute["COMPLETE"]["outputs"] if d["name"] == f"{lake}/batch/order_payments")
    written = order_payments["outputFacets"]["subset"]["outputCondition"]["partitions"]
    assert written == [{"dimensions": {"date": DAY.isoformat()}}]

    # The Python tasks, through the hook-lineage collector: on COMPLETE. (`airflow dags test` runs
    # every task in one process, so a later task's events also carry an earlier one's tables.)
    assert tables_of(of_task("publish_coverage")["COMPLETE"]["outputs"]) == {f"{lake}/ops/batch_coverage"}
    checked = tables_of(of_task("data_quality")["COMPLETE"]["inputs"])
    assert {f"{lake}/reconciliation", f"{lake}/ops/ingest_batches"} <= checked

    # Each task's run is a child of the DAG run's, and the Spark application got the task's identity.
    dag_run = next(e for e in events if e["job"]["name"] == "lambda_nightly_batch" and e["eventType"] == "COMPLETE")
    assert recompute["START"]["run"]["facets"]["parent"]["run"]["runId"] == dag_run["run"]["runId"]
    assert f"spark.openlineage.parentRunId={recompute['START']['run']['runId']}" in run.stdout + run.stderr


def test_deadline_callback_records_the_miss(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    asyncio.run(deadline_missed({"dag_run": None}, dag_id="lambda_nightly_batch", deadline="2026-11-21T03:30:00Z"))
    alerts = open_store(settings).select_arrow(tables.ALERTS, ["source", "message"]).to_pylist()
    assert alerts == [
        {"source": "deadline", "message": "deadline missed: lambda_nightly_batch run None is not done in time"}
    ]
