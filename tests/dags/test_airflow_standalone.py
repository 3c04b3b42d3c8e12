"""The real thing: `lambdalake up` (airflow standalone, the generator, lambdalake serve, and the
stream the supervisor starts) on a streamed lake. Every service listens on localhost
only; the stream's day-complete asset event, posted through the REST API with the connection `up`
hands the stream, runs the nightly batch for that day, whose published assets run the
maintenance; a person signed in to Airflow's UI sees the dashboard in it (the plugin)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
import urllib.parse
import urllib.request
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest
from browser import PANELS, Chromium, chromium_binary, panel_states

from batch_layer.maintenance import last_maintenance
from batch_layer.nightly import day_is_complete, run_batch
from include.airflow_events import AirflowApi
from include.assets import DAY_COMPLETE
from include.config import ConfigError, load_settings
from include.coverage import covered_days
from include.heartbeat import read_heartbeat
from include.lakehouse import open_store
from include.notifier import notify
from include.processes import stop_group
from lambdalake.airflow_plugin import URL_PREFIX
from lambdalake.platform import PROJECT, admin_password, airflow_env, down, up
from speed_layer.supervisor import stop_stream, stream_pid

DAY = date(2026, 11, 20)
NIGHTLY, MAINTENANCE, SUPERVISOR = "lambda_nightly_batch", "lakehouse_maintenance", "speed_layer_supervisor"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(method, url, token=None, body=None, timeout=60):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


class Platform:
    def __init__(self, settings, url: str, port: int, ports: set[int]) -> None:
        self.settings, self.url, self.port, self.ports = settings, url, port, ports
        # The API server's first answers can be slow on a busy machine.
        self.token = call("POST", f"{url}/auth/token", body={"username": "admin", "password": admin_password(settings)},
                          timeout=180)["access_token"]

    def api(self, method, path, body=None):
        return call(method, f"{self.url}/api/v2{path}", self.token, body)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        deadline = time.monotonic() + 180
        while True:  # the DAG processor registers the DAGs shortly after start-up
            try:
                self.api("PATCH", f"/dags/{dag_id}", {"is_paused": paused})
                return
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(3)

    def finished_run(self, dag_id: str, timeout: float, watch) -> dict:
        """The first asset-triggered run of ``dag_id``, once it has finished; ``watch`` is called
        while waiting."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self.api("GET", f"/dags/{dag_id}/dagRuns?run_type=asset_triggered")["dag_runs"]
            if runs and runs[0]["state"] in ("success", "failed"):
                return runs[0]
            watch()
            time.sleep(3)
        pytest.fail(f"no finished asset-triggered run of {dag_id} within {timeout:.0f}s")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str]:
        quoted = urllib.parse.quote(run_id, safe="")
        instances = self.api("GET", f"/dags/{dag_id}/dagRuns/{quoted}/taskInstances")["task_instances"]
        return {ti["task_id"]: ti["state"] for ti in instances if ti["map_index"] == -1}


def started_processes(settings) -> list[psutil.Process]:
    """What `up` started and the stream, with every process under them: an Airflow task runs in a
    process group of its own, and the Spark drivers it starts under it."""
    found = {}
    for path in settings.run_dir.glob("*.pid"):
        try:
            root = psutil.Process(int(path.read_text()))
            for process in [root, *root.children(recursive=True)]:
                found[process.pid] = process
        except (psutil.Error, ValueError):
            continue  # it ended meanwhile
    return list(found.values())


def listeners(settings) -> dict[tuple[str, int], str]:
    """Every listening TCP socket of those processes: (address, port) → process name."""
    found = {}
    for process in started_processes(settings):
        try:
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN:
                    found[(connection.laddr.ip, connection.laddr.port)] = process.name()
        except psutil.Error:
            continue  # it ended meanwhile
    return found


def loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    return (getattr(ip, "ipv4_mapped", None) or ip).is_loopback  # ::ffff:127.0.0.1 too


