"""The one pass on hand-made micro-batches: partial rows merged across micro-batches give the
definition's rows of all their events, sessions grow and merge, alerts are raised once, and a
replayed micro-batch changes nothing."""

from __future__ import annotations

import json
import statistics
from datetime import datetime, timezone
from unittest.mock import ANY

import pytest
from pyspark.sql import functions as F

from include import tables
from include.lakehouse import Txn, open_store
from include.registry import ViewContext, column_names
from include.views import VIEWS_BY_NAME
from speed_layer.view_pass import MicroBatch, ViewPass

ORDERS = "order_id string, user_id string, category string, amount double, event_time timestamp, arrived_at timestamp"
PAYMENTS = ("payment_id string, order_id string, amount double, method string, event_time timestamp, "
            "arrived_at timestamp")
CLICKS = "user_id string, page_url string, action string, event_time timestamp, arrived_at timestamp"
SENSORS = "device_id string, temperature double, humidity double, event_time timestamp, arrived_at timestamp"


def t(hour, minute, second=0):
    return datetime(2026, 11, 20, hour, minute, second, tzinfo=timezone.utc)


def order(order_id, minute, user="u1", category="books", amount=10.0, hour=10):
    return (order_id, user, category, amount, t(hour, minute), t(hour, minute))


def payment(payment_id, order_id, minute, hour=10, amount=10.0):
    return (payment_id, order_id, amount, "card", t(hour, minute), t(hour, minute))


@pytest.fixture
def run_pass(spark, settings):
    """Run the pass of ``views`` on one micro-batch: its on-time events per topic (ingested at
    12:00 plus the batch id in seconds, modulo a minute) and the watermarks before and after it.
    The events go into Silver too, as ingest writes them, where later micro-batches read them."""
    store = open_store(settings, spark)
    passes = {}

    def run(views, batch_id, orders=(), payments=(), watermark=None, after=None, clicks=(), orders_watermark=None,
            sensors=(), sensors_watermark=None, orders_after=None, new_process=False):
        views = [VIEWS_BY_NAME[name] for name in views]
        if new_process:
            passes.clear()
        given = {"orders": (orders, ORDERS), "payments": (payments, PAYMENTS), "clicks": (clicks, CLICKS),
                 "sensors": (sensors, SENSORS)}
        ingested_at = F.lit(t(12, 0, batch_id % 60))
        frames = {topic: spark.createDataFrame(list(rows), schema).withColumn("ingested_at", ingested_at)
                  for topic, (rows, schema) in given.items()}
        watermarks = {"payments": watermark, "orders": orders_watermark, "sensors": sensors_watermark}
        txn = Txn("speed_ingest", batch_id)
        batch = MicroBatch(
            spark=spark, txn=txn, at=t(12, 0, batch_id % 60),
            fed={topic for topic, (rows, _) in given.items() if rows},
            events=frames.__getitem__, watermarks=watermarks,
            watermarks_after={"payments": after, "orders": orders_after})
        for topic in given:  # as ingest ensures them before its first micro-batch
            store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS)
        view_pass = passes.setdefault(tuple(view.name for view in views), ViewPass(settings, store, views))
        for write in view_pass.writes(batch).values():
            write()
        for topic in batch.fed:
            store.append(tables.silver(topic), frames[topic].withColumns({
                "event_id": F.expr("uuid()"), "batch_id": F.lit(batch_id).cast("bigint"), "is_late": F.lit(False),
                "date": F.to_date("event_time")}), txn)
        return store

    return run


def test_partials_of_micro_batches_merge_into_the_rows_of_all_their_events(spark, settings, run_pass):
    view = VIEWS_BY_NAME["revenue_by_category_5m"]
    batches = [[order("o1", 0, "u1"), order("o2", 1, "u2", "toys")], [order("o3", 2, "u1"), order("o4", 6, "u3")],
               [order("o5", 4, "u4", amount=0.1)]]
    for batch_id, orders in enumerate(batches):
        store = run_pass([view.name], batch_id, orders=orders)
    whole = view({"orders": spark.createDataFrame([o for batch in batches for o in batch], ORDERS)},
                 ViewContext(settings, exact=False)).select(*view.columns)
    assert sorted(store.read(view.speed_table).select(*view.columns).collect()) == sorted(whole.collect())
    version = store.version(view.speed_table)
    run_pass([view.name], 1, orders=batches[1])  # a replay: its commit is there already
    assert store.version(view.speed_table) == version


