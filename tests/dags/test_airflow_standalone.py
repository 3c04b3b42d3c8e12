"""The real thing: `airflow standalone` in a temporary home, the nightly DAG triggered through the
REST API with a token from /auth/token, and the run observed until it succeeds."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from datetime import date, datetime, timedelta, timezone

import pytest

from include.coverage import covered_days
from include.config import load_settings
from include.lakehouse import open_store
from lambdalake.platform import admin_password, down, start_airflow

DAG_ID = "lambda_nightly_batch"
DAY = date(2026, 11, 20)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(method, url, token=None, body=None):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"null")


@pytest.mark.slow
def test_nightly_batch_triggered_through_the_rest_api_succeeds(streamed_lake, tmp_path, monkeypatch):
    tomorrow = datetime.now(timezone.utc).date() + timedelta(days=1)
    for key, value in {"LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2",
                       # No automatic catch-up runs: only the run this test triggers.
                       "LAMBDALAKE_BATCH_START_DATE": tomorrow.isoformat()}.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(home=streamed_lake.copy_to(tmp_path / "home").home)
    try:
        url = start_airflow(settings, port=free_port())
        token = call("POST", f"{url}/auth/token",
                     body={"username": "admin", "password": admin_password(settings)})["access_token"]
        deadline = time.monotonic() + 180
        while True:  # the DAG processor registers the DAG shortly after start-up
            try:
                call("PATCH", f"{url}/api/v2/dags/{DAG_ID}", token, {"is_paused": False})
                break
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(3)
        run = call("POST", f"{url}/api/v2/dags/{DAG_ID}/dagRuns", token,
                   {"logical_date": None, "conf": {"date": DAY.isoformat()}})
        run_id = urllib.parse.quote(run["dag_run_id"], safe="")
        deadline = time.monotonic() + 900
        state = run["state"]
        while state not in ("success", "failed") and time.monotonic() < deadline:
            time.sleep(5)
            state = call("GET", f"{url}/api/v2/dags/{DAG_ID}/dagRuns/{run_id}", token)["state"]
        assert state == "success"
        assert DAY in covered_days(open_store(settings))
    finally:
        down(settings)
