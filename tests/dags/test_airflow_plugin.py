"""The Airflow plugin without a running Airflow: the installed project registers it, importing it
costs Airflow's processes nothing heavy, and its API answers nobody who is not signed in. In a
real Airflow UI, in a browser: tests/dags/test_airflow_standalone.py."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import pytest
from fastapi.testclient import TestClient

from lambdalake.airflow_plugin import URL_PREFIX, LambdalakePlugin, dashboard_app


def test_the_installed_project_registers_the_plugin():
    found = {entry.name: entry for entry in entry_points(group="airflow.plugins")}
    assert "lambdalake" in found, "no airflow.plugins entry point: reinstall the project (make install)"
    assert found["lambdalake"].load() is LambdalakePlugin


def test_importing_the_plugin_imports_nothing_heavy():
    code = ("import sys\nimport lambdalake.airflow_plugin\n"
            "print(sorted(m for m in ('pyspark', 'pyarrow', 'deltalake', 'duckdb', 'serving') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def plugin_app(settings, monkeypatch):
    """The app Airflow's API server mounts, on an empty lake (the settings' home)."""
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    dashboard_app.cache_clear()
    (entry,) = LambdalakePlugin().fastapi_apps
    (view,) = LambdalakePlugin.external_views
    assert entry["url_prefix"] == URL_PREFIX and view["href"] == f"{URL_PREFIX}/"
    with TestClient(entry["app"]) as client:
        yield client
    dashboard_app.cache_clear()


@pytest.mark.parametrize("method, path", [("GET", "/api/status"), ("POST", "/api/query"), ("GET", "/metrics")])
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer "}])
def test_its_api_refuses_requests_without_an_airflow_login(plugin_app, method, path, headers):
    answer = plugin_app.request(method, path, json={"sql": "SELECT * FROM dlq"}, headers=headers)
    assert answer.status_code == 401


def test_its_page_is_the_dashboards_and_holds_no_data(plugin_app):
    page = plugin_app.get("/")
    assert page.status_code == 200 and "<title>lambdalake</title>" in page.text


def test_a_wrong_setting_turns_the_dashboard_off_not_airflows_api_server(monkeypatch, caplog):
    monkeypatch.setenv("LAMBDALAKE_WATERMARK_DELAY", "-5 minutes")
    dashboard_app.cache_clear()
    assert LambdalakePlugin().fastapi_apps == []
    assert "the lambdalake dashboard is off: invalid setting LAMBDALAKE_WATERMARK_DELAY" in caplog.text