def test_no_events_of_a_view_s_topics_no_work(spark, settings, run_pass):
    store = run_pass(["revenue_by_category_5m"], 0, payments=[payment("p1", "o1", 0)])
    assert store.read(VIEWS_BY_NAME["revenue_by_category_5m"].speed_table).count() == 0


def test_sessions_grow_merge_and_leave_a_tombstone(spark, settings, run_pass):
    """Open sessions are visible; a click that bridges two sessions leaves one row (the later
    session's row is deleted); a replay changes nothing; the pages are kept for the next merge."""
    view = VIEWS_BY_NAME["user_sessions"]

    def click(user, page, minute, action="view"):
        return (user, page, action, t(10, minute), t(10, minute))

    def sessions():
        return sorted((r["user_id"], r["session_start"].minute, r["session_end"].minute, r["events"], r["pages"],
                       r["converted"]) for r in store.read(view.speed_table).collect())

    store = run_pass([view.name], 0, clicks=[click("u1", "/a", 0), click("u1", "/b", 10), click("u1", "/a", 41),
                                             click("u2", "/a", 5)])
    assert sessions() == [("u1", 0, 10, 2, 2, False), ("u1", 41, 41, 1, 1, False), ("u2", 5, 5, 1, 1, False)]
    store = run_pass([view.name], 1, clicks=[click("u1", "/c", 35, "add_to_cart")])  # 10:35 bridges both
    assert sessions() == [("u1", 0, 41, 4, 3, True), ("u2", 5, 5, 1, 1, False)]
    version = store.version(view.speed_table)
    run_pass([view.name], 1, clicks=[click("u1", "/c", 35, "add_to_cart")])  # a replay
    assert store.version(view.speed_table) == version
    store = run_pass([view.name], 2, clicks=[click("u1", "/a", 50), click("u2", "/a", 40)])  # /a seen: 3 pages
    assert sessions() == [("u1", 0, 50, 5, 3, True), ("u2", 5, 5, 1, 1, False), ("u2", 40, 40, 1, 1, False)]
    whole = view({"clicks": spark.createDataFrame(
        [click("u1", "/a", 0), click("u1", "/b", 10), click("u1", "/a", 41), click("u2", "/a", 5),
         click("u1", "/c", 35, "add_to_cart"), click("u1", "/a", 50), click("u2", "/a", 40)], CLICKS)},
        ViewContext(settings, exact=True))
    assert sorted(store.read(view.speed_table).select(*view.columns).collect()) == sorted(
        whole.select(*view.columns).collect())  # the batch's answer


def reading(device, minute, temperature=20.0, hour=10):
    return (device, temperature, 40.0, t(hour, minute), t(hour, minute))


def test_alerts_raised_once_from_the_micro_batch_and_the_earlier_events(spark, settings, run_pass):
    """An anomaly looks back at readings of an earlier micro-batch; an order-velocity alert is
    raised once, when the window's sixth order comes, and its count grows with the same
    detection; the notifier hears of each alert once, and a replay changes nothing."""
    view = VIEWS_BY_NAME["alerts"]

    def alerts():
        rows = store.read(view.speed_table).collect()  # Spark's times are naive UTC
        return {r["alert_id"]: (r["value"], r["detected_at"].replace(tzinfo=timezone.utc)) for r in rows}

    store = run_pass(["alerts"], 0, sensors=[reading("D1", minute, 20.0 + minute % 2 / 2) for minute in range(5)],
                     orders=[order(f"o{i}", 1, user="u9") for i in range(6)])
    assert alerts() == {"order_velocity|u9|2026-11-20T10:00:00.000Z": (6.0, t(12, 0, 0))}
    store = run_pass(["alerts"], 1, sensors=[reading("D1", 5, 30.0), reading("D1", 6, 85.0), reading("D2", 6, 30.0)],
                     orders=[order("o7", 2, user="u9")], sensors_watermark=t(9, 55), orders_watermark=t(9, 55))
    prior = [20.0, 20.5, 20.0, 20.5, 20.0]
    assert alerts() == {
        "order_velocity|u9|2026-11-20T10:00:00.000Z": (7.0, t(12, 0, 0)),  # the first detection stands
        "temperature_anomaly|D1|2026-11-20T10:05:00.000Z":
            (pytest.approx((30.0 - statistics.mean(prior)) / statistics.stdev(prior)), t(12, 0, 1)),
        "high_temperature|D1|2026-11-20T10:06:00.000Z": (85.0, t(12, 0, 1)),
        "temperature_anomaly|D1|2026-11-20T10:06:00.000Z": (ANY, t(12, 0, 1)),  # D2 has no readings before
    }
    announced = sorted(json.loads(r["details"])["alert_id"] for r in store.read("ops/alerts").collect())
    assert announced == sorted(alerts())
    version = store.version(view.speed_table)
    run_pass(["alerts"], 1, sensors=[reading("D1", 5, 30.0)], sensors_watermark=t(9, 55))  # a replay
    assert store.version(view.speed_table) == version


