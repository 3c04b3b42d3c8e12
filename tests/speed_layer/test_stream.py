"""The speed layer end to end on real files, real Spark streaming and real Delta tables."""

from __future__ import annotations

import json
import os
import threading
import time
from unittest.mock import ANY
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from include import tables
from include.config import load_settings
from include.generator import TrafficOptions, generate
from include.lakehouse import open_reader, open_store
from include.registry import speed_rows_sql
from include.schemas import TOPIC_NAMES
from include.views import VIEWS_BY_NAME
from include.views.sql import spark_rows
from speed_layer import gold, ingest
from include.heartbeat import read_heartbeat
from serving.status import status_summary, view_status
from include.accounting import ingest_totals
from speed_layer.runner import (
    CACHE_COMPRESSED,
    NO_DATA_BATCHES,
    SHUFFLE_PARTITIONS,
    query_trigger_intervals,
    run_stream,
    stream_shuffle_partitions,
)
from speed_layer.sources import landing_source


def order(order_id, minute, amount=10.0, category="books", user="u1", hour=10):
    return {"order_id": order_id, "user_id": user, "product_id": "p1", "category": category,
            "amount": amount, "event_time": f"2026-11-20T{hour:02d}:{minute:02d}:00Z"}


def payment(payment_id, order_id, minute, hour=10, amount=10.0):
    return {"payment_id": payment_id, "order_id": order_id, "amount": amount, "method": "card",
            "event_time": f"2026-11-20T{hour:02d}:{minute:02d}:00Z"}


def utc(hour, minute):
    return datetime(2026, 11, 20, hour, minute)  # collected timestamps: naive UTC


SPEED_REVENUE = VIEWS_BY_NAME["revenue_by_category_5m"].speed_table


def order_status(store) -> dict[str, tuple]:
    """Each order's status and payment as readers see it: the first of its appended rows."""
    view = VIEWS_BY_NAME["order_payments"]
    rows = spark_rows(speed_rows_sql(view, "{speed}"), {"speed": store.read(view.speed_table)}).collect()
    return {r["order_id"]: (r["status"], r["payment_id"]) for r in rows}


def test_every_registered_view_has_a_speed_query_or_is_computed_by_ingest(spark, settings):
    from include.lakehouse import open_store

    writers = gold.gold_writers(spark, settings, open_store(settings, spark))
    in_pass = [name for name, view in VIEWS_BY_NAME.items() if view.in_ingest_pass]
    assert sorted(in_pass) == ["alerts", "customers", "customers_history", "device_health_5m",
                               "revenue_by_category_5m", "traffic_by_page_10m", "user_sessions"]
    assert writers == {"speed_order_payments": ANY, "speed_revenue_by_segment_1h": ANY}
    chosen = settings.model_copy(update={"speed_views": "alerts, user_sessions"})
    assert gold.gold_writers(spark, chosen, open_store(chosen, spark)) == {}
    # A view's lookups are in ingest's pass, which runs them.
    enriched = settings.model_copy(update={"speed_views": "revenue_by_segment_1h"})
    assert list(gold.gold_writers(spark, enriched, open_store(enriched, spark))) == ["speed_revenue_by_segment_1h"]


def test_an_unknown_speed_view_is_a_usage_error_before_spark_starts(settings, capsys):
    from lambdalake.cli import main

    assert main(["stream", "--home", str(settings.home), "--views", "order_payments,sessions"]) == 2
    assert "unknown view 'sessions' (views: revenue_by_category_5m, order_payments" in capsys.readouterr().err
    assert not settings.checkpoints_dir.exists()
    assert main(["stream", "--home", str(settings.home), "--view-triggers", "sessions=5s"]) == 2
    assert "LAMBDALAKE_VIEW_TRIGGERS=sessions=5s: unknown view 'sessions'" in capsys.readouterr().err