def not_loopback(found: dict[tuple[str, int], str]) -> dict[tuple[str, int], str]:
    return {key: name for key, name in found.items() if not loopback(key[0])}


@pytest.fixture(scope="module")
def platform(streamed_lake, tmp_path_factory):
    tomorrow = datetime.now(timezone.utc).date() + timedelta(days=1)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2",
                           # No automatic catch-up runs: only the run the event triggers.
                           "LAMBDALAKE_BATCH_START_DATE": tomorrow.isoformat(),
                           # The views the lake was streamed with (the reconciliation compares them).
                           "LAMBDALAKE_SPEED_VIEWS": streamed_lake.settings.speed_views}.items():
            patch.setenv(key, value)
        # A copy of its own, which the stream goes on from.
        settings = load_settings(home=streamed_lake.copy_to(tmp_path_factory.mktemp("platform") / "home").home)
        port, serve_port, pg_port = free_port(), free_port(), free_port()
        try:
            url = up(settings, port, serve_port, orders_per_hour=120, pg_port=pg_port)
            yield Platform(settings, url, port, {port, serve_port, pg_port})
        finally:
            down(settings)


def ingest_progress(settings) -> datetime | None:
    """When the stream's ingest last made progress having read live input."""
    ingest = ((read_heartbeat(settings.run_dir) or {}).get("queries") or {}).get("speed_ingest") or {}
    return datetime.fromisoformat(ingest["last_progress_at"]) if ingest.get("last_input_at") else None


def newest_landing_file(settings) -> datetime:
    return datetime.fromtimestamp(max(p.stat().st_mtime for p in settings.landing_dir.glob("*/*.jsonl")), timezone.utc)


@pytest.mark.slow
def test_up_binds_every_service_to_localhost(platform):
    settings = platform.settings
    try:
        deadline = time.monotonic() + 300  # the supervisor's first run starts the stream
        while not (stream_pid(settings) and ingest_progress(settings)):
            assert time.monotonic() < deadline, "the supervisor's stream ingested nothing"
            time.sleep(2)
        found = listeners(settings)
        assert {port for _, port in found} >= platform.ports, found  # Airflow, serve, PostgreSQL protocol
        assert "java" in found.values(), found  # the stream's Spark driver
        assert not_loopback(found) == {}
        assert platform.url.startswith("http://127.0.0.1:")
    finally:  # the stream and the generator would only share the cores with the batch below
        platform.set_paused(SUPERVISOR, True)
        stop_group(int((settings.run_dir / "generator.pid").read_text()))
        deadline = time.monotonic() + 60  # the stream takes what has landed, then stops
        while (ingest_progress(settings) or datetime.min.replace(tzinfo=timezone.utc)) < newest_landing_file(settings):
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        stop_stream(settings)
    assert day_is_complete(settings, DAY.isoformat())  # what the nightly run's sensor will ask


@pytest.mark.slow
def test_the_day_complete_event_runs_the_nightly_batch_and_then_the_maintenance(platform):
    settings = platform.settings
    for dag_id in (NIGHTLY, MAINTENANCE):
        platform.set_paused(dag_id, False)
    seen = {}
    api = AirflowApi.from_env(airflow_env(settings, platform.port))  # the connection the stream gets
    event = api.post_asset_event(DAY_COMPLETE, {"date": DAY.isoformat()})
    assert event["uri"] == DAY_COMPLETE and event["extra"]["date"] == DAY.isoformat()

    # Caps, not expectations: on a 2-core machine shared with other work the Spark steps slow down.
    run = platform.finished_run(NIGHTLY, 1500, lambda: seen.update(listeners(settings)))
    assert run["state"] == "success"
    states = platform.task_states(NIGHTLY, run["dag_run_id"])
    assert states["day_to_process"] == states["recompute"] == states["publish_coverage"] == "success", states
    assert DAY in covered_days(open_store(settings))

    maintenance = platform.finished_run(MAINTENANCE, 600, lambda: seen.update(listeners(settings)))
    assert maintenance["state"] == "success"
    assert platform.task_states(MAINTENANCE, maintenance["dag_run_id"])["compact_and_vacuum"] == "success"
    assert last_maintenance(settings).date() == datetime.now(timezone.utc).date()
    assert "java" in seen.values(), seen  # spark-submit's drivers, started by the tasks
    assert not_loopback(seen) == {}


