"""The Airflow bug include/airflow_compat.py works around, checked on Airflow itself: the first test
fails once Airflow fixes it (then remove the workaround), the second while the workaround works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

AIRFLOW = Path(sys.executable).parent / "airflow"
PROBE = '''
from datetime import datetime, timedelta

from airflow.sdk import DAG, AsyncCallback, DeadlineAlert, DeadlineReference, task

from include.airflow_compat import unless_dags_test
from include.notifier import deadline_missed

alert = DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=timedelta(hours=1),
                      callback=AsyncCallback(deadline_missed))
with DAG("deadline_probe", schedule=None, start_date=datetime(2026, 1, 1), deadline={deadline}) as dag:
    @task
    def noop() -> int:
        return 1

    noop()
'''


def dags_test(tmp_path: Path, deadline: str) -> subprocess.CompletedProcess:
    folder = tmp_path / "dags"
    folder.mkdir()
    (folder / "deadline_probe.py").write_text(PROBE.format(deadline=deadline))
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(folder)}
    return subprocess.run([AIRFLOW, "dags", "test", "deadline_probe"], env=env, capture_output=True, text=True,
                          timeout=300)


def test_airflow_still_fails_dags_test_of_a_dag_with_a_deadline(airflow_db, tmp_path):
    run = dags_test(tmp_path, "alert")
    if run.returncode == 0:
        pytest.fail("Airflow's `dags test` now passes with a Deadline Alert: "
                    "remove include/airflow_compat.unless_dags_test")
    assert "'dict' object has no attribute 'hex'" in run.stdout + run.stderr


def test_the_workaround_lets_dags_test_exit_0(airflow_db, tmp_path):
    run = dags_test(tmp_path, "unless_dags_test(alert)")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