def test_bronze_refreshes_every_10_seconds_unless_told_or_the_trigger_is_longer(settings):
    def bronze_interval(**update):
        return query_trigger_intervals(settings.model_copy(update=update))["speed_bronze"]

    assert bronze_interval(trigger_interval=timedelta(seconds=1)) == timedelta(seconds=10)
    assert bronze_interval(trigger_interval=timedelta(minutes=1)) == timedelta(minutes=1)
    assert bronze_interval(trigger_interval=timedelta(seconds=1),
                           bronze_trigger_interval=timedelta(seconds=2)) == timedelta(seconds=2)
    # Every query the runner starts has its interval here.
    assert set(query_trigger_intervals(settings)) == {
        "speed_bronze", "speed_ingest", *(v.speed_query for v in VIEWS_BY_NAME.values() if not v.in_ingest_pass)}


@pytest.mark.parametrize("rows_per_task", [ingest.ROWS_PER_WRITE_TASK, 1], ids=["one task", "a task per core"])
def test_ingest_writes_one_feed_file_per_topic_and_micro_batch(spark, settings, land, monkeypatch, rows_per_task):
    monkeypatch.setattr(ingest, "ROWS_PER_WRITE_TASK", rows_per_task)
    lines = {"orders": [order(f"o{i}", i) for i in range(6)],
             "payments": [payment("p1", "o1", 2), payment("p2", "o4", 9)]}
    for topic, rows in lines.items():
        land(topic, "0001", rows)
    raw = landing_source(spark, settings, tuple(lines))
    enriched = settings.model_copy(update={"speed_views": "revenue_by_segment_1h"})  # its query reads orders
    writer = ingest.IngestBatch(enriched, open_store(settings, spark), tuple(raw))
    query = (ingest.parsed_events(raw, settings).writeStream.foreachBatch(writer).trigger(availableNow=True)
             .option("checkpointLocation", str(settings.checkpoints_dir / ingest.QUERY)).start())
    query.awaitTermination()
    assert not (settings.feeds_dir / "payments").exists()  # only order_payments' query reads it, not streamed here
    for topic, rows in list(lines.items())[:1]:
        files = sorted((settings.feeds_dir / topic).iterdir())
        assert [file.name for file in files] == ["000000000000.parquet"]
        fed = spark.read.parquet(str(files[0])).select(f"{ingest.record_column(topic)}.*").collect()
        assert sorted(row[0] for row in fed) == sorted(line[f"{topic[:-1]}_id"] for line in rows)
    assert not any((settings.feeds_dir / "_staging").glob("*"))


def test_a_log_file_a_killed_run_left_half_written_does_not_stop_the_restart(spark, settings, land):
    """A kill -9 while Spark writes a query's first offset file leaves its temporary file behind;
    the restarted stream removes it instead of failing ("should be empty on batch 0")."""
    land("orders", "0001", [order("o1", 0)])
    torn = settings.checkpoints_dir / ingest.QUERY / "offsets" / ".0.5f1c2d3e-0000-4000-8000-000000000000.tmp"
    torn.parent.mkdir(parents=True)
    torn.write_text('v1\n{"batchWatermarkMs":0,')
    store = run_stream(settings.model_copy(update={"speed_views": "revenue_by_category_5m"}), available_now=True)
    assert not torn.exists() and store.read(tables.silver("orders")).count() == 1


