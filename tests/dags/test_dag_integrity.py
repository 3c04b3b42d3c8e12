"""Every DAG imports cleanly, without heavy imports, with an owner, tags, docs, retries, its
promised deadline and its data-aware schedule; @tasks that return a dict say multiple_outputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import AssetOrTimeSchedule
from airflow.sdk.definitions.timetables.assets import AssetTriggeredTimetable

from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]

DAG_IDS = {"lambda_nightly_batch", "speed_layer_supervisor", "lakehouse_maintenance"}
BATCH_ASSETS = {f"lambdalake://batch/{name}" for name in (
    "revenue_by_category_5m", "order_payments", "traffic_by_page_10m", "device_health_5m", "user_sessions",
    "alerts", "customers", "customers_history", "revenue_by_segment_1h")}


@pytest.fixture(scope="module")
def dagbag():
    return DagBag(dag_folder=str(PROJECT / "dags"))


def test_all_dags_import_without_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dags) == DAG_IDS


# A retry helps every task but the supervisor's: its next run, 5 minutes on, is its real retry.
RETRIES = {"lambda_nightly_batch": 2, "lakehouse_maintenance": 2, "speed_layer_supervisor": 1}


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_tags_retries_owner_and_docs(dagbag, dag_id):
    dag = dagbag.dags[dag_id]
    assert "lambdalake" in dag.tags and len(dag.tags) >= 2
    assert dag.doc_md.startswith(f"### {dag_id}\n") and dag.max_active_runs == 1
    for task in dag.tasks:
        assert task.owner == "data-platform", task.task_id
        assert task.retries >= RETRIES[dag_id], task.task_id
        assert task.on_failure_callback, task.task_id


def test_the_supervisor_retries_once_within_its_run_and_says_why(dagbag):
    dag = dagbag.dags["speed_layer_supervisor"]
    (task,) = dag.tasks
    assert task.retries == 1 and task.retry_delay < dag.dagrun_timeout < dag.timetable.delta
    assert "One retry, not two" in dag.doc_md


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_tasks_that_return_a_dict_say_multiple_outputs(dagbag, dag_id):
    for task in dagbag.dags[dag_id].tasks:
        returns = getattr(getattr(task, "python_callable", None), "__annotations__", {}).get("return")
        if returns in ("dict", dict) or str(returns).startswith("dict["):
            assert task.multiple_outputs, task.task_id


def test_ruff_flags_an_implicit_dict_return(tmp_path):
    """pyproject.toml's ruff configuration keeps the Airflow rules on (AIR202 among them)."""
    ruff = Path(sys.executable).parent / "ruff"
    if not ruff.exists():
        pytest.skip(f"ruff is not installed in {ruff.parent} (make install installs it)")
    probe = tmp_path / "dags" / "probe.py"
    probe.parent.mkdir()
    probe.write_text("from airflow.sdk import task\n\n\n@task\ndef probe() -> dict:\n    return {}\n")
    config = ["--config", str(PROJECT / "pyproject.toml")]
    flagged = subprocess.run([ruff, "check", *config, str(probe)],
                             capture_output=True, text=True)
    assert "airflow-task-implicit-multiple-outputs" in flagged.stdout, flagged.stdout + flagged.stderr
    clean = subprocess.run([ruff, "check", *config, str(PROJECT / "dags")], capture_output=True, text=True)
    assert clean.returncode == 0, clean.stdout


def test_nightly_batch_has_its_deadline_and_assets(dagbag):
    dag = dagbag.dags["lambda_nightly_batch"]
    (alert,) = dag.deadline
    assert alert.interval.total_seconds() == 3 * 3600
    assert "deadline_missed" in str(alert.callback.path if hasattr(alert.callback, "path") else alert.callback)
    assert dag.catchup is True
    outlets = {str(a.uri) for a in dag.get_task("publish_coverage").outlets}
    assert outlets == BATCH_ASSETS
    recompute = dag.get_task("recompute")
    assert recompute.task_type == "SparkJobOperator" and recompute._conn_id == "lambdalake_spark"


def test_the_nightly_batch_runs_daily_and_on_the_streams_day_complete_event(dagbag):
    dag = dagbag.dags["lambda_nightly_batch"]
    assert isinstance(dag.timetable, AssetOrTimeSchedule)
    assert dag.timetable.timetable.expression == "30 0 * * *"
    assert {a.uri for a in dag.timetable.asset_condition.objects} == {"lambdalake://stream/day_complete"}
    assert dag.get_task("wait_until_day_complete").task_type == "DecoratedSensorOperator"  # the fallback


def test_maintenance_runs_on_the_published_batch_views_not_a_clock(dagbag):
    dag = dagbag.dags["lakehouse_maintenance"]
    assert type(dag.timetable) is AssetTriggeredTimetable
    assert {a.uri for a in dag.timetable.asset_condition.objects} == BATCH_ASSETS
    assert dag.get_task("maintenance_due").downstream_task_ids == {"compact_and_vacuum"}


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
