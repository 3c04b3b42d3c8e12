"""One day end to end on `lambdalake up --cluster`: compose's services as local processes.

PostgreSQL holds Airflow's metadata; the supervisor DAG starts the stream on the standalone
Spark master, reading Kafka; the nightly DAG, triggered for the day, submits its Spark
applications to the same master; `lambdalake serve` answers with the merged views, which must
equal the generator's ground truth; `down` stops every process `up` started."""

from __future__ import annotations

import csv
import http.client
import json
import time
import urllib.parse
import urllib.request
from datetime import date, datetime, timedelta, timezone

import psutil
import pytest
from deltalake import DeltaTable

from batch_layer.nightly import stream_caught_up
from include.config import load_settings
from include.heartbeat import read_heartbeat
from include.views import speed_views
from include.kafka_broker import broker_unavailable_reason, free_port
from include.processes import group_alive
from lambdalake.cluster import SERVICES, Ports, cluster_up, master_status, postgres_bin, start_postgres
from lambdalake.platform import admin_password, down
from serving.http import serve_token
from speed_layer.supervisor import stream_pid

from exactly_once import iso

DAY = date(2026, 11, 20)
HOURS = 1
NIGHTLY = "lambda_nightly_batch"
MAINTENANCE = "lakehouse_maintenance"
pytestmark = pytest.mark.slow


def call(method: str, url: str, token: str | None = None, body: dict | None = None, timeout: float = 120):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read() or b"null")


def processes_of(settings) -> dict[int, psutil.Process]:
    """Every process `up` started, with everything under them (Airflow's tasks, Spark drivers)."""
    found = {}
    for path in settings.run_dir.glob("*.pid"):
        try:
            root = psutil.Process(int(path.read_text()))
            found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
        except (psutil.Error, ValueError):
            continue
    return found


def executors_with_tasks(settings) -> list[dict]:
    """The stream application's executors (Spark's REST API on its driver's UI) that ran tasks."""
    driver = psutil.Process(stream_pid(settings))
    for process in [driver, *driver.children(recursive=True)]:
        for connection in process.net_connections(kind="tcp"):
            if connection.status != psutil.CONN_LISTEN:
                continue
            base = f"http://127.0.0.1:{connection.laddr.port}/api/v1/applications"
            try:
                app = call("GET", base, timeout=5)[0]["id"]
                executors = call("GET", f"{base}/{app}/executors", timeout=5)
            except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError):
                continue  # not the UI (py4j's port, the block manager's)
            return [e for e in executors if e["id"] != "driver" and e["totalTasks"] > 0]
    return []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from include.spark import delta_spark_unavailable_reason
    from speed_layer.sources import kafka_unavailable_reason

    checked = load_settings(home=tmp_path_factory.mktemp("checks"))
    for reason in (broker_unavailable_reason(), delta_spark_unavailable_reason(checked),
                   kafka_unavailable_reason(checked)):
        if reason:
            print(f"SKIP local cluster: {reason}")
            pytest.skip(reason)
    postgres_bin()  # raises with the fix when pgserver is missing: `make install` provides it
    tomorrow = datetime.now(timezone.utc).date() + timedelta(days=1)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {"LAMBDALAKE_SHUFFLE_PARTITIONS": "2", "LAMBDALAKE_SPARK_DRIVER_MEMORY": "1g",
                           "LAMBDALAKE_SPARK_UI": "true",
                           # no scheduled catch-up runs: only the run triggered below
                           "LAMBDALAKE_BATCH_START_DATE": tomorrow.isoformat()}.items():
            patch.setenv(key, value)
        settings = load_settings(home=tmp_path_factory.mktemp("cluster") / "home")
        ports = Ports(*(free_port() for _ in range(8)))
        generator = ["--start", f"{DAY}T00:00:00Z", "--hours", str(HOURS), "--orders-per-hour", "120", "--seed", "5"]
        started = time.monotonic()
        try:
            url = cluster_up(settings, ports, generator_args=generator)
            print(f"up: {time.monotonic() - started:.0f} s")
            yield settings, ports, url
        finally:
            before, stopping = processes_of(settings), time.monotonic()
            stopped = down(settings)
            print(f"down stopped {stopped} in {time.monotonic() - stopping:.0f} s")
            left = [p for p in before.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            assert not left, [p.cmdline()[:3] for p in left]
            assert not [path.stem for path in settings.run_dir.glob("*.pid") if group_alive(int(path.read_text()))]


def wait_for(what: str, check, timeout: float, interval: float = 3):
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:.0f} s")
        time.sleep(interval)


def truth_rows(truth_dir, name: str) -> int:
    with (truth_dir / f"{name}.csv").open() as handle:
        return sum(1 for _ in csv.DictReader(handle))


def speed_rows(settings, view) -> int:
    path = settings.lakehouse_dir / view.speed_table
    return DeltaTable(str(path)).to_pyarrow_dataset().count_rows() if DeltaTable.is_deltatable(str(path)) else 0


def ingested_everything(settings) -> bool:
    ingest = ((read_heartbeat(settings.run_dir) or {}).get("queries") or {}).get("speed_ingest") or {}
    return bool(ingest.get("last_input_at")) and ingest.get("records_behind") == 0