def test_order_behind_the_watermark_is_late_not_counted(spark, settings, land):
    land("orders", "0001", [order("o1", 0, 10.0), order("o2", 20, 5.0)])
    land("orders", "0002", [order("o3", 2, 7.0), order("o4", 21, 1.0)])  # o3: 10:02 <= 10:20 - 10 min
    store = run_stream(settings, available_now=True)

    late = store.read(tables.LATE_EVENTS).collect()
    assert [(r["topic"], r["event_id"]) for r in late] == [("orders", "o3")]
    assert late[0]["watermark_at_arrival"] == utc(10, 10)
    assert late[0]["lateness_seconds"] == 480.0

    revenue = {(r["window_start"], r["category"]): (r["revenue"], r["orders"])
               for r in store.read(SPEED_REVENUE).collect()}
    assert revenue == {(utc(10, 0), "books"): (10.0, 1), (utc(10, 20), "books"): (6.0, 2)}
    silver = {r["order_id"]: r["is_late"] for r in store.read(tables.silver("orders")).collect()}
    assert silver == {"o1": False, "o2": False, "o3": True, "o4": False}  # late events are kept
    # No micro-batch without data (Spark runs one when the watermark moved) for a view's own
    # query: it keeps no state.
    metrics = store.read(tables.STREAM_METRICS).collect()
    empty = {r["query"] for r in metrics if r["input_rows"] == 0}
    assert not empty & {v.speed_query for v in VIEWS_BY_NAME.values() if not v.in_ingest_pass}, empty
    # Every micro-batch a query committed has its metrics, the last one of the run too.
    committed = {(folder.name, int(commit.name)) for folder in settings.checkpoints_dir.iterdir()
                 for commit in (folder / "commits").glob("[0-9]*")}
    assert {(r["query"], r["batch_id"]) for r in metrics} == committed


def test_a_landed_file_with_an_old_mtime_is_still_read(spark, settings, land):
    """A backfill moved in with `mv` keeps its mtime; Spark's file source would skip a file more
    than 7 days older than the newest it has seen (its default maxFileAge)."""
    from speed_layer.sources import landing_source

    def sources_read() -> list[str]:
        read = []
        query = (landing_source(spark, settings, ["orders"])["orders"].writeStream
                 .foreachBatch(lambda batch, _: read.extend(Path(row["source"]).name for row in batch.collect()))
                 .option("checkpointLocation", str(settings.checkpoints_dir / "landed"))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        return sorted(read)

    land("orders", "0002", [order("o2", 0)])
    assert sources_read() == ["0002.jsonl"]
    backfill = land("orders", "0001", [order("o1", 0)])
    month_ago = time.time() - 30 * 86400
    os.utime(backfill, (month_ago, month_ago))
    assert sources_read() == ["0001.jsonl"]  # the restarted source found it


def test_join_paid_unpaid_pending(spark, settings, land):
    land("orders", "0001", [order("o1", 0), order("o2", 5)])
    land("payments", "0001", [payment("p1", "o1", 10)])  # inside o1's window
    land("orders", "0002", [order("o9", 20, hour=11)])
    land("payments", "0002", [payment("p9", "o9", 25, hour=11)])
    land("orders", "0003", [order("o3", 30, hour=11)])  # window open until 12:30
    land("payments", "0003", [payment("p2", "o2", 20)])  # behind the payments watermark (11:15)
    store = run_stream(settings.model_copy(update={"speed_views": "order_payments"}), available_now=True)
    assert not store.exists(SPEED_REVENUE)  # left to the batch layer

    assert [(r["topic"], r["event_id"]) for r in store.read(tables.LATE_EVENTS).collect()] == [("payments", "p2")]
    assert order_status(store) == {"o1": ("paid", "p1"), "o2": ("unpaid", None), "o9": ("paid", "p9"),
                                   "o3": ("pending", None)}


def test_a_payment_before_its_order_waits_for_it_also_across_a_restart(spark, settings, land):
    # One file per topic and micro-batch: p1 meets o1; p0 waits for o0, which comes after a
    # restart, in the join's state store (the query's checkpoint).
    settings = settings.model_copy(update={"speed_views": "order_payments"})
    land("payments", "0001", [payment("p1", "o1", 10), payment("p0", "o0", 12)])
    land("orders", "0002", [order("o1", 0)])
    store = run_stream(settings, available_now=True)
    land("orders", "0003", [order("o0", 1), order("o7", 2)])
    store = run_stream(settings, available_now=True)

    assert order_status(store) == {"o1": ("paid", "p1"), "o0": ("paid", "p0"), "o7": ("pending", None)}


def test_accounting_on_generated_data(spark, settings):
    options = TrafficOptions(duplicate_fraction=0.05, corrupt_fraction=0.03, late_fraction=0.03, orders_per_hour=100)
    ledger = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 1.5, options, seed=3, file_minutes=15,
                      progress=False).ledger
    # Ingest is the point; one partition, unlike the session's two, shows where the queries' own settings went.
    store = run_stream(settings.model_copy(update={"speed_views": "order_payments", "stream_shuffle_partitions": 1}),
                       available_now=True)
    by_topic = {r["topic"]: r for r in ingest_totals(store)}
    dlq = {r["topic"]: r["count"] for r in store.read(tables.DLQ).groupBy("topic").count().collect()}
    for topic in TOPIC_NAMES:
        truth, counted = ledger["topics"][topic], by_topic[topic]
        bronze = store.read(tables.bronze(topic)).count()
        silver = store.read(tables.silver(topic)).count()
        assert bronze == truth["lines"] == counted["bronze"], topic  # landed = Bronze
        assert silver == truth["valid"] == counted["silver"], topic
        assert dlq[topic] == truth["corrupt"] == counted["dlq"], topic
        assert counted["duplicate"] == truth["duplicate"], topic
        assert counted["late"] == truth["late"], topic
        assert store.read(tables.silver(topic)).select("event_id").distinct().count() == silver
    reasons = {r["reason"].split(" '")[0].split(":")[0] for r in store.read(tables.DLQ).collect()}
    assert {"invalid JSON", "missing field", "wrong type for", "bad timestamp"} <= reasons
    # The watermark persisted: every batch after the first knew the max event time before it.
    ingested = store.read(tables.INGEST_BATCHES).where("query = 'speed_ingest'")
    assert ingested.where("batch_id > 0 AND watermark IS NULL").count() == 0
    # The queries started with their own settings (ingest's cache uncompressed, the stream's
    # partitions, kept in the checkpoint); the session, which a batch job may share, keeps its own.
    offsets = (settings.checkpoints_dir / ingest.QUERY / "offsets" / "0").read_text().splitlines()
    assert json.loads(offsets[1])["conf"].get(SHUFFLE_PARTITIONS) == "1"
    assert spark.conf.get(CACHE_COMPRESSED) == "true"
    assert spark.conf.get(SHUFFLE_PARTITIONS) == "2"


