"""The whole Lambda architecture against the generator's ground truth (never the pipeline's own
output): speed layer, nightly batch, reconciliation, merge rule, restatement."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

import pytest

from include.coverage import stale_days
from batch_layer.nightly import run_batch
from include.generator import TrafficOptions, generate
from serving.engine import ServingEngine
from speed_layer.runner import run_stream

DAY = date(2026, 11, 20)
START = datetime(2026, 11, 20, tzinfo=timezone.utc)
pytestmark = pytest.mark.slow


def iso(value):
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value else None


def read_truth(result, name):
    with (result.truth_dir / f"{name}.csv").open() as handle:
        return list(csv.DictReader(handle))


@dataclass(frozen=True)
class Day:
    hours: int
    max_files_per_trigger: int  # of 15-minute files
    seed: int
    options: TrafficOptions


# The day: three busy hours in hour-long micro-batches (a micro-batch costs seconds however
# small); late events land beyond one of them.
# The seed is chosen so that every feature the tests check occurs.
DAY_STREAMED = Day(3, 4, 25, TrafficOptions(orders_per_hour=300, late_fraction=0.05, duplicate_fraction=0.02,
                                            corrupt_fraction=0.01, late_beyond=timedelta(hours=1)))
@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """The day streamed once: every test below reads it (but the merge rule's)."""
    from include.config import load_settings

    day = DAY_STREAMED
    settings = load_settings(home=tmp_path_factory.mktemp("e2e") / "home", spark_master="local[2]",
                             shuffle_partitions=2, max_files_per_trigger=day.max_files_per_trigger)
    result = generate(settings, START, day.hours, day.options, seed=day.seed, file_minutes=15, progress=False)
    store = run_stream(settings, available_now=True)
    return settings, store, result


def test_speed_views_differ_from_truth_only_by_late_events(lake):
    settings, store, result = lake
    engine = ServingEngine(settings)
    late = {(r["topic"], r["event_id"]) for r in engine.rows("SELECT topic, event_id FROM late_events")}
    late_orders = {event_id for topic, event_id in late if topic == "orders"}
    late_payments = {event_id for topic, event_id in late if topic == "payments"}
    assert late_orders and late_payments  # the data really exercises lateness

    truth_orders = read_truth(result, "order_payments")
    expected = defaultdict(lambda: [0.0, 0])  # speed revenue = truth minus the late orders
    for order in truth_orders:
        if order["order_id"] not in late_orders:
            t = datetime.fromisoformat(order["order_time"].replace("Z", "+00:00"))
            window = t.replace(minute=t.minute - t.minute % 5, second=0, microsecond=0)
            expected[(iso(window), order["category"])][0] += float(order["amount"])
            expected[(iso(window), order["category"])][1] += 1
    speed = {(iso(r["window_start"]), r["category"]): r for r in engine.rows("SELECT * FROM revenue_by_category_5m")}
    assert {k for k, v in expected.items() if v[1]} == set(speed)
    for key, (revenue, orders) in expected.items():
        assert speed[key]["revenue"] == pytest.approx(revenue, abs=0.005) and speed[key]["orders"] == orders
        assert speed[key]["source"] == "speed"
    truth_buyers = sum(int(r["unique_buyers"]) for r in read_truth(result, "revenue_by_category_5m"))
    speed_buyers = sum(r["unique_buyers"] for r in speed.values())
    # HLL sketches: each window's error is a few rsd at most; over all windows they average out.
    assert abs(speed_buyers - truth_buyers) <= settings.approx_distinct_rsd * truth_buyers + len(late_orders)

    speed_payments = {r["order_id"]: r for r in engine.rows("SELECT * FROM order_payments")}
    for order in truth_orders:
        row = speed_payments.get(order["order_id"])
        if order["order_id"] in late_orders:
            assert row is None
        elif order["status"] == "paid" and order["payment_id"] not in late_payments:
            assert (row["status"], row["payment_id"]) == ("paid", order["payment_id"])
        else:  # no payment the stream could see: unpaid once the window closed, else pending
            assert row["status"] in ("unpaid", "pending") and row["payment_id"] is None


def window_of(moment: str, minutes: int = 5) -> datetime:
    t = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return t.replace(minute=t.minute - t.minute % minutes, second=0, microsecond=0)


def truth_rows(result, name, keys):
    return {tuple(r[k] for k in keys): r for r in read_truth(result, name)}


def test_click_and_sensor_views_in_the_stream_differ_from_truth_only_by_late_events(lake):
    settings, _, result = lake
    engine = ServingEngine(settings)
    late = engine.rows("SELECT topic, event_id, event_time FROM late_events WHERE topic IN ('clicks', 'sensors')")
    late_readings = defaultdict(int)  # (window, device) -> late readings in it
    late_click_windows = set()
    for row in late:
        if row["topic"] == "sensors":
            late_readings[(iso(window_of(iso(row["event_time"]))), row["event_id"].split("|")[0])] += 1
        else:
            latest = window_of(iso(row["event_time"]))
            late_click_windows |= {iso(latest), iso(latest - timedelta(minutes=5))}
    assert late_readings and late_click_windows

    truth = truth_rows(result, "device_health_5m", ("window_start", "device_id"))
    speed = {(iso(r["window_start"]), r["device_id"]): r for r in engine.rows("SELECT * FROM device_health_5m")}
    assert set(speed) <= set(truth)
    for key, expected in truth.items():
        missing = late_readings.get(key, 0)
        readings = speed[key]["readings"] if key in speed else 0
        assert readings == int(expected["readings"]) - missing, key
        if not missing:
            assert speed[key]["avg_temperature"] == pytest.approx(float(expected["avg_temperature"]), rel=1e-12)
            assert speed[key]["max_temperature"] == float(expected["max_temperature"])

    truth = truth_rows(result, "traffic_by_page_10m", ("window_start", "page_url"))
    speed = {(iso(r["window_start"]), r["page_url"]): r for r in engine.rows("SELECT * FROM traffic_by_page_10m")}
    assert set(speed) <= set(truth)
    for key, expected in truth.items():
        counts = [int(expected[c]) for c in ("views", "clicks", "add_to_cart")]
        got = [speed[key][c] for c in ("views", "clicks", "add_to_cart")] if key in speed else [0, 0, 0]
        if key[0] in late_click_windows:
            assert all(g <= c for g, c in zip(got, counts)), key
        else:
            assert got == counts, key
            users = int(expected["unique_users"])
            assert abs(speed[key]["unique_users"] - users) <= 1 + 3 * settings.approx_distinct_rsd * users


def session_key(row):
    return (row["user_id"], iso(row["session_start"]), iso(row["session_end"]), row["events"], row["pages"],
            row["converted"])


def truth_sessions(result, layer):
    return sorted((r["user_id"], r["session_start"], r["session_end"], int(r["events"]), int(r["pages"]),
                   r["converted"] == "True")
                  for r in read_truth(result, "user_sessions") if r[layer] == "True")


def truth_alerts(result, layer):
    return {r["alert_id"]: r for r in read_truth(result, "alerts") if r[layer] == "True"}


def test_sessions_and_alerts_in_the_stream_equal_the_truth_of_on_time_events(lake):
    """The stream shows every session (open ones too) and raises every alert the events that
    were not late hold: differences from the exact truth come from late events alone."""
    settings, _, result = lake
    engine = ServingEngine(settings)
    sessions = engine.rows("SELECT * FROM user_sessions")
    assert {r["source"] for r in sessions} == {"speed"}
    assert sorted(session_key(r) for r in sessions) == truth_sessions(result, "in_stream")
    assert truth_sessions(result, "in_stream") != truth_sessions(result, "in_batch")  # late clicks matter here

    raised = {r["alert_id"]: r for r in engine.rows("SELECT * FROM alerts")}
    expected = truth_alerts(result, "in_stream")
    assert set(raised) == set(expected)
    assert {kind for kind in (r["kind"] for r in raised.values())} == {
        "high_temperature", "temperature_anomaly", "order_velocity"}
    for alert_id, row in raised.items():
        assert row["value"] == pytest.approx(float(expected[alert_id]["value"]), rel=1e-12), alert_id
        assert row["detected_at"] is not None and row["source"] == "speed"
    # Each raised alert went to the notifier once.
    announced = [json.loads(r["details"])["alert_id"]
                 for r in engine.rows("SELECT details FROM ops_alerts WHERE source = 'alerts'")]
    assert sorted(announced) == sorted(raised)


def customer_rows(rows, columns):
    return sorted(tuple(iso(r[c]) if isinstance(r[c], datetime) else (r[c] if r[c] != "" else None) for c in columns)
                  for r in rows)


def truth_customers(result, name, columns):
    def typed(row):
        return {**row, **({"is_current": row["is_current"] == "True"} if "is_current" in row else {})}

    return customer_rows([typed(r) for r in read_truth(result, name)], columns)


CUSTOMER_COLUMNS = ("customer_id", "name", "email", "segment", "country", "updated_at")
HISTORY_COLUMNS = ("customer_id", "name", "email", "segment", "country", "valid_from", "valid_to", "is_current")


def test_the_stream_applies_every_customer_change_and_enriches_with_what_it_knows(lake):
    """Late and out-of-order CDC changes included, the speed dimensions equal the truth; one
    --available-now run applies every change before it enriches the orders, so each on-time order
    carries its customer's last segment (which differs from the one at order time exactly where
    the truth says the segment changed after the order)."""
    settings, store, result = lake
    engine = ServingEngine(settings)
    assert customer_rows(engine.rows("SELECT * FROM customers"), CUSTOMER_COLUMNS) == \
        truth_customers(result, "customers", CUSTOMER_COLUMNS)
    assert customer_rows(engine.rows("SELECT * FROM customers_history"), HISTORY_COLUMNS) == \
        truth_customers(result, "customers_history", HISTORY_COLUMNS)
    ledger = result.ledger["customers"]
    assert ledger["deleted"] and ledger["segment_changes"] and ledger["out_of_order"]
    assert result.ledger["topics"]["customers_cdc"]["late"]

    enriched = store.read("speed/revenue_by_segment_1h").collect()
    speed = {order: row["segment"] for row in enriched for order in row["order_ids"]}
    expected = {r["order_id"]: r["segment_at_end"]
                for r in read_truth(result, "order_segments") if r["late"] == "False"}
    assert speed == expected
    assert sum(r["segment_at_end"] != r["segment_at_order"] for r in read_truth(result, "order_segments")
               if r["late"] == "False") == result.ledger["revenue_by_segment_1h"]["enriched_differently_at_end"] > 0


@pytest.fixture(scope="module")
def batched(lake):
    """The lake after the day's batch run; its reconciliation rows."""
    settings, store, _ = lake
    return run_batch(settings, DAY, store)


def served_day(settings) -> tuple[list[dict], list[dict]]:
    """The day's served revenue and order_payments rows."""
    engine = ServingEngine(settings)
    revenue = engine.rows(f"SELECT * FROM revenue_by_category_5m WHERE CAST(window_start AS DATE) = DATE '{DAY}' "
                          "ORDER BY window_start, category")
    payments = engine.rows(f"SELECT * FROM order_payments WHERE CAST(order_time AS DATE) = DATE '{DAY}' "
                           "ORDER BY order_id")
    return revenue, payments


def test_batch_equals_truth_exactly(lake, batched):
    settings, store, result = lake
    reconciliation = batched
    revenue, payments = served_day(settings)
    assert {r["source"] for r in revenue} == {r["source"] for r in payments} == {"batch"}
    truth = read_truth(result, "revenue_by_category_5m")
    assert [(r["window_start"], r["category"], float(r["revenue"]), int(r["orders"]), int(r["unique_buyers"]))
            for r in truth] == \
        [(iso(r["window_start"]), r["category"], r["revenue"], r["orders"], r["unique_buyers"]) for r in revenue]
    truth_payments = sorted(read_truth(result, "order_payments"), key=lambda r: r["order_id"])
    assert [(r["order_id"], r["status"], r["payment_id"] or None, r["pay_time"] or None, float(r["amount"]))
            for r in truth_payments] == \
        [(r["order_id"], r["status"], r["payment_id"], iso(r["pay_time"]), r["amount"]) for r in payments]

    engine = ServingEngine(settings)
    # The window opening at 23:55 the day before holds the first clicks: that day is not batch-covered.
    traffic = engine.rows(f"SELECT * FROM traffic_by_page_10m WHERE CAST(window_start AS DATE) = DATE '{DAY}' "
                          "ORDER BY window_start, page_url")
    assert {r["source"] for r in traffic} == {"batch"}
    truth = [r for r in read_truth(result, "traffic_by_page_10m") if r["window_start"].startswith(DAY.isoformat())]
    assert [(r["window_start"], r["page_url"], *(int(r[c]) for c in ("views", "clicks", "add_to_cart", "unique_users")))
            for r in truth] == \
        [(iso(r["window_start"]), r["page_url"], r["views"], r["clicks"], r["add_to_cart"], r["unique_users"])
         for r in traffic]
    health = engine.rows("SELECT * FROM device_health_5m ORDER BY window_start, device_id")
    truth = read_truth(result, "device_health_5m")
    assert [(r["window_start"], r["device_id"], int(r["readings"]), float(r["min_temperature"]),
             float(r["max_temperature"])) for r in truth] == \
        [(iso(r["window_start"]), r["device_id"], r["readings"], r["min_temperature"], r["max_temperature"])
         for r in health]
    for expected, row in zip(truth, health):
        for column in ("avg_temperature", "stddev_temperature", "avg_humidity"):
            assert row[column] == (pytest.approx(float(expected[column]), rel=1e-9) if expected[column] else None), \
                column

    sessions = engine.rows("SELECT * FROM user_sessions")
    assert {r["source"] for r in sessions} == {"batch"}
    assert sorted(session_key(r) for r in sessions) == truth_sessions(result, "in_batch")
    raised = {r["alert_id"]: r for r in engine.rows("SELECT * FROM alerts")}
    expected = truth_alerts(result, "in_batch")
    assert set(raised) == set(expected) and {r["source"] for r in raised.values()} == {"batch"}
    for alert_id, row in raised.items():
        truth = expected[alert_id]
        assert (row["kind"], row["entity_id"], iso(row["event_time"]), row["threshold"]) == \
            (truth["kind"], truth["entity_id"], truth["event_time"], float(truth["threshold"]))
        assert row["value"] == pytest.approx(float(truth["value"]), rel=1e-12), alert_id
    # Reconciliation names, per kind, what the stream missed and what it raised that the batch denies.
    metrics = {r["metric"]: r["batch_value"] for r in reconciliation if r["view"] == "alerts"}
    in_stream = truth_alerts(result, "in_stream")
    for kind in ("high_temperature", "temperature_anomaly", "order_velocity"):
        assert metrics[f"missed_{kind}"] == sum(1 for a, r in expected.items()
                                                if r["kind"] == kind and a not in in_stream)
        assert metrics[f"unconfirmed_{kind}"] == sum(1 for a, r in in_stream.items()
                                                     if r["kind"] == kind and a not in expected)
    assert sum(metrics[m] for m in metrics if m.startswith("missed_")) > 0

    # The customer dimension and the point-in-time enrichment, exactly; reconciliation counts the
    # orders the stream enriched differently and the revenue that moved between segments.
    assert customer_rows(engine.rows("SELECT * FROM customers WHERE source = 'batch'"), CUSTOMER_COLUMNS) == \
        truth_customers(result, "customers", CUSTOMER_COLUMNS)
    assert customer_rows(engine.rows("SELECT * FROM customers_history WHERE source = 'batch'"), HISTORY_COLUMNS) == \
        truth_customers(result, "customers_history", HISTORY_COLUMNS)
    by_segment = engine.rows("SELECT * FROM revenue_by_segment_1h ORDER BY window_start, segment")
    assert [(iso(r["window_start"]), r["segment"], r["revenue"], r["orders"], r["source"]) for r in by_segment] == [
        (r["window_start"], r["segment"], float(r["revenue"]), int(r["orders"]), "batch")
        for r in read_truth(result, "revenue_by_segment_1h")]
    metrics = {(r["view"], r["metric"]): r["batch_value"] for r in reconciliation}
    ledger = result.ledger["revenue_by_segment_1h"]
    assert metrics[("revenue_by_segment_1h", "orders_enriched_differently")] == ledger["enriched_differently_at_end"]
    assert metrics[("revenue_by_segment_1h", "revenue_moved")] == ledger["revenue_moved_at_end"]
    assert metrics[("customers", "differing_customers")] == metrics[("customers_history", "differing_customers")] == 0
    assert metrics[("customers", "rows")] == result.ledger["customers"]["rows"]

    recovered = {r["metric"]: r for r in reconciliation if r["view"] == "order_payments"}["late_matches_recovered"]
    assert recovered["batch_value"] == result.ledger["order_payments"]["late_paid"] > 0
    assert len(ServingEngine(settings).rows("SELECT * FROM recovered_late_matches")) == recovered["batch_value"]


# Last: it streams more days onto the module's lake.
def test_spark_writes_every_pipeline_table_and_keeps_the_stream_s_state(lake, batched):
    """One engine: every commit of every table the stream and the batch wrote names delta-spark
    (delta-rs writes only the small ops tables), and ingest's checkpoint holds Spark's state
    store (the dedup's ids), not the driver."""
    from deltalake import DeltaTable

    from include import tables

    settings, _, _ = lake
    lakehouse = settings.lakehouse_dir
    names = sorted(str(log.parent.relative_to(lakehouse)) for log in lakehouse.glob("**/_delta_log"))
    spark_written = [name for name in names if name not in tables.OPS_TABLES]
    assert {"bronze/orders", "silver/orders", "speed/order_payments", "batch/order_payments"} <= set(spark_written)
    for name in spark_written:
        engines = {entry.get("engineInfo", "") for entry in DeltaTable(str(lakehouse / name)).history()}
        assert engines and all(e.startswith("Apache-Spark/") and "Delta-Lake/" in e for e in engines), name
    state = settings.checkpoints_dir / "speed_ingest" / "state"
    assert any(path.is_file() for path in state.rglob("*")), "no state store in ingest's checkpoint"


def test_merge_rule_idempotency_backfill_and_restatement(lake, batched):
    settings, store, _ = lake
    batched_rows = served_day(settings)
    # Lateness and the other views are not the point here: order_payments shows where rows come from.
    settings = settings.model_copy(update={"max_files_per_trigger": 8, "speed_views": "order_payments"})
    # Another day arrives; it has no batch run yet, so it is served from speed.
    generate(settings, START + timedelta(days=1), 2, TrafficOptions(orders_per_hour=60), seed=22, file_minutes=15,
             progress=False)
    run_stream(settings, available_now=True)
    run_batch(settings, DAY, store)
    assert served_day(settings) == batched_rows  # a rerun of a covered day changes nothing

    def sources():
        rows = ServingEngine(settings).rows(
            "SELECT CAST(order_time AS DATE) AS day, source, count(*) AS n FROM order_payments GROUP BY ALL")
        return {(r["day"], r["source"]) for r in rows}

    assert sources() == {(DAY, "batch"), (DAY + timedelta(days=1), "speed")}
    # A backfilled older day: all of it behind the watermark, so absent from speed; batch adds it.
    older = DAY - timedelta(days=3)
    generate(settings, datetime(2026, 11, 17, tzinfo=timezone.utc), 1, TrafficOptions(orders_per_hour=60), seed=23,
             file_minutes=15, progress=False)
    run_stream(settings, available_now=True)
    assert (older, "speed") not in sources()
    # Its customer changes precede the covered day's: the dimension as of that day is stale.
    assert stale_days(store, settings) == [DAY]
    run_batch(settings, older, store)
    assert (older, "batch") in sources() and (DAY, "batch") in sources()

    # More events land for a covered day: the day turns stale until it is restated.
    generate(settings, START + timedelta(hours=3), 1, TrafficOptions(orders_per_hour=60), seed=24, file_minutes=15,
             progress=False)
    run_stream(settings, available_now=True)
    assert stale_days(store, settings) == [DAY]
    before = ServingEngine(settings).rows(
        "SELECT count(*) AS n FROM order_payments WHERE CAST(order_time AS DATE) = DATE '2026-11-20'")[0]["n"]
    run_batch(settings, DAY, store)
    assert stale_days(store, settings) == []
    after = ServingEngine(settings).rows(
        "SELECT count(*) AS n FROM order_payments WHERE CAST(order_time AS DATE) = DATE '2026-11-20'")[0]["n"]
    assert after > before
