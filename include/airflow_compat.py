"""Narrow workarounds for Airflow bugs: each names its bug and has a test that fails once Airflow
fixes it (tests/dags/test_airflow_compat.py), so it can be removed then."""

from __future__ import annotations

import sys
from typing import TypeVar

Alert = TypeVar("Alert")


def unless_dags_test(alert: Alert) -> Alert | None:
    """``alert``, except under ``airflow dags test``.

    Airflow 3.3.2: after a successful ``airflow dags test`` (or ``dag.test()``) run of a DAG with a
    Deadline Alert, ``DagRun.update_state`` passes the DAG's encoded alert (a dict) where the
    alert's database id belongs, fails with ``'dict' object has no attribute 'hex'`` and the
    command exits 1 for a run that succeeded. ``dags test`` never evaluates deadlines (the
    scheduler does), so leaving the alert out there changes nothing else; scheduled runs keep it.
    """
    return None if sys.argv[1:3] == ["dags", "test"] else alert
