"""Airflow reads its configuration when first imported: point it at a throwaway home first."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="lambdalake-airflow-"))
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    # No connection and no PATH entry for Spark: the DAGs must find both themselves.
}
os.environ.update(AIRFLOW_ENV)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    subprocess.run([Path(sys.executable).parent / "airflow", "db", "migrate"], check=True, capture_output=True)
    return AIRFLOW_HOME