def refused(method: str, url: str, token: str | None = None) -> int | None:
    """The HTTP status of a refusal, or None when answered."""
    try:
        call(method, url, token, {"sql": "SELECT count(*) FROM dlq"} if method == "POST" else None)
    except urllib.error.HTTPError as error:
        return error.code
    return None


@pytest.mark.slow
def test_a_person_signed_in_to_airflow_sees_the_dashboard_in_its_ui(platform, tmp_path):
    """After the nightly run above (alone, the test runs the batch itself), so that every panel
    has data. DOCS_SCREENSHOTS=1 saves the screenshot as docs/airflow-dashboard.png."""
    settings = platform.settings
    if DAY not in covered_days(open_store(settings)):
        run_batch(settings, DAY)
    notify(settings, "speed_layer_supervisor", "stream stalled; restarting", "warning")
    api = f"{platform.url}{URL_PREFIX}/api"
    assert refused("GET", f"{api}/status") == refused("POST", f"{api}/query") == 401
    assert refused("GET", f"{api}/status", token="not-a-jwt") == 403
    assert refused("GET", f"{api}/status", token=platform.token) is None  # Airflow's token, not serve's

    browser = Chromium(chromium_binary(), tmp_path / "profile", width=1440, height=1700)
    try:
        browser.open(f"{platform.url}/")  # Airflow sends a stranger to its sign-in page
        browser.wait_for("!!document.querySelector('input[name=password]')", 120)
        browser.type_into("input[name=username]", "admin")
        browser.type_into("input[name=password]", admin_password(settings))
        browser.evaluate("document.querySelector('button[type=submit]').click()")
        entry = "document.querySelector('a[href$=\"plugin/lambdalake\"]')"
        browser.wait_for(f"!!{entry}", 120)
        browser.evaluate(f"{entry}.click()")
        frame = "document.querySelector('iframe[title=Lambdalake]')?.contentDocument"
        states = browser.wait_for(panel_states(frame), 120)
        assert states == dict.fromkeys(PANELS, "data")
        series = browser.evaluate(f"[...{frame}.querySelectorAll('#revenue polyline')].map(l => l.dataset.series)")
        assert {"speed", "merged"} <= set(series), series
        assert browser.evaluate(f"{frame}.querySelectorAll('#reconciliation tbody tr').length") >= 1
        assert "stream stalled" in browser.evaluate(f"{frame}.querySelector('#alerts tbody').textContent")
        assert browser.evaluate(f"{frame}.getElementById('problem').hidden") is True  # no refusal, no token
        into = PROJECT / "docs" if os.environ.get("DOCS_SCREENSHOTS") else tmp_path
        shot = browser.screenshot(into / "airflow-dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        print(f"screenshot: {shot}")
    finally:
        browser.close()


def test_the_command_lines_up_builds_listen_on_the_bind_host(settings, monkeypatch):
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    env = airflow_env(settings, 8080)
    assert (env["AIRFLOW__API__HOST"], env["SPARK_LOCAL_IP"]) == ("127.0.0.1", "127.0.0.1")
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    shim = Path(env["PATH"].split(os.pathsep)[0]) / "airflow"  # what `airflow standalone` runs
    assert "scheduler|triggerer) exec" in shim.read_text() and "--skip-serve-logs" in shim.read_text()
    opened = settings.model_copy(update={"bind_host": "0.0.0.0"})
    env = airflow_env(opened, 8080)
    assert env["AIRFLOW__API__HOST"] == "0.0.0.0" and "SPARK_LOCAL_IP" not in env
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:8080/execution/"
    with pytest.raises(ConfigError, match="LAMBDALAKE_BIND_HOST"):
        load_settings(bind_host="127.0.0.1; rm -rf /")
