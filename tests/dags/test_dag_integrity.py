"""Every DAG imports cleanly, without heavy imports, with tags, retries and its promised deadline."""

from __future__ import annotations

import subprocess
import sys

import pytest
from airflow.dag_processing.dagbag import DagBag

from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

DAG_IDS = {"lambda_nightly_batch", "speed_layer_supervisor", "lakehouse_maintenance"}


@pytest.fixture(scope="module")
def dagbag():
    return DagBag(dag_folder=str(PROJECT / "dags"))


def test_all_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_tags_retries_owner_and_docs(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert "lambdalake" in dag.tags
    assert dag.doc_md and dag.max_active_runs == 1
    for task in dag.tasks:
        assert task.retries >= 1, task.task_id
        assert task.owner == "data-platform"


def test_nightly_batch_has_its_deadline_and_assets(dagbag):
    dag = dagbag.dags["lambda_nightly_batch"]
    (alert,) = dag.deadline
    assert alert.interval.total_seconds() == 3 * 3600
    assert "deadline_missed" in str(alert.callback.path if hasattr(alert.callback, "path") else alert.callback)
    assert dag.catchup is True
    outlets = {str(a.uri) for a in dag.get_task("publish_coverage").outlets}
    assert outlets == {f"lambdalake://batch/{name}" for name in (
        "revenue_by_category_5m", "order_payments", "traffic_by_page_10m", "device_health_5m", "user_sessions",
        "alerts", "customers", "customers_history", "revenue_by_segment_1h")}
    recompute = dag.get_task("recompute")
    assert recompute.task_type == "SparkJobOperator" and recompute._conn_id == "lambdalake_spark"


@pytest.mark.parametrize("name", ["lambda_nightly_batch", "speed_layer_supervisor", "lakehouse_maintenance"])
def test_no_heavy_imports_at_parse_time(name):
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('d', r'{PROJECT / 'dags' / (name + '.py')}')\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'deltalake', 'duckdb') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"
