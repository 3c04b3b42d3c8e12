"""Every view definition and shared rule on tiny inline frames, with its boundary cases."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import statistics

import pyarrow as pa
import pytest
from pyspark.testing import assertDataFrameEqual

from include.registry import ViewContext, input_topics
from include.views import VIEWS, VIEWS_BY_NAME
from include.views.alerting import alerts
from include.views.clicks import traffic_by_page_10m, user_sessions
from include.views.devices import device_health_5m
from include.views.orders import best_order_status, order_payments, revenue_by_category_5m
from include.views.rules import distinct_count, first_copies, hll_lg_k, merged_distinct_count

ORDERS = "order_id string, user_id string, category string, amount double, event_time timestamp"
PAYMENTS = "payment_id string, order_id string, amount double, event_time timestamp"
CLICKS = "event_id string, user_id string, page_url string, action string, event_time timestamp"
SENSORS = "device_id string, temperature double, humidity double, event_time timestamp"
IMAGE = "struct<customer_id:string,name:string,email:string,segment:string,country:string>"
CDC = f"op string, ts_ms bigint, before {IMAGE}, after {IMAGE}, event_time timestamp, arrived_at timestamp"


def t(hour, minute, second=0):
    return datetime(2026, 11, 20, hour, minute, second)


def cdc_change(i):
    customer, minute = f"C{i % 5}", (i * 7) % 4  # i and i + 20: equal ts_ms, the later arrival wins
    op = ("c", "u", "u", "d", "u", "c")[i % 6]
    image = (customer, f"name{i}", f"c{i}@example.com", ("gold", "silver", None)[i % 3], "DE")
    at = t(10, minute, i % 2)
    ts_ms = int((at - datetime(1970, 1, 1)).total_seconds() * 1000)
    return (op, ts_ms, image if op == "d" else None, None if op == "d" else image, at, t(11, 0, i))


@pytest.fixture
def exact(settings):
    return ViewContext(settings, exact=True)


def test_revenue_windows_are_tumbling_and_exact_in_batch(spark, exact):
    orders = spark.createDataFrame(
        [("o1", "u1", "books", 10.10, t(10, 0)), ("o2", "u1", "books", 0.20, t(10, 4, 59)),
         ("o3", "u2", "books", 5.00, t(10, 5)),  # exactly at the next window's start
         ("o4", "u3", "toys", 1.00, t(10, 1))],
        ORDERS,
    )
    expected = spark.createDataFrame(
        [(t(10, 0), t(10, 5), "books", 10.30, 2, 1, date(2026, 11, 20)),
         (t(10, 5), t(10, 10), "books", 5.00, 1, 1, date(2026, 11, 20)),
         (t(10, 0), t(10, 5), "toys", 1.00, 1, 1, date(2026, 11, 20))],
        VIEWS_BY_NAME["revenue_by_category_5m"].schema,
    )
    assertDataFrameEqual(revenue_by_category_5m({"orders": orders}, exact), expected)


SAMPLES = {  # a few events per topic with repeated keys, windows and users
    # some a fraction of a second before a window's end
    "orders": ([(f"o{i}", f"u{i % 3}", ("books", "toys")[i % 2], 1.25 * i,
                 t(10, i % 12, i) + timedelta(milliseconds=700 * (i % 2))) for i in range(24)]
               + [("o99", "u9", "toys", 9.99, t(10, 4, 59) + timedelta(milliseconds=600))], ORDERS),
    "clicks": ([(f"e{i}", f"u{i % 4}", ("/home", "/cart")[i % 2], ("view", "click", "add_to_cart")[i % 3],
                 t(10, i % 17, i)) for i in range(30)], CLICKS),
    "sensors": ([(f"D{i % 3}", 20 + (i * 7 % 13) / 4, 40.0 + i % 5, t(10, i % 11, i)) for i in range(33)], SENSORS),
    # within an hour of their order, after it, or before it; two payments for some orders
    "payments": ([(f"p{i}", f"o{i % 15}", 1.25 * i, t(9 + i % 3, i % 12, i)) for i in range(20)], PAYMENTS),
    # changes of five customers out of order: deletes, re-creations, equal ts_ms arriving later
    "customers_cdc": ([cdc_change(i) for i in range(30)], CDC),
}


@pytest.mark.parametrize("view", [view for view in VIEWS if view.speed.partials], ids=lambda view: view.name)
def test_partial_rows_of_two_parts_merge_into_the_rows_of_the_whole(spark, settings, view):
    """The law the one-pass speed layer rests on: a view with partials gives the same rows from the
    micro-batches of a stream merged as from all their events at once."""
    from include.registry import column_names, merged_partials

    if any(topic not in SAMPLES for topic in view.inputs) or view.lookups:
        pytest.skip(f"{view.name}: its lookups or inputs have no sample here (tested with its family)")
    speed = ViewContext(settings, exact=False)
    whole = {topic: spark.createDataFrame(*SAMPLES[topic]) for topic in view.inputs}
    parts = [{topic: frame.where(f"substr(event_time, 18, 2) % 2 = {half}") for topic, frame in whole.items()}
             for half in (0, 1)]
    columns = column_names(view.speed_fields)
    partial = view(parts[0], speed).select(*columns).unionByName(view(parts[1], speed).select(*columns))
    shown = column_names(view.fields)
    assertDataFrameEqual(merged_partials(view, partial).select(*shown), view(whole, speed).select(*shown))


def test_first_payment_inside_the_join_window(spark, exact):
    orders = spark.createDataFrame(
        [("o1", "u1", "books", 10.0, t(10, 0)), ("o2", "u1", "books", 20.0, t(10, 0)),
         ("o3", "u2", "toys", 30.0, t(10, 0)), ("o4", "u2", "toys", 40.0, t(10, 0))],
        ORDERS,
    )
    payments = spark.createDataFrame(
        [("p1", "o1", 10.0, t(11, 0)),  # exactly at order time + 1 h: inside
         ("p2", "o2", 20.0, t(9, 59)),  # before the order: outside
         ("p3", "o2", 20.0, t(11, 0, 1)),  # one second after the window: outside
         ("p5", "o3", 30.0, t(10, 30)), ("p4", "o3", 30.0, t(10, 30)),  # same instant: lower id wins
         ("p6", "o4", None, t(10, 5))],  # a null amount still pays (validation is the parser's job)
        PAYMENTS,
    )
    day = date(2026, 11, 20)
    expected = spark.createDataFrame(
        [("o1", "u1", "books", 10.0, t(10, 0), "p1", 10.0, t(11, 0), "paid", day),
         ("o2", "u1", "books", 20.0, t(10, 0), None, None, None, "unpaid", day),
         ("o3", "u2", "toys", 30.0, t(10, 0), "p4", 30.0, t(10, 30), "paid", day),
         ("o4", "u2", "toys", 40.0, t(10, 0), "p6", None, t(10, 5), "paid", day)],
        VIEWS_BY_NAME["order_payments"].schema,
    )
    assertDataFrameEqual(order_payments({"orders": orders, "payments": payments}, exact), expected)


def test_speed_rows_include_pending_and_the_best_status_wins(spark, settings):
    orders = spark.createDataFrame([("o1", "u1", "books", 10.0, t(10, 0))], ORDERS)
    payments = spark.createDataFrame([("p1", "o1", 10.0, t(10, 10))], PAYMENTS)
    speed = order_payments({"orders": orders, "payments": payments}, ViewContext(settings, exact=False))
    assert sorted(r["status"] for r in speed.collect()) == ["paid", "pending"]
    assert [(r["order_id"], r["status"], r["payment_id"]) for r in best_order_status(speed).collect()] == [
        ("o1", "paid", "p1")]
    unpaid_and_pending = speed.where("status = 'pending'").unionByName(
        speed.where("status = 'pending'").selectExpr(
            *[c if c != "status" else "'unpaid' AS status" for c in speed.columns])
    )
    assert [r["status"] for r in best_order_status(unpaid_and_pending).collect()] == ["unpaid"]


def test_first_copies_keep_the_first_arrival_in_batch(spark):
    rows = spark.createDataFrame(
        [("e1", t(10, 2), "b.jsonl", bytearray(b"second")), ("e1", t(10, 1), "a.jsonl", bytearray(b"first")),
         ("e1", t(10, 1), "a.jsonl", bytearray(b"zfirst-tie")), ("e2", None, "c.jsonl", bytearray(b"only"))],
        "event_id string, arrived_at timestamp, source string, value binary",
    )
    kept = {r["event_id"]: bytes(r["value"]) for r in first_copies(rows, ["event_id"]).collect()}
    assert kept == {"e1": b"first", "e2": b"only"}


def test_first_copies_in_a_stream_drop_copies_within_the_horizon_and_keep_ids_that_long(spark, settings):
    """Five micro-batches (ingestion times given, a 10-minute horizon): copies 9 and exactly 10
    minutes after the first are dropped; ids are forgotten once a micro-batch has seen 10
    minutes pass, so the state holds one horizon of ids, and a copy 22 minutes later is new."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = settings.home / "ingested"
    folder.mkdir(parents=True)
    batches = [(t(10, 0), ["a", "b", "c"]), (t(10, 9), ["a", "d"]), (t(10, 10), ["b"]), (t(10, 21), ["e"]),
               (t(10, 22), ["c"])]
    for number, (at, ids) in enumerate(batches):
        path = folder / f"{number}.parquet"
        pq.write_table(pa.table({"event_id": ids, "ingested_at": pa.array([at] * len(ids), pa.timestamp("us"))}), path)
        os.utime(path, (1_000_000 + number, 1_000_000 + number))  # the file source reads by modification time
    events = (spark.readStream.schema("event_id string, ingested_at timestamp").option("maxFilesPerTrigger", 1)
              .parquet(str(folder)))
    query = (first_copies(events, ["event_id"], timedelta(minutes=10)).writeStream.format("memory")
             .queryName("first_copies").option("checkpointLocation", str(settings.checkpoints_dir / "first_copies"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    kept = sorted((r["event_id"], r["ingested_at"]) for r in spark.table("first_copies").collect())
    assert kept == [("a", t(10, 0)), ("b", t(10, 0)), ("c", t(10, 0)), ("c", t(10, 22)), ("d", t(10, 9)),
                    ("e", t(10, 21))]
    state = {p["batchId"]: p["stateOperators"][0]["numRowsTotal"] for p in query.recentProgress if p["numInputRows"]}
    assert state[2] == 4 and state[3] == 2  # batch 3 saw 10:10 pass: a, b and c (10:00) forgotten


def test_the_registry_declares_each_view_completely():
    assert [view.name for view in VIEWS] == list(VIEWS_BY_NAME)
    for view in VIEWS:
        assert view.schema.fieldNames()[-1] == "date" and view.speed.freshness_time in view.columns
        assert view.key_time in view.columns or view.kind == "dimension"  # a dimension's: when a row last changed
        assert set(view.keys) <= set(view.columns) and "rows" in view.metrics
        assert set(view.drift_metrics) <= set(view.metrics)
        assert view.speed_table == f"speed/{view.name}" and view.batch_table == f"batch/{view.name}"
        # A view looks up dimensions declared before it (the batch computes them first).
        assert all(VIEWS_BY_NAME[name].kind == "dimension" and VIEWS.index(VIEWS_BY_NAME[name]) < VIEWS.index(view)
                   for name in view.lookups)
    assert input_topics(VIEWS) == ("orders", "payments", "clicks", "sensors", "customers_cdc")
    assert {view.name for view in VIEWS} >= {
        "user_sessions", "alerts", "customers", "customers_history", "revenue_by_segment_1h"}


def test_input_days_follow_the_join_window(settings):
    view = VIEWS_BY_NAME["order_payments"]
    day = date(2026, 11, 20)
    assert view.input_days("orders", day, settings) == [day]
    assert view.input_days("payments", day, settings) == [day, date(2026, 11, 21)]
    # A session starting on the day may continue clicks from before midnight and run past the next.
    assert VIEWS_BY_NAME["user_sessions"].input_days("clicks", day, settings) == [
        date(2026, 11, 19), day, date(2026, 11, 21)]
    assert VIEWS_BY_NAME["alerts"].input_days("sensors", day, settings) == [date(2026, 11, 19), day]


def test_the_speed_merge_keeps_the_row_the_batch_rule_keeps(spark, settings):
    """The merge condition and the ranking are derived from one precedence: merging any new row
    into any stored row leaves what best_order_status keeps of the two."""
    from include.lakehouse import Txn, open_store
    from include.registry import replaces_sql

    view = VIEWS_BY_NAME["order_payments"]
    day = date(2026, 11, 20)
    candidates = {
        "pending": ("o1", "u1", "books", 1.0, t(10, 0), None, None, None, "pending", day),
        "unpaid": ("o1", "u1", "books", 1.0, t(10, 0), None, None, None, "unpaid", day),
        "paid_p2_late": ("o1", "u1", "books", 1.0, t(10, 0), "p2", 1.0, t(10, 30), "paid", day),
        "paid_p3_early": ("o1", "u1", "books", 1.0, t(10, 0), "p3", 1.0, t(10, 10), "paid", day),
        "paid_p1_early": ("o1", "u1", "books", 1.0, t(10, 0), "p1", 1.0, t(10, 10), "paid", day),
    }
    # Every pair at once, each under an order id of its own: one merge of the stored rows, one of the new.
    pairs = [(candidates[a], candidates[b]) for a in candidates for b in candidates]
    stored = [(f"o{number}", *row[1:]) for number, (row, _) in enumerate(pairs)]
    new = [(f"o{number}", *row[1:]) for number, (_, row) in enumerate(pairs)]
    store = open_store(settings, spark)
    store.ensure_table("merged", view.schema, ["date"])
    store.merge("merged", spark.createDataFrame(stored, view.schema), ["order_id"])
    store.merge("merged", spark.createDataFrame(new, view.schema), ["order_id"], Txn("q", 0),
                replaces_sql(view.speed.precedence))
    assertDataFrameEqual(store.read("merged"), best_order_status(spark.createDataFrame(stored + new, view.schema)))


def test_a_speed_merge_rewrites_only_the_files_of_its_key_times(spark, settings):
    """A fact view's rows are matched on their keys and their key time and day, which never change
    for a key: a micro-batch's merge rewrites the file of its hour, not the day's."""
    from deltalake import DeltaTable

    from include.lakehouse import Txn, open_store
    from include.registry import replaces_sql

    view = VIEWS_BY_NAME["order_payments"]
    assert view.merge_on == ("order_id", "order_time", "date")
    day = date(2026, 11, 20)
    store = open_store(settings, spark)
    store.ensure_table(view.speed_table, view.schema, ["date"])

    def merge(rows, batch_id):
        store.merge(view.speed_table, spark.createDataFrame(rows, view.schema), view.merge_on, Txn("speed", batch_id),
                    replaces_sql(view.speed.precedence))

    for hour in range(8, 12):  # a micro-batch per hour: its pending orders in files of their own
        merge([(f"o{hour}-{n}", "u1", "books", 1.0, t(hour, n), None, None, None, "pending", day) for n in range(3)],
              hour)
    merge([("o11-1", "u1", "books", 1.0, t(11, 1), "p1", 1.0, t(11, 5), "paid", day),
           ("o11-9", "u1", "books", 1.0, t(11, 9), None, None, None, "pending", day)], 12)

    metrics = DeltaTable(store.path(view.speed_table)).history(1)[0]["operationMetrics"]
    assert int(metrics["numTargetFilesRemoved"]) == 1  # 11:00's file; those of 08:00-10:59 are not rewritten
    assert (int(metrics["numTargetRowsUpdated"]), int(metrics["numTargetRowsInserted"])) == (1, 1)
    stored = {row["order_id"]: row["status"] for row in store.read(view.speed_table).collect()}
    assert len(stored) == 13 and stored["o11-1"] == "paid" and stored["o10-1"] == "pending"


def test_a_fact_views_key_time_is_a_column_dimensions_merge_on_their_keys():
    import dataclasses

    assert VIEWS_BY_NAME["revenue_by_category_5m"].merge_on == ("window_start", "category", "date")
    assert VIEWS_BY_NAME["customers"].merge_on == ("customer_id",)  # its key time moves with each change
    with pytest.raises(ValueError, match="a fact view's key_time must be one of its columns"):
        dataclasses.replace(VIEWS_BY_NAME["order_payments"], key_time="coalesce(pay_time, order_time)")


@pytest.mark.parametrize("is_exact", [True, False])
def test_traffic_windows_slide_every_five_minutes(spark, settings, is_exact):
    clicks = spark.createDataFrame(
        [("e1", "u1", "/home", "view", t(10, 4, 59)),  # in the windows starting 09:55 and 10:00
         ("e2", "u1", "/home", "click", t(10, 5)),  # exactly at 10:05: windows 10:00 and 10:05
         ("e3", "u2", "/home", "add_to_cart", t(10, 9, 59)),
         ("e4", "u2", "/cart", "view", t(10, 10))],  # windows 10:05 and 10:10
        CLICKS,
    )
    day = date(2026, 11, 20)
    expected = spark.createDataFrame(
        [(t(9, 55), t(10, 5), "/home", 1, 0, 0, 1, day),
         (t(10, 0), t(10, 10), "/home", 1, 1, 1, 2, day),
         (t(10, 5), t(10, 15), "/home", 0, 1, 1, 2, day),
         (t(10, 5), t(10, 15), "/cart", 1, 0, 0, 1, day),
         (t(10, 10), t(10, 20), "/cart", 1, 0, 0, 1, day)],
        VIEWS_BY_NAME["traffic_by_page_10m"].schema,
    )
    rows = traffic_by_page_10m({"clicks": clicks}, ViewContext(settings, exact=is_exact))
    assertDataFrameEqual(rows.select(*expected.columns), expected)


@pytest.mark.parametrize(("rsd", "lg_k"), [(0.3, 4), (0.05, 9), (0.02, 12), (0.01, 14), (0.005, 16)])
def test_the_stream_sketch_has_the_buckets_its_error_needs(rsd, lg_k):
    assert hll_lg_k(rsd) == lg_k
    assert 1.04 / 2 ** (lg_k / 2) <= rsd  # DataSketches HLL's error with 2^lg_k buckets


def test_the_stream_distinct_count_is_exact_for_few_values_and_within_its_error_for_many(spark, settings):
    from pyspark.sql import functions as F

    def users(rows: int):  # noqa: ANN202 - DataFrame
        return spark.range(rows).select((F.col("id") % 3).alias("group"),
                                        (F.col("id") % 20_003).cast("string").alias("user_id"))

    speed = ViewContext(settings, exact=False)
    few = users(50).groupBy("group").agg(*distinct_count("user_id", "n", speed))
    assert sorted(row.n for row in few.collect()) == [16, 17, 17]
    many = users(30_000).agg(*distinct_count("user_id", "n", speed)).first().n
    assert abs(many - 20_003) <= 3 * settings.approx_distinct_rsd * 20_003


def test_sketched_distinct_counts_merge_as_the_whole_counts(spark, settings):
    """Sketches of two parts merged estimate what one sketch of the whole does (HLL unions lose nothing)."""
    from pyspark.sql import functions as F

    speed = ViewContext(settings, exact=False)
    users = spark.range(30_000).select((F.col("id") % 2).alias("part"),
                                       (F.col("id") % 20_003).cast("string").alias("user_id"))
    whole = users.agg(*distinct_count("user_id", "n", speed)).first().n
    parts = users.groupBy("part").agg(*distinct_count("user_id", "n", speed))
    merged = parts.agg(*[F.expr(sql).alias(name) for name, sql in merged_distinct_count("n").items()]).first().n
    assert merged == whole


def test_device_health_statistics_one_reading_and_zero_deviation(spark, exact):
    readings = spark.createDataFrame(
        [("D1", 20.0, 40.0, t(10, 0)), ("D1", 22.0, 50.0, t(10, 1)), ("D1", 27.0, 60.0, t(10, 4, 59)),
         ("D1", 30.0, 45.0, t(10, 5)),  # alone in the next window: no sample deviation
         ("D2", 21.5, 40.0, t(10, 0)), ("D2", 21.5, 40.0, t(10, 2))],  # equal readings: deviation 0
        SENSORS,
    )
    rows = {(r["device_id"], r["window_start"]): r for r in device_health_5m({"sensors": readings}, exact).collect()}
    first = rows[("D1", t(10, 0))]
    assert (first["readings"], first["avg_temperature"], first["min_temperature"], first["max_temperature"]) == (
        3, 23.0, 20.0, 27.0)
    assert first["stddev_temperature"] == pytest.approx(3.605551275463989) and first["avg_humidity"] == 50.0
    alone = rows[("D1", t(10, 5))]
    assert (alone["readings"], alone["stddev_temperature"], alone["window_end"]) == (1, None, t(10, 10))
    assert rows[("D2", t(10, 0))]["stddev_temperature"] == 0.0
    assert set(rows) == {("D1", t(10, 0)), ("D1", t(10, 5)), ("D2", t(10, 0))}


# ---- user_sessions and alerts -------------------------------------------------------------------


def test_sessions_merge_below_the_gap_and_split_at_exactly_the_gap(spark):
    """The stream's merge of clicks and stored sessions (sessions_merge_sql)."""

    from include import ddl
    from include.views.clicks import SESSION_GAP, sessions_merge_sql, user_sessions
    from include.views.sql import spark_rows

    def merged(stored: list[tuple], clicks: list[tuple]) -> list[tuple]:
        stored_rows = pa.Table.from_pylist(
            [{"user_id": "u1", "session_start": t(10, start), "session_end": t(10, end), "events": events,
              "pages": len(pages), "duration_seconds": 0.0, "converted": False, "date": t(10, 0).date(),
              "page_urls": pages} for start, end, events, pages in stored],
            schema=ddl.arrow_schema(user_sessions.speed_fields))
        click_rows = pa.Table.from_pylist(
            [{"user_id": "u1", "event_time": t(10, 0) + timedelta(minutes=minute), "page_url": page,
              "action": "add_to_cart" if cart else "view"} for minute, page, cart in clicks],
            schema=pa.schema([("user_id", pa.string()), ("event_time", pa.timestamp("us", "UTC")),
                              ("page_url", pa.string()), ("action", pa.string())]))
        inputs = {"stored": stored_rows, "clicks": click_rows}
        sql = sessions_merge_sql(SESSION_GAP)
        rows = spark_rows(sql, {name: spark.createDataFrame(table) for name, table in inputs.items()}).toArrow()
        def minute(at: datetime) -> float:  # since 10:00 (the session's times are UTC)
            return round((at.replace(tzinfo=None) - t(10, 0)).total_seconds() / 60, 9)

        return sorted((minute(row["session_start"]), minute(row["session_end"]),
                       row["events"], row["pages"], row["converted"], list(row["page_urls"]))
                      for row in rows.to_pylist())

    assert merged([], [(0, "/a", False), (29.99, "/b", False), (59.99 + 1, "/a", True), (10, "/b", False)]) == [
        (0, 29.99, 3, 2, False, ["/a", "/b"]), (60.99, 60.99, 1, 1, True, ["/a"])]
    # Exactly the gap apart: one session (Spark's session_window); a microsecond more: two.
    assert len(merged([], [(0, "/a", False), (30, "/a", False)])) == 1
    assert len(merged([], [(0, "/a", False), (30 + 1 / 60e6, "/a", False)])) == 2
    # A click between two stored sessions joins them into one; the later one gets a tombstone.
    assert merged([(0, 0, 1, ["/a"]), (40, 40, 1, ["/a"])], [(20, "/c", True)]) == [
        (0, 40, 3, 2, True, ["/a", "/c"]), (40, 40, 0, 0, False, [])]
    # A click inside a stored session that changes nothing of it gives no row; one that does, its new row.
    assert merged([(0, 10, 2, ["/a"])], [(5, "/a", False)]) == [(0, 10, 3, 1, False, ["/a"])]
    assert merged([(0, 10, 2, ["/a"])], []) == []


def test_user_sessions_in_batch(spark, exact):
    clicks = spark.createDataFrame(
        [("e1", "u1", "/home", "view", t(10, 0)), ("e2", "u1", "/p/1", "add_to_cart", t(10, 10)),
         ("e3", "u1", "/home", "view", t(10, 40, 1)),  # 30 minutes and a second after the last click: a new session
         ("e4", "u1", "/home", "view", t(11, 10, 1)),  # exactly 30 minutes later: the same session
         ("e5", "u2", "/home", "view", t(23, 50)), ("e6", "u2", "/home", "view", datetime(2026, 11, 21, 0, 5))],
        CLICKS,
    )
    day = date(2026, 11, 20)
    expected = spark.createDataFrame(
        [("u1", t(10, 0), t(10, 10), 2, 2, 600.0, True, day),
         ("u1", t(10, 40, 1), t(11, 10, 1), 2, 1, 1800.0, False, day),
         ("u2", t(23, 50), datetime(2026, 11, 21, 0, 5), 2, 1, 900.0, False, day)],  # the day it started
        VIEWS_BY_NAME["user_sessions"].schema,
    )
    assertDataFrameEqual(user_sessions({"clicks": clicks}, exact), expected)


def test_alerts_in_batch_with_their_boundaries(spark, exact):
    readings = [("D1", 20.0 + (i % 2) * 0.5, 40.0, t(10, i)) for i in range(5)]  # 10:00-10:04
    readings += [("D1", 30.0, 40.0, t(10, 5)),  # five prior readings, far above them: an anomaly
                 ("D1", 80.0, 40.0, t(10, 20)),  # at the limit: not high; its 15 minutes before hold one reading
                 ("D1", 80.01, 40.0, t(10, 21)),  # above the limit
                 ("D2", 20.0, 40.0, t(10, 0)), ("D2", 20.0, 40.0, t(10, 1)), ("D2", 20.0, 40.0, t(10, 2)),
                 ("D2", 20.0, 40.0, t(10, 3)), ("D2", 20.0, 40.0, t(10, 4)),
                 ("D2", 25.0, 40.0, t(10, 5)),  # zero deviation before it: no z-score
                 ("D3", 20.0, 40.0, t(10, 0)), ("D3", 20.5, 40.0, t(10, 1)), ("D3", 20.0, 40.0, t(10, 2)),
                 ("D3", 20.5, 40.0, t(10, 3)), ("D3", 50.0, 40.0, t(10, 4))]  # four prior readings: too few
    orders = [(f"a{i}", "u1", "books", 1.0, t(11, 0, i)) for i in range(5)]  # exactly the limit: no alert
    orders += [(f"b{i}", "u2", "books", 1.0, t(11, 0, i)) for i in range(6)]  # one more: an alert
    orders += [(f"c{i}", "u3", "books", 1.0, t(11, 4, 58 + i)) for i in range(2)]  # a burst split by the
    orders += [(f"d{i}", "u3", "books", 1.0, t(11, 5, i)) for i in range(4)]  # window boundary: no alert
    inputs = {"sensors": spark.createDataFrame(readings, SENSORS), "orders": spark.createDataFrame(orders, ORDERS)}
    rows = {r["alert_id"]: r for r in alerts(inputs, exact).collect()}
    assert set(rows) == {"temperature_anomaly|D1|2026-11-20T10:05:00.000Z",
                         "high_temperature|D1|2026-11-20T10:21:00.000Z",
                         "order_velocity|u2|2026-11-20T11:00:00.000Z"}
    prior = [20.0, 20.5, 20.0, 20.5, 20.0]
    assert rows["temperature_anomaly|D1|2026-11-20T10:05:00.000Z"]["value"] == \
        pytest.approx((30.0 - statistics.mean(prior)) / statistics.stdev(prior), rel=1e-12)
    assert (rows["high_temperature|D1|2026-11-20T10:21:00.000Z"]["value"],
            rows["high_temperature|D1|2026-11-20T10:21:00.000Z"]["threshold"]) == (80.01, 80.0)
    velocity = rows["order_velocity|u2|2026-11-20T11:00:00.000Z"]
    assert (velocity["kind"], velocity["entity_id"], velocity["value"], velocity["threshold"], velocity["date"]) == \
        ("order_velocity", "u2", 6.0, 5.0, date(2026, 11, 20))