def test_one_day_through_the_local_cluster(cluster):
    settings, ports, url = cluster
    started = time.monotonic()
    status = master_status(ports)
    assert [w["cores"] for w in status["workers"] if w["state"] == "ALIVE"] == [2]

    generator = psutil.Process(int((settings.run_dir / "generator.pid").read_text()))
    wait_for("the generator produced the day", lambda: not generator.is_running()
             or generator.status() == psutil.STATUS_ZOMBIE, 180)
    truth_dir = next(settings.truth_dir.glob("*"))
    # The supervisor (unpaused at creation, as in compose) starts the stream on the master.
    # Caught up also by the nightly sensor's measure (a micro-batch with nothing new since), or
    # its first poke finds the day incomplete and the next comes five minutes later.
    wait_for("the supervisor's stream ingested the day from Kafka",
             lambda: ingested_everything(settings) and stream_caught_up(settings), 900)
    stream_apps = [app for app in master_status(ports)["activeapps"] if app["name"] == "lambdalake-stream"]
    assert [app["cores"] for app in stream_apps] == [1], stream_apps  # a core left for the batch
    executors = wait_for("the stream's executors on the worker ran tasks", lambda: executors_with_tasks(settings), 120)
    assert all(e["hostPort"].startswith("127.0.0.1:") for e in executors), executors
    print(f"stream ingested the day: {time.monotonic() - started:.0f} s")
    # Every view's speed side ran on the cluster (its state is in the lake, not in the driver).
    expected = [view for view in speed_views(settings) if truth_rows(truth_dir, view.name)]
    wait_for("every view with rows in the truth has speed rows",
             lambda: all(speed_rows(settings, view) for view in expected), 300)

    token = call("POST", f"{url}/auth/token", body={"username": "admin", "password": admin_password(settings)})
    # Maintenance (scheduled by the batch views' assets) is not what this test proves: its run
    # would start as the nightly run publishes, and only lengthen the day and `down`.
    call("PATCH", f"{url}/api/v2/dags/{MAINTENANCE}", token["access_token"], {"is_paused": True})
    run = call("POST", f"{url}/api/v2/dags/{NIGHTLY}/dagRuns", token["access_token"],
               {"logical_date": None, "conf": {"date": DAY.isoformat()}})
    quoted = urllib.parse.quote(run["dag_run_id"], safe="")
    nightly_started = time.monotonic()

    def finished():
        state = call("GET", f"{url}/api/v2/dags/{NIGHTLY}/dagRuns/{quoted}", token["access_token"])["state"]
        return state if state in ("success", "failed") else None

    assert wait_for("the nightly run finished", finished, 1500) == "success"
    print(f"nightly done: {time.monotonic() - started:.0f} s")
    # The job names its session "lambdalake" (as the supervisor's store does): count the
    # applications the master ran while the nightly run did, beside the stream.
    triggered_ms = (time.time() - (time.monotonic() - nightly_started)) * 1000
    batch_apps = [app for app in master_status(ports)["completedapps"]
                  if app["name"] != "lambdalake-stream" and app["starttime"] >= triggered_ms]
    assert len(batch_apps) >= 2, batch_apps  # recompute and reconcile at least
    assert stream_pid(settings) in processes_of(settings)  # the stream ran beside the batch throughout

    serve = f"http://127.0.0.1:{ports.serve}/api/query"
    query = lambda sql: call("POST", serve, serve_token(settings), {"sql": sql})  # noqa: E731
    with (truth_dir / "revenue_by_category_5m.csv").open() as handle:
        truth = {(r["window_start"], r["category"]): r for r in csv.DictReader(handle)}
    served = query("SELECT * FROM revenue_by_category_5m")
    assert {row["source"] for row in served} == {"batch"}
    got = {(iso(datetime.fromisoformat(row["window_start"])), row["category"]): row for row in served}
    assert set(got) == set(truth)
    for key, expected in truth.items():
        assert got[key]["revenue"] == pytest.approx(float(expected["revenue"]), abs=0.005), key
        assert got[key]["orders"] == int(expected["orders"]), key
        assert got[key]["unique_buyers"] == int(expected["unique_buyers"]), key

    with (truth_dir / "order_payments.csv").open() as handle:
        truth = {r["order_id"]: r for r in csv.DictReader(handle)}
    got = {row["order_id"]: row for row in query("SELECT * FROM order_payments")}
    assert set(got) == set(truth)
    for order_id, expected in truth.items():
        assert (got[order_id]["status"], got[order_id]["payment_id"] or "") == \
            (expected["status"], expected["payment_id"]), order_id


def test_down_stops_exactly_what_up_started(cluster):
    """Up recorded every service of compose's that runs (the one-shots ran to completion), and the
    supervisor the stream; the fixture's teardown checks that `down` leaves none of them running."""
    settings, _, _ = cluster
    assert {path.stem for path in settings.run_dir.glob("*.pid")} == {*SERVICES, "stream"}


def test_down_leaves_postgresql_to_stop_its_own_processes(tmp_path):
    """PostgreSQL makes each of its processes a group leader: `down` stops the server, rather than
    signal its checkpointer (which ignores SIGTERM) as a task left running and SIGKILL it."""
    postgres_bin()  # raises with the fix when pgserver is missing: `make install` provides it
    settings = load_settings(home=tmp_path / "home")
    start_postgres(settings, Ports(postgres=free_port()))
    pid = int((settings.run_dir / "postgres.pid").read_text())
    assert down(settings) == [f"postgres (pid {pid})"]
    assert "database system is shut down" in (settings.run_dir / "postgres.log").read_text()