def test_views_on_an_interval_of_their_own_see_each_micro_batch_once(spark, tmp_path):
    """Running continuously, the views with a refresh (sessions, the customers' history) run every
    30 s on the micro-batches since they last ran; a new process, continuous or not, reads those
    back from Silver and runs at once. Their rows end as those of a run on every micro-batch, and
    the other views' rows are unchanged."""
    from datetime import timedelta

    from include.backlog import landed_files
    from include.config import load_settings
    from include.generator import TrafficOptions, generate
    from include.schemas import TOPIC_NAMES
    from include.views import speed_views
    from pyspark.sql import functions as F

    from speed_layer.ingest import QUERY, IngestBatch, record_topics, spark_parsed

    # The two views on an interval, and one that runs with every micro-batch.
    every = load_settings(home=tmp_path / "every", spark_master="local[2]", shuffle_partitions=2,
                          speed_views="user_sessions,customers_history,revenue_by_category_5m")
    generate(every, t(0, 0), 2, TrafficOptions(orders_per_hour=60, corrupt_fraction=0), seed=7, file_minutes=15,
             progress=False)
    files = {topic: landed_files(every.landing_dir / topic, topic) for topic in TOPIC_NAMES}
    spaced = every.model_copy(update={"home": tmp_path / "spaced"})
    start = t(12, 0)

    def micro_batch(k):
        """The ingest query's k-th micro-batch: the k-th file of each topic, parsed, as its
        source reads them (ingested at its time; the generator lands no copies here)."""
        raw = {topic: spark.read.text(str(topic_files[k].path)).select(
                   F.lit(topic).alias("topic"), F.col("value").cast("binary").alias("value"),
                   F.col("_metadata.file_path").alias("source"),
                   F.col("_metadata.file_modification_time").alias("arrived_at"))
               for topic, topic_files in files.items() if k < len(topic_files)}
        parsed = spark_parsed(raw, record_topics(tuple(raw)))
        return parsed.withColumn("ingested_at", F.lit(start + timedelta(seconds=10 * k)))

    def run(settings, continuous, batch_ids):
        ingest = IngestBatch(settings, open_store(settings, spark), TOPIC_NAMES, continuous)
        offsets = settings.checkpoints_dir / QUERY / "offsets"
        offsets.mkdir(parents=True, exist_ok=True)
        for k in batch_ids:  # micro-batches 10 s apart, their times in the offset log as Spark keeps them
            at = int((start + timedelta(seconds=10 * k)).timestamp() * 1000)
            (offsets / str(k)).write_text(f'v1\n{{"batchTimestampMs": {at}}}\n')
            ingest(micro_batch(k), k)
        return ingest.store

    run(every, False, range(8))
    store = run(spaced, True, range(5))  # runs at 0 (a new process), at 3 (30 s later), not at 4
    sessions, history = VIEWS_BY_NAME["user_sessions"], VIEWS_BY_NAME["customers_history"]
    assert {store.txn_version(view.speed_table, "speed_ingest") for view in (sessions, history)} == {3}
    assert store.txn_version("speed/revenue_by_category_5m", "speed_ingest") == 4
    run(spaced, True, [5, 6])  # a new process: at once on 4 (from Silver) and 5, not at 6
    assert store.txn_version(sessions.speed_table, "speed_ingest") == 5
    store = run(spaced, False, [7])  # --available-now: it catches up on 6, then runs with every micro-batch
    assert store.txn_version(sessions.speed_table, "speed_ingest") == 7

    reference = open_store(every, spark)
    for view in speed_views(every):
        if view.in_ingest_pass:
            columns = column_names(view.speed_fields)
            assert sorted(store.read(view.speed_table).select(*columns).collect()) == sorted(
                reference.read(view.speed_table).select(*columns).collect()), view.name
