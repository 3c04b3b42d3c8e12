"""The supervisor on real processes: a real stream it starts, kills and restarts; a real process
that makes no progress standing in for a stalled stream; the restart cap; the freshness SLA."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from airflow.dag_processing.dagbag import DagBag
from exactly_once import assert_every_line_once

from include import tables
from include.accounting import ingest_totals
from include.config import load_settings
from include.generator import TrafficOptions, generate
from include.generator.landing import LandingZone
from include.lakehouse import open_store
from include.heartbeat import HEARTBEAT_FILE, read_heartbeat
from include.processes import process_alive
from include.schemas import TOPIC_NAMES
from speed_layer.supervisor import (
    PID_FILE, check_freshness, diagnose, stop_stream, supervise,
)

DAGS = Path(__file__).resolve().parents[2] / "dags"


@pytest.fixture
def home(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("LAMBDALAKE_"):
            monkeypatch.delenv(key)
    settings = load_settings(home=tmp_path / "home", restart_backoff="1s", stall_after="5 minutes")
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    monkeypatch.setenv("LAMBDALAKE_SPARK_MASTER", "local[2]")
    yield settings
    stop_stream(settings, timeout=30)


def decisions(settings):
    events = open_store(settings).select_arrow(tables.SUPERVISOR_EVENTS, ["at", "decision"])
    return [row["decision"] for row in events.sort_by("at").to_pylist()]


def wait_for(condition, seconds=120):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def supervisor_dag_decides(settings) -> dict:
    """One run of the speed_layer_supervisor DAG as Airflow runs it (``dag.test()``): its decision."""
    dag = DagBag(dag_folder=str(DAGS)).dags["speed_layer_supervisor"]
    assert dag.test().state == "success"
    events = open_store(settings).select_arrow(tables.SUPERVISOR_EVENTS, ["at", "state", "decision"])
    return events.sort_by("at").to_pylist()[-1]


def java_of(pgid: int) -> int:
    """The JVM in a stream's process group."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and (stat.parent / "exe").resolve().name == "java":
                return int(stat.parent.name)
    raise AssertionError(f"no JVM in process group {pgid}")


@pytest.mark.slow
def test_starts_the_stream_restarts_it_after_a_kill_and_after_it_hangs(home, airflow_db, monkeypatch):
    """Killed, then hung twice: its JVM stopped, then its Python driver."""
    ledger = generate(home, datetime(2026, 11, 20, tzinfo=timezone.utc), 1, TrafficOptions(orders_per_hour=50),
                      seed=1, file_minutes=5, progress=False).ledger
    monkeypatch.setenv("LAMBDALAKE_MAX_FILES_PER_TRIGGER", "1")  # many micro-batches: it hangs mid-way
    monkeypatch.setenv("LAMBDALAKE_SPEED_VIEWS", "order_payments")  # the supervisor is the point, not the views
    assert supervise(home)["decision"] == "start"
    first = int((home.run_dir / PID_FILE).read_text())
    assert wait_for(lambda: (read_heartbeat(home.run_dir) or {}).get("state") == "running")
    assert supervise(home)["decision"] == "none"  # healthy

    os.killpg(first, signal.SIGKILL)
    assert wait_for(lambda: diagnose(home).state == "dead", 30)
    time.sleep(1.5)  # the backoff after one start is 1 s
    row = supervise(home)
    assert row["decision"] == "restart" and row["state"] == "dead"
    second = int((home.run_dir / PID_FILE).read_text())
    assert second != first and wait_for(lambda: (read_heartbeat(home.run_dir) or {}).get("pid") == second)

    # It hangs (its JVM stopped: the driver waits on it and its heartbeat stands still) with
    # landed files waiting; the DAG's next run finds it stalled and restarts it.
    monkeypatch.setenv("LAMBDALAKE_STALL_AFTER", "20 seconds")  # for the DAG's task, as the fixture's settings
    monkeypatch.setenv("LAMBDALAKE_RESTART_BACKOFF", "1s")
    assert wait_for(lambda: ingested(home) > 0, 180)
    os.kill(java_of(second), signal.SIGSTOP)
    stalled = home.model_copy(update={"stall_after": timedelta(seconds=20)})
    assert wait_for(lambda: diagnose(stalled).state == "stalled", 90)
    monkeypatch.delenv("LAMBDALAKE_MAX_FILES_PER_TRIGGER")  # the next stream catches up in larger ones
    hung = time.monotonic()
    decision = supervisor_dag_decides(home)
    assert (decision["state"], decision["decision"]) == ("stalled", "restart")
    assert time.monotonic() - hung < 60  # stopped gracefully at once, not after the 90-s grace
    third = int((home.run_dir / PID_FILE).read_text())
    assert third != second and not process_alive(second)
    assert decisions(home) == ["start", "none", "restart", "restart"]
    alerts = open_store(home).select_arrow(tables.ALERTS, ["source", "message"]).to_pylist()
    assert {"source": "speed_layer_supervisor", "message": "stream stalled; restarted"} in alerts

    # Then its Python driver stops (the JVM runs on, but the driver writes the heartbeat): stalled
    # while input waits, dead once the heartbeat is a minute old; either way restarted.
    assert wait_for(lambda: (read_heartbeat(home.run_dir) or {}).get("pid") == third, 180)
    os.kill(third, signal.SIGSTOP)
    assert wait_for(lambda: diagnose(stalled).state in ("stalled", "dead"), 120)
    decision = supervisor_dag_decides(home)
    assert decision["decision"] == "restart" and not process_alive(third)
    assert decisions(home) == ["start", "none", "restart", "restart", "restart"]

    expected = (sum(t["lines"] for t in ledger["topics"].values()), sum(t["valid"] for t in ledger["topics"].values()))

    def caught_up() -> bool:
        if diagnose(home).state == "dead":  # it died starting (a busy machine): the DAG's next run
            supervisor_dag_decides(home)
        # By the accounting, written last: every write of those micro-batches (the DLQ's too) is in.
        totals = ingest_totals(open_store(home))
        return (sum(t["bronze"] for t in totals), sum(t["silver"] for t in totals)) == expected

    assert wait_for(caught_up, 300)  # then exactly once
    stop_stream(home, timeout=60)
    assert_every_line_once(open_store(home), ledger)