@pytest.mark.parametrize(("master", "explicit", "partitions"), [
    ("local[2]", None, 2),  # the session's two task slots
    ("local[2]", 1, 1),
    ("spark://master:7077", None, 3),  # a cluster: shuffle_partitions
])
def test_stream_shuffle_partitions(spark, settings, master, explicit, partitions):
    chosen = settings.model_copy(
        update={"spark_master": master, "stream_shuffle_partitions": explicit, "shuffle_partitions": 3})
    assert stream_shuffle_partitions(spark, chosen) == partitions


def test_rate_source_runs_continuously_and_stops_gracefully(spark, tmp_path):
    settings = load_settings(home=tmp_path / "home", event_source="rate", rate_rows_per_second=50,
                             trigger_interval="1s", view_triggers="revenue_by_segment_1h=1h",
                             spark_master="local[2]")
    stop = threading.Event()
    result = {}
    runner = threading.Thread(target=lambda: result.update(
        store=run_stream(settings, stop=stop, on_started=lambda session: result.update(session=session))))
    runner.start()
    try:  # a failed check must not leave the stream running on the session
        batches = settings.lakehouse_dir / "ops" / "ingest_batches"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if DeltaTable.is_deltatable(str(batches)) and DeltaTable(str(batches)).version() >= 3:
                break
            time.sleep(0.5)
        heartbeat = read_heartbeat(settings.run_dir)
        assert heartbeat["state"] == "running" and heartbeat["pid"] == os.getpid()
        # The stream runs on a session of its own.
        triggers = {query.name: query._jsq.streamingQuery().trigger().toString()
                    for query in result["session"].streams.active}
        assert not spark.streams.active
        # Each query runs on its own copy of that session, with the settings made for it.
        copies = {query.name: query._jsq.streamingQuery().sparkSessionForStream().conf()
                  for query in result["session"].streams.active}
        assert copies["speed_ingest"].get(CACHE_COMPRESSED) == "false"
        assert copies["speed_revenue_by_segment_1h"].get(CACHE_COMPRESSED) == "true"
        assert copies["speed_ingest"].get(NO_DATA_BATCHES) == "true"
        assert copies["speed_revenue_by_segment_1h"].get(NO_DATA_BATCHES) == "false"
        assert copies["speed_order_payments"].get(NO_DATA_BATCHES) == "true"  # the join's unpaid orders
        assert set(triggers) == {"speed_bronze", "speed_ingest", "speed_order_payments", "speed_revenue_by_segment_1h"}
        assert triggers["speed_order_payments"] == "ProcessingTimeTrigger(1000)"
        assert triggers["speed_revenue_by_segment_1h"] == "ProcessingTimeTrigger(3600000)"
        assert triggers["speed_ingest"] == "ProcessingTimeTrigger(1000)"
        assert triggers["speed_bronze"] == "ProcessingTimeTrigger(10000)"  # Bronze need not be fresh within seconds
        shown = view_status(settings)  # what `status` says: each view's interval, from the heartbeat
        refresh = {row["view"]: row["speed_refresh_seconds"] for row in shown}
        shown_views = ("user_sessions", "alerts", "customers_history", "revenue_by_segment_1h")
        assert {view: refresh[view] for view in shown_views} == {
            "user_sessions": 30, "alerts": 1, "customers_history": 30, "revenue_by_segment_1h": 3600}
        summary = {line.split()[0]: line for line in status_summary(shown).splitlines() if line}
        assert "  1 h  " in summary["revenue_by_segment_1h"] and "  30 s  " in summary["customers_history"]
        assert "  1 s  " in summary["alerts"] and "refresh" in summary["view"]
    finally:
        stop.set()
        runner.join(timeout=300)
    assert not runner.is_alive()
    store = result["store"]
    assert store.read(tables.bronze("orders")).count() > 0 and store.read(tables.silver("orders")).count() > 0
    assert store.read(tables.DLQ).count() == 0
    stopped = read_heartbeat(settings.run_dir)
    assert stopped["state"] == "stopped"
    # Every query's start and end reached the listener.
    assert set(stopped["queries"]) == set(triggers)
    assert {entry["status"] for entry in stopped["queries"].values()} == {"stopped"}
    assert {row["speed_refresh_seconds"] for row in view_status(settings)} == {None}  # nothing refreshes them now
    metrics = store.read(tables.STREAM_METRICS).where("query = 'speed_ingest' AND input_rows > 0")
    assert metrics.count() >= 1
    row = metrics.first()
    assert json.loads(row["duration_ms"])["triggerExecution"] > 0 and row["batch_duration_ms"] > 0
    # Spark's state rows, from the progress's operators: the ids the dedup keeps.
    assert row["state_rows"] > 0 and row["timestamp"] is not None


def test_one_failed_query_fails_the_stream_while_the_others_run(spark, settings):
    """A query that dies (its micro-batch raised) ends the stream at once with its error, so the
    supervisor restarts it, instead of the stream running on without that query's views."""
    from speed_layer.metrics import StreamMetrics
    from speed_layer.runner import StreamFailed, _supervise

    def fail(batch, batch_id):
        raise ValueError("a micro-batch that cannot be written")

    def started(name, writer):
        return writer.queryName(name).option("checkpointLocation", str(settings.checkpoints_dir / name)).start()

    rate = spark.readStream.format("rate").option("rowsPerSecond", 1).load()
    running = started("running", rate.writeStream.format("noop").trigger(processingTime="1 second"))
    failing = started("failing", rate.writeStream.foreachBatch(fail))
    began = time.monotonic()
    with pytest.raises(StreamFailed, match="streaming query 'failing' failed: .*a micro-batch that cannot be written"):
        _supervise([failing, running], StreamMetrics(open_reader(settings), settings.run_dir), threading.Event())
    assert not running.isActive and time.monotonic() - began < 60
