"""Every view definition and shared rule on tiny inline frames, with its boundary cases."""

from __future__ import annotations

from datetime import date, datetime

import pytest
from pyspark.testing import assertDataFrameEqual

from include.registry import ViewContext, input_topics
from include.views import (
    VIEWS,
    VIEWS_BY_NAME,
    best_order_status,
    device_health_5m,
    first_copies,
    order_payments,
    revenue_by_category_5m,
    traffic_by_page_10m,
)

ORDERS = "order_id string, user_id string, category string, amount double, event_time timestamp"
PAYMENTS = "payment_id string, order_id string, amount double, event_time timestamp"
CLICKS = "event_id string, user_id string, page_url string, action string, event_time timestamp"
SENSORS = "device_id string, temperature double, humidity double, event_time timestamp"


def t(hour, minute, second=0):
    return datetime(2026, 11, 20, hour, minute, second)


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
    assert [(r["order_id"], r["status"], r["payment_id"]) for r in best_order_status(speed).collect()] == [("o1", "paid", "p1")]
    unpaid_and_pending = speed.where("status = 'pending'").unionByName(
        speed.where("status = 'pending'").selectExpr(*[c if c != "status" else "'unpaid' AS status" for c in speed.columns])
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


def test_the_registry_declares_each_view_completely():
    assert [view.name for view in VIEWS] == list(VIEWS_BY_NAME)
    for view in VIEWS:
        assert view.schema.fieldNames()[-1] == "date" and {view.key_time, view.freshness_time} <= set(view.columns)
        assert set(view.keys) <= set(view.columns) and "rows" in view.metrics
        assert set(view.drift_metrics) <= set(view.metrics)
        assert view.speed_table == f"speed/{view.name}" and view.batch_table == f"batch/{view.name}"
    assert input_topics(VIEWS) == ("orders", "payments", "clicks", "sensors")


def test_input_days_follow_the_join_window(settings):
    view = VIEWS_BY_NAME["order_payments"]
    day = date(2026, 11, 20)
    assert view.input_days("orders", day, settings) == [day]
    assert view.input_days("payments", day, settings) == [day, date(2026, 11, 21)]


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
    store = open_store(settings, spark, engine="delta-rs")
    for number, (stored, new) in enumerate((a, b) for a in candidates for b in candidates):
        table = f"merge_{number}"
        store.ensure_table(table, view.schema, ["date"])
        store.merge(table, spark.createDataFrame([candidates[stored]], view.schema), ["order_id"])
        store.merge(table, spark.createDataFrame([candidates[new]], view.schema), ["order_id"], Txn("q", 0),
                    replaces_sql(view.precedence))
        both = spark.createDataFrame([candidates[stored], candidates[new]], view.schema)
        assertDataFrameEqual(store.read(table), best_order_status(both))


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
    assertDataFrameEqual(traffic_by_page_10m({"clicks": clicks}, ViewContext(settings, exact=is_exact)), expected)


def test_device_health_statistics_one_reading_and_zero_deviation(spark, exact):
    readings = spark.createDataFrame(
        [("D1", 20.0, 40.0, t(10, 0)), ("D1", 22.0, 50.0, t(10, 1)), ("D1", 27.0, 60.0, t(10, 4, 59)),
         ("D1", 30.0, 45.0, t(10, 5)),  # alone in the next window: no sample deviation
         ("D2", 21.5, 40.0, t(10, 0)), ("D2", 21.5, 40.0, t(10, 2))],  # equal readings: deviation 0
        SENSORS,
    )
    rows = {(r["device_id"], r["window_start"]): r for r in device_health_5m({"sensors": readings}, exact).collect()}
    first = rows[("D1", t(10, 0))]
    assert (first["readings"], first["avg_temperature"], first["min_temperature"], first["max_temperature"]) == (3, 23.0, 20.0, 27.0)
    assert first["stddev_temperature"] == pytest.approx(3.605551275463989) and first["avg_humidity"] == 50.0
    alone = rows[("D1", t(10, 5))]
    assert (alone["readings"], alone["stddev_temperature"], alone["window_end"]) == (1, None, t(10, 10))
    assert rows[("D2", t(10, 0))]["stddev_temperature"] == 0.0
    assert set(rows) == {("D1", t(10, 0)), ("D1", t(10, 5)), ("D2", t(10, 0))}