def ingested(settings, layer=tables.bronze) -> int:
    """Rows in Bronze (or Silver) so far."""
    store = open_store(settings)
    names = [layer(topic) for topic in TOPIC_NAMES if store.exists(layer(topic))]
    return sum(store.select_arrow(name, ["date" if layer is tables.silver else "event_date"]).num_rows
               for name in names)


def test_stalled_stream_is_detected_and_restarted(home):
    # A live process with a fresh heartbeat but no progress for 20 minutes, while input waits.
    stuck = subprocess.Popen(["sleep", "600"], start_new_session=True)
    home.run_dir.mkdir(parents=True)
    (home.run_dir / PID_FILE).write_text(str(stuck.pid))
    now = datetime.now(timezone.utc)
    (home.run_dir / HEARTBEAT_FILE).write_text(json.dumps({
        "pid": stuck.pid, "state": "running", "started_at": (now - timedelta(hours=1)).isoformat(),
        "heartbeat_at": now.isoformat(),
        "queries": {"speed_ingest": {"last_progress_at": (now - timedelta(minutes=20)).isoformat()}},
    }))
    generate(home, datetime(2026, 11, 20, tzinfo=timezone.utc), 0.25, TrafficOptions(orders_per_hour=20), seed=2,
             progress=False)
    assert diagnose(home).state == "stalled"
    row = supervise(home)
    assert (row["state"], row["decision"]) == ("stalled", "restart")
    assert stuck.wait(timeout=30) is not None  # the stuck process was stopped
    assert int((home.run_dir / PID_FILE).read_text()) != stuck.pid


def test_a_stream_falling_behind_is_reported_not_restarted(home):
    # Alive and making progress, but the oldest landed file has waited 20 minutes.
    running = subprocess.Popen(["sleep", "600"], start_new_session=True)
    home.run_dir.mkdir(parents=True)
    (home.run_dir / PID_FILE).write_text(str(running.pid))
    now = datetime.now(timezone.utc)
    (home.run_dir / HEARTBEAT_FILE).write_text(json.dumps({
        "pid": running.pid, "state": "running", "started_at": (now - timedelta(hours=1)).isoformat(),
        "heartbeat_at": now.isoformat(), "queries": {"speed_ingest": {"last_progress_at": now.isoformat()}},
    }))
    LandingZone(home.landing_dir).write("orders", "000001", ['{"order_id": "o1"}'])
    twenty_minutes_ago = time.time() - 20 * 60
    os.utime(home.landing_topic_dir("orders") / "000001.jsonl", (twenty_minutes_ago, twenty_minutes_ago))
    try:
        diagnosis = diagnose(home)
        assert diagnosis.state == "behind" and "1 landed files" in diagnosis.reason
        row = supervise(home)
        assert (row["state"], row["decision"]) == ("behind", "alert")
        alerts = open_store(home).select_arrow(tables.ALERTS, ["severity", "message"]).to_pylist()
        assert alerts == [{"severity": "warning", "message": "stream falling behind its input"}]
        assert running.poll() is None  # a restart would only add its start-up to the backlog
    finally:
        running.kill()
        running.wait()


def test_restart_cap_turns_into_an_alert(home):
    store = open_store(home)
    store.ensure_table(tables.SUPERVISOR_EVENTS, tables.SUPERVISOR_EVENTS_SCHEMA)
    now = datetime.now(timezone.utc)
    earlier = [{"at": now - timedelta(minutes=5 * i), "state": "dead", "decision": "restart", "reason": "test",
                "pid": 1, "restarts_last_hour": i} for i in range(1, home.max_restarts_per_hour + 1)]
    store.append(tables.SUPERVISOR_EVENTS,
                 pa.Table.from_pylist(earlier, schema=tables.arrow_schema(tables.SUPERVISOR_EVENTS_SCHEMA)))
    home.run_dir.mkdir(parents=True)
    (home.run_dir / PID_FILE).write_text("999999")  # a process that no longer exists
    row = supervise(home)
    assert (row["state"], row["decision"]) == ("dead", "alert")
    alerts = store.select_arrow(tables.ALERTS, ["source", "message"]).to_pylist()
    assert alerts == [{"source": "speed_layer_supervisor", "message": "stream dead and restart cap reached"}]
    assert not (home.run_dir / HEARTBEAT_FILE).exists()  # nothing was started


def test_freshness_sla_alert(home):
    store = open_store(home)
    store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA)
    old = datetime.now(timezone.utc) - timedelta(hours=2)
    row = {"query": "speed_ingest", "batch_id": 0, "topic": "orders", "bronze_rows": 1, "dlq_rows": 0, "silver_rows": 1,
           "late_rows": 0, "max_event_time": old, "watermark": None, "processed_at": old}
    store.append(tables.INGEST_BATCHES,
                 pa.Table.from_pylist([row], schema=tables.arrow_schema(tables.INGEST_BATCHES_SCHEMA)))
    lag = check_freshness(home, datetime.now(timezone.utc))
    assert lag > home.freshness_sla
    (alert,) = store.select_arrow(tables.ALERTS, ["severity", "message"]).to_pylist()
    assert alert["severity"] == "warning" and "behind (SLA" in alert["message"]
