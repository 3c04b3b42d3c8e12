"""lambda_nightly_batch end to end with dag.test(): real tasks, real spark-submit, real tables."""

from __future__ import annotations

import asyncio
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from include.coverage import covered_days
from include import tables
from include.alerts import deadline_missed
from include.config import load_settings
from include.generator import TrafficOptions, generate
from include.lakehouse import open_store
from serving.engine import ServingEngine
from speed_layer.runner import run_stream

PROJECT = Path(__file__).resolve().parents[2]
DAY = date(2026, 11, 20)


@pytest.fixture
def lake(spark, tmp_path, monkeypatch, airflow_db):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAMBDALAKE_SPARK_MASTER", "local[2]")
    monkeypatch.setenv("LAMBDALAKE_SHUFFLE_PARTITIONS", "2")
    settings = load_settings()
    result = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 3,
                      TrafficOptions(orders_per_hour=100, late_fraction=0.05), seed=5, file_minutes=15, progress=False)
    run_stream(settings, available_now=True)
    return settings, result


def nightly_dag():
    dag = DagBag(dag_folder=str(PROJECT / "dags")).dags["lambda_nightly_batch"]
    dag.deadline = None  # Airflow 3.3.2's dag.test() cannot evaluate Deadline Alerts; the scheduler does
    return dag


def views(settings):
    engine = ServingEngine(settings)
    return (engine.rows("SELECT * FROM revenue_by_category_5m ORDER BY window_start, category"),
            engine.rows("SELECT * FROM order_payments ORDER BY order_id"))


@pytest.mark.slow
def test_nightly_dag_rebuilds_reconciles_covers_and_reruns_identically(lake):
    settings, result = lake
    run = nightly_dag().test(run_conf={"date": DAY.isoformat()})
    assert run.state == "success"
    assert DAY in covered_days(open_store(settings))
    revenue, payments = views(settings)
    served = [r for r in revenue if r["window_start"].date() == DAY]
    assert {r["source"] for r in served} == {"batch"}
    assert round(sum(r["revenue"] for r in served), 2) == pytest.approx(result.ledger["revenue_by_category_5m"]["revenue"], abs=0.01)
    reconciliation = ServingEngine(settings).rows(f"SELECT metric, batch_value FROM reconciliation WHERE date = DATE '{DAY}'")
    recovered = {r["metric"]: r["batch_value"] for r in reconciliation}["late_matches_recovered"]
    assert recovered == result.ledger["order_payments"]["late_paid"]

    rerun = nightly_dag().test(run_conf={"date": DAY.isoformat()})
    assert rerun.state == "success"
    assert views(settings) == (revenue, payments)


def test_deadline_callback_records_the_miss(settings, monkeypatch):
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    asyncio.run(deadline_missed({"dag_run": None}, dag_id="lambda_nightly_batch", deadline="2026-11-21T03:30:00Z"))
    alerts = open_store(settings).select_arrow(tables.ALERTS, ["source", "message"]).to_pylist()
    assert alerts == [{"source": "deadline", "message": "deadline missed: lambda_nightly_batch run None is not done in time"}]
