"""A continuous stream that falls behind catches up: after an outage (files landed while it was
stopped) and while files land faster than one per micro-batch, with real files, real Spark
streaming and real Delta tables. It compacts the tables it appends to as it goes."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timedelta, timezone

from include import tables
from include.backlog import Backlog, landing_backlog, taken_through, total
from include.config import load_settings
from include.generator.landing import LandingZone
from serving.status import view_status
from speed_layer.runner import run_stream
from speed_layer.sources import KAFKA_RECORD_BYTES, kafka_records_per_trigger, landing_admission

ORDERS_PER_FILE = 40
OUTAGE_LAG = 60  # seconds: the backlog of the two-minute outage, as the stream starts
CATCH_UP_TIMEOUT = 300  # seconds: a hang, not a slow machine


def caught_up(lags: list[float]) -> bool:
    """Behind after the outage, then for five seconds a fraction of that lag while files kept
    landing (a bound relative to the outage, not a wall-clock one a busy machine misses)."""
    return max(lags, default=0) > OUTAGE_LAG and max(lags[-5:]) < max(lags) / 4


def land_orders(zone: LandingZone, number: int) -> int:
    """One landing file of orders, event time now; returns its size in bytes."""
    at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    orders = [json.dumps({"order_id": f"o-{number:05d}-{i}", "user_id": f"u{i}", "product_id": "p1",
                          "category": "books", "amount": 1.0, "event_time": at}) for i in range(ORDERS_PER_FILE)]
    return zone.write("orders", f"{number:06d}", orders).stat().st_size


def test_a_stream_behind_its_input_catches_up_compacting_as_it_goes(spark, settings):
    zone = LandingZone(settings.landing_dir)
    outage = [land_orders(zone, number) for number in range(60)]
    for number in range(60):  # landed over the two minutes no stream ran
        os.utime(zone.path("orders", f"{number:06d}"), (time.time() - 120 + 2 * number,) * 2)
    # A micro-batch takes at most 20 files' bytes: the outage's backlog drains in three.
    settings = settings.model_copy(update={
        "trigger_interval": timedelta(seconds=1), "bronze_trigger_interval": timedelta(seconds=5),
        "speed_views": "revenue_by_category_5m", "max_bytes_per_trigger": 20 * max(outage),
        "stream_compaction_interval": timedelta(seconds=5)})
    assert total(landing_backlog(settings)).files == 60
    stop, result = threading.Event(), {}
    runner = threading.Thread(target=lambda: result.update(store=run_stream(settings, stop=stop)))
    runner.start()
    try:
        # A file a second while it starts and runs: more than one per micro-batch (the old cap),
        # as a micro-batch takes seconds, and few enough for a slow machine to keep up. It has
        # caught up when its lag has stayed under a bound for five seconds while files kept
        # landing; with a fixed number of files per micro-batch it grows instead.
        lags, number, started = [], 60, time.monotonic()
        while time.monotonic() - started < CATCH_UP_TIMEOUT and not caught_up(lags):
            land_orders(zone, number)
            number += 1
            lags.append(total(landing_backlog(settings)).lag(datetime.now(timezone.utc)).total_seconds())
            time.sleep(max(0.0, started + len(lags) - time.monotonic()))
        assert caught_up(lags), lags
        deadline = time.monotonic() + CATCH_UP_TIMEOUT
        while total(landing_backlog(settings)).files and time.monotonic() < deadline:
            time.sleep(0.5)
        assert total(landing_backlog(settings)).files == 0, "landed files still waiting long after the last"
        revenue = settings.lakehouse_dir / "speed" / "revenue_by_category_5m"
        while time.monotonic() < deadline and _orders_counted(revenue) < number * ORDERS_PER_FILE:
            time.sleep(0.5)
        assert _orders_counted(revenue) == number * ORDERS_PER_FILE
        shown = {row["view"]: row for row in view_status(settings)}["revenue_by_category_5m"]
        assert shown["input_waiting_files"] == 0 and shown["input_lag_seconds"] == 0
        # The newest event the view counted, as its rows show it: a window's start (up to the window's
        # 5 minutes before that event, not its end); and when it last read input.
        now = datetime.now(timezone.utc)
        assert now.timestamp() - 90 - 300 < shown["speed_max_event_time"].timestamp() <= now.timestamp()
        assert now.timestamp() - 90 < shown["speed_refreshed_at"].timestamp() <= now.timestamp() + 1
    finally:
        stop.set()
        runner.join(timeout=300)
    assert not runner.is_alive()
    store = result["store"]
    # Every order exactly once; the outage took more than one micro-batch, none over the bound.
    assert store.read(tables.silver("orders")).count() == number * ORDERS_PER_FILE
    taken = [row["silver_rows"] for row in store.read(tables.INGEST_BATCHES)
             .where("query = 'speed_ingest' AND topic = 'orders'").orderBy("batch_id").collect()]
    assert taken[0] <= 20 * ORDERS_PER_FILE and sum(taken[:3]) >= 50 * ORDERS_PER_FILE, taken
    assert max(taken) <= 20 * ORDERS_PER_FILE, taken
    # Compacted while the micro-batches appended: fewer files than micro-batches, nothing lost.
    compactions = [c for c in store.history(tables.silver("orders")) if c.operation == "OPTIMIZE"]
    files = store.read(tables.silver("orders")).inputFiles()
    assert compactions and len(files) < len(taken), (len(compactions), len(files), len(taken))


def test_a_micro_batch_takes_what_waits_up_to_a_bound(tmp_path):
    settings = load_settings(home=tmp_path / "home")
    assert landing_admission(settings, available_now=False) == {"maxBytesPerTrigger": 64 * 1024 * 1024}
    assert landing_admission(settings, available_now=True) == {"maxFilesPerTrigger": 1}  # watermarks advance between
    assert kafka_records_per_trigger(settings) == 64 * 1024 * 1024 // KAFKA_RECORD_BYTES
    chosen = load_settings(home=tmp_path / "home", max_files_per_trigger=5, max_offsets_per_trigger=1000)
    assert landing_admission(chosen, available_now=False) == landing_admission(chosen, available_now=True) == {
        "maxFilesPerTrigger": 5}
    assert kafka_records_per_trigger(chosen) == 1000


def test_the_backlog_is_what_landed_after_the_newest_file_taken(tmp_path):
    settings = load_settings(home=tmp_path / "home")
    zone = LandingZone(settings.landing_dir)
    arrivals = {}
    for number in range(4):
        path = zone.write("orders", f"{number:06d}", ['{"order_id": "o"}'])
        os.utime(path, (1_795_000_000 + number,) * 2)
        arrivals[number] = datetime.fromtimestamp(1_795_000_000 + number, timezone.utc)
    assert total(landing_backlog(settings)) == Backlog(4, 4 * 18, arrivals[0])  # nothing taken yet
    # Spark's file-source log: the newest batch's file (here a compaction of all before it) is read.
    log = settings.checkpoints_dir / "speed_ingest" / "sources" / "1"
    log.mkdir(parents=True)
    taken = [{"path": f"file://{zone.path('orders', f'{n:06d}')}", "timestamp": 1_795_000_000_000 + n * 1000,
              "batchId": n}
             for n in range(2)]
    (log / "0").write_text("v1\n" + json.dumps(taken[0]))
    (log / "1.compact").write_text("v1\n" + "\n".join(json.dumps(entry) for entry in taken))
    assert taken_through(settings) == {"orders": arrivals[1]}
    waiting = landing_backlog(settings)
    assert waiting["orders"] == Backlog(2, 2 * 18, arrivals[2]) and waiting["clicks"] == Backlog()
    now = arrivals[3] + timedelta(seconds=10)
    assert total(waiting).lag(now) == timedelta(seconds=11) and Backlog().lag(now) == timedelta(0)


def _orders_counted(table) -> int:
    from deltalake import DeltaTable

    if not DeltaTable.is_deltatable(str(table)):
        return 0
    return sum(DeltaTable(str(table)).to_pyarrow_table(columns=["orders"]).column("orders").to_pylist())
