"""The stream's day-complete asset events: which day, once, and nothing stops the stream when
Airflow is absent. (Posting to a real Airflow: tests/dags/test_airflow_standalone.py.)"""

from __future__ import annotations

import logging
import socket
from datetime import date, datetime, timedelta, timezone

import pyarrow as pa
import pytest

from include import tables
from include.airflow_events import AIRFLOW_CONN_ENV, AirflowApi
from include.day_complete import complete_at, newest_complete_day, stream_watermark
from include.lakehouse import open_store
from include.registry import input_topics
from include.views import VIEWS
from speed_layer.announce import STATE_FILE, DayCompleteAnnouncer

UTC = timezone.utc


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ingest(store, topics, max_event_time: datetime, batch_id: int = 0) -> None:
    store.ensure_table(tables.INGEST_BATCHES, tables.INGEST_BATCHES_SCHEMA)
    rows = [{"query": "speed_ingest", "batch_id": batch_id, "topic": topic, "bronze_rows": 1, "dlq_rows": 0,
             "silver_rows": 1, "late_rows": 0, "max_event_time": max_event_time, "watermark": None,
             "processed_at": max_event_time} for topic in topics]
    store.append(tables.INGEST_BATCHES, pa.Table.from_pylist(rows, schema=tables.arrow_schema(
        tables.INGEST_BATCHES_SCHEMA)))


def test_a_day_is_complete_once_every_topics_watermark_passed_its_end_plus_lateness(settings):
    store = open_store(settings)
    topics = input_topics(VIEWS)
    day = date(2026, 11, 20)
    ready = complete_at(settings, day)
    assert ready == datetime(2026, 11, 21, 1, 10, tzinfo=UTC)  # 10 minutes' delay, 1 hour's join window
    assert stream_watermark(store, settings) is None
    ingest(store, topics[:-1], ready + settings.watermark_delay)
    assert stream_watermark(store, settings) is None  # one topic has no event yet
    ingest(store, topics[-1:], ready + settings.watermark_delay - settings.join_window, batch_id=1)
    watermark = stream_watermark(store, settings)
    assert watermark == ready - settings.join_window  # the slowest topic's
    assert newest_complete_day(settings, watermark) == date(2026, 11, 19)
    assert newest_complete_day(settings, ready - timedelta(microseconds=1)) == date(2026, 11, 19)
    assert newest_complete_day(settings, ready) == day


def land(store, topic: str, day: date) -> None:
    """One Bronze line of ``topic`` with event date ``day``."""
    store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
    row = {"value": b"{}", "topic": topic, "source": "test", "arrived_at": datetime.now(UTC),
           "ingested_at": datetime.now(UTC), "batch_id": 0, "event_date": day}
    schema = tables.arrow_schema(tables.BRONZE_SCHEMA)
    store.append(tables.bronze(topic), pa.Table.from_pylist([{name: row.get(name) for name in schema.names}], schema))


def test_the_newest_complete_day_with_events_is_the_one_posted(settings):
    """A stream that begins with today's events has a watermark making days before them
    complete: nothing of theirs was ingested, and no nightly run is asked for them."""
    store = open_store(settings)
    announcer = DayCompleteAnnouncer(settings, store, AirflowApi("http://127.0.0.1:9", "admin", "x"))
    ingest(store, input_topics(VIEWS), datetime(2026, 11, 21, 2, 0, tzinfo=UTC))  # 2026-11-20 complete
    assert announcer.day_to_post() is None  # no Bronze yet
    land(store, "orders", date(2026, 11, 21))
    assert announcer.day_to_post() is None  # events, but of a day not complete
    land(store, "clicks", date(2026, 11, 18))
    assert announcer.day_to_post() == date(2026, 11, 18)  # the newest complete day with events (a gap after it)
    land(store, "sensors", date(2026, 11, 20))
    assert announcer.day_to_post() == date(2026, 11, 20)
    (settings.checkpoints_dir / STATE_FILE).parent.mkdir(parents=True, exist_ok=True)
    (settings.checkpoints_dir / STATE_FILE).write_text('{"date": "2026-11-20"}')
    assert announcer.day_to_post() is None  # posted already


def test_airflow_absent_is_logged_once_and_the_day_posted_later(settings, caplog):
    store = open_store(settings)
    ingest(store, input_topics(VIEWS), datetime(2026, 11, 21, 2, 0, tzinfo=UTC))
    land(store, "orders", date(2026, 11, 20))
    closed = AirflowApi(f"http://127.0.0.1:{free_port()}", "admin", "secret")  # nothing listens there
    announcer = DayCompleteAnnouncer(settings, store, closed)
    with caplog.at_level(logging.INFO, logger="speed_layer.announce"):
        assert announcer.check_safely() is None
        assert announcer.check_safely() is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "could not tell Airflow that 2026-11-20 is complete" in warnings[0]
    assert "Connection refused" in warnings[0] and "secret" not in caplog.text
    assert announcer.last_posted() is None and not (settings.checkpoints_dir / STATE_FILE).exists()


def test_without_the_connection_the_stream_posts_nothing(settings, monkeypatch, caplog):
    monkeypatch.delenv(AIRFLOW_CONN_ENV, raising=False)
    with caplog.at_level(logging.INFO, logger="speed_layer.announce"):
        assert DayCompleteAnnouncer.from_env(settings, open_store(settings)) is None
    assert f"no Airflow connection in {AIRFLOW_CONN_ENV}" in caplog.text


@pytest.mark.parametrize("value, url", [
    ("http://admin:p%40ss@localhost:8080", "http://localhost:8080"),
    ("http://admin:pw@airflow.example.com:443/https", "https://airflow.example.com:443"),
    ("http://admin:pw@http%3A%2F%2F127.0.0.1:8081", "http://127.0.0.1:8081"),
    ('{"conn_type": "http", "host": "127.0.0.1", "port": 8080, "login": "admin", "password": "p@ss"}',
     "http://127.0.0.1:8080"),
    ('{"conn_type": "http", "host": "https://airflow.example.com", "login": "admin", "password": "x"}',
     "https://airflow.example.com"),
])
def test_the_connection_reads_as_airflow_reads_it(value, url):
    from airflow.sdk.definitions.connection import Connection

    api = AirflowApi.from_connection(value)
    airflow = (Connection.from_json(value, conn_id="lambdalake_airflow") if value.startswith("{")
               else Connection.from_uri(value, conn_id="lambdalake_airflow"))
    assert api.base_url == url
    assert (api.login, api.password) == (airflow.login, airflow.password)
    assert str(airflow.port or "") in api.base_url and airflow.host.split("://")[-1] in api.base_url
    assert "p@ss" not in repr(api) and "password" not in repr(api)
