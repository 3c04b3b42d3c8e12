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
    # The tasks before it included (a busy machine slows them), and still short of the 5 minutes a retry waits.
    assert time.monotonic() - started < 240
    assert run.state == "failed"
    recompute = run.get_task_instance("recompute")
    assert (recompute.state, recompute.try_number) == ("failed", 1)
    output = capfd.readouterr()
    assert line in output.out + output.err


@pytest.mark.slow
def test_airflow_dags_test_in_a_fresh_home_without_connection_or_path(lake_env, tmp_path):
    settings, result = lake_env
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p) != VENV_BIN)
    env = {key: value for key, value in os.environ.items() if not key.startswith("AIRFLOW_CONN_")}
    env.update(PATH=path, AIRFLOW_HOME=str(tmp_path / "airflow"))
    subprocess.run([VENV_BIN / "airflow", "db", "migrate"], env=env, check=True, capture_output=True)
    run = subprocess.run([VENV_BIN / "airflow", "dags", "test", "lambda_nightly_batch", "2026-11-21"],
                         env=env, capture_output=True, text=True, timeout=900)
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


def test_deadline_callback_records_the_miss(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    asyncio.run(deadline_missed({"dag_run": None}, dag_id="lambda_nightly_batch", deadline="2026-11-21T03:30:00Z"))
    alerts = open_store(settings).select_arrow(tables.ALERTS, ["source", "message"]).to_pylist()
    assert alerts == [
        {"source": "deadline", "message": "deadline missed: lambda_nightly_batch run None is not done in time"}
    ]
