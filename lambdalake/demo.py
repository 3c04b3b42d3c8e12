"""The end-to-end demo behind ``make run``: one day through the whole Lambda architecture.

Generates yesterday's traffic (with late, duplicate and corrupt events), runs the speed layer,
shows its approximate views and what was late or rejected, runs the nightly batch, and shows the
merged exact views and the reconciliation, narrating each step.
"""

from __future__ import annotations

import csv
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, time as clock, timedelta, timezone

from include.output import format_rows
from include.config import Settings
from include.generator import TrafficOptions, generate


# The demo replays a whole day at once: 6 hours of landing files per micro-batch (4 micro-batches
# instead of 96: each costs seconds of fixed work), and late events arrive later than that, so
# the watermark has passed them.
FILE_MINUTES = 15
FILES_PER_MICRO_BATCH = 24


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def show(engine, sql: str) -> list[dict]:  # noqa: ANN001 - serving.engine.ServingEngine
    rows = engine.rows(sql)
    print(format_rows(rows, "table"), flush=True)
    return rows


def run_demo(settings: Settings, day: date | None = None, orders_per_hour: float = 200.0) -> None:
    from batch_layer.nightly import run_batch
    from include.lakehouse import open_store
    from include.spark import get_spark
    from serving.engine import ServingEngine
    from include.accounting import ingest_totals
    from speed_layer.runner import run_stream

    logging.getLogger().setLevel(logging.WARNING)  # the narrative, not per-batch logs
    settings = settings.model_copy(update={"max_files_per_trigger": FILES_PER_MICRO_BATCH})
    day = day or datetime.now(timezone.utc).date() - timedelta(days=1)
    started = time.monotonic()
    # Spark's JVM starts on the other core while this one generates the day.
    spark_start = ThreadPoolExecutor(1, thread_name_prefix="spark-start")
    starting = spark_start.submit(get_spark, settings, "lambdalake-demo")
    say(f"1/5 Landing 24 hours of events for {day} into {settings.landing_dir}")
    options = TrafficOptions(
        orders_per_hour=orders_per_hour, watermark_delay=settings.watermark_delay,
        late_beyond=timedelta(minutes=FILE_MINUTES * FILES_PER_MICRO_BATCH),
    )
    # No progress lines: while the JVM starts, stderr is its log (include/spark.py).
    result = generate(settings, datetime.combine(day, clock(), timezone.utc), 24, options, seed=42,
                      file_minutes=FILE_MINUTES, progress=False)
    truth = result.ledger
    rows = [{"topic": t, **{k: c[k] for k in ("lines", "valid", "duplicate", "corrupt", "late")}}
            for t, c in truth["topics"].items()]
    print(format_rows(rows, "table"))
    print(f"Ground truth (computed by the generator, not the pipeline): {result.truth_dir}")

    say(f"2/5 Speed layer: `lambdalake stream --available-now --max-files-per-trigger {FILES_PER_MICRO_BATCH}` "
        "(Structured Streaming, micro-batch by micro-batch)")
    spark = starting.result()
    spark_start.shutdown()
    spark.sparkContext.setLogLevel("ERROR")
    store = open_store(settings, spark)
    run_stream(settings, available_now=True, show_progress=True)
    totals = ingest_totals(store)
    print(format_rows(totals, "table"))
    print("Every landed line is in Bronze; Bronze = Silver + DLQ + duplicates removed, per topic.")

    engine = ServingEngine(settings)
    say("Speed view revenue_by_category_5m (approximate, source='speed'), top windows")
    show(engine, "SELECT window_start, category, revenue, orders, unique_buyers, source "
                 "FROM revenue_by_category_5m ORDER BY revenue DESC LIMIT 5")
    say("What the stream could not count: late events (behind the watermark) and the DLQ")
    show(engine, "SELECT topic, count(*) AS late_events, round(avg(lateness_seconds) / 60, 1) AS avg_minutes_behind "
                 "FROM late_events GROUP BY topic ORDER BY topic")
    show(engine, "SELECT topic, CASE WHEN reason LIKE 'bad timestamp%' THEN 'bad timestamp' ELSE reason END AS reason, "
                 "count(*) AS lines FROM dlq GROUP BY ALL ORDER BY topic, lines DESC")
    show(engine, "SELECT status, count(*) AS orders, source FROM order_payments "
                 "GROUP BY status, source ORDER BY status")
    say("Speed view traffic_by_page_10m (sliding 10-minute windows every 5 minutes), busiest pages")
    show(engine, "SELECT page_url, sum(views) AS views, sum(clicks) AS clicks, sum(add_to_cart) AS add_to_cart, "
                 "max(unique_users) AS peak_users_10m FROM traffic_by_page_10m "
                 "GROUP BY page_url ORDER BY views DESC LIMIT 5")
    say("Speed view device_health_5m (5-minute windows per device), hottest windows")
    show(engine, "SELECT window_start, device_id, readings, round(avg_temperature, 2) AS avg_temperature, "
                 "max_temperature, round(stddev_temperature, 2) AS stddev_temperature FROM device_health_5m "
                 "ORDER BY max_temperature DESC LIMIT 5")

    say("Speed view user_sessions (30-minute inactivity gap; sessions still open are shown as they stand)")
    show(engine, "SELECT count(*) AS sessions, round(avg(events), 1) AS avg_clicks, "
                 "round(avg(duration_seconds) / 60, 1) AS avg_minutes, "
                 "round(100.0 * avg(CAST(converted AS INT)), 1) AS converted_pct FROM user_sessions")
    say("Speed view alerts (raised within seconds, each once, also sent to the notifier), per kind")
    show(engine, "SELECT kind, count(*) AS alerts, round(max(value), 2) AS max_value, "
                 "any_value(threshold) AS threshold FROM alerts GROUP BY kind ORDER BY kind")

    say("Speed views customers (SCD1) and customers_history (SCD2) from CDC, "
        "out-of-order and late changes sequenced by ts_ms")
    show(engine, "SELECT segment, count(*) AS customers, (SELECT count(*) FROM customers_history) AS versions, "
                 "(SELECT count(*) FROM customers_history WHERE NOT is_current) AS closed_versions "
                 "FROM customers GROUP BY segment ORDER BY segment")
    say("Speed view revenue_by_segment_1h (orders enriched with the segment the stream knew when it processed them)")
    show(engine, "SELECT segment, round(sum(revenue), 2) AS revenue, sum(orders) AS orders, source "
                 "FROM revenue_by_segment_1h GROUP BY segment, source ORDER BY revenue DESC")

    say(f"3/5 Nightly batch: `lambdalake batch --date {day}` recomputes exact views from Bronze")
    reconciliation = run_batch(settings, day, store, show_progress=True)

    engine = ServingEngine(settings)
    say("4/5 Reconciliation: speed vs batch for the day")
    print(format_rows([{k: r[k] for k in ("view", "metric", "speed_value", "batch_value", "diff")}
                       for r in reconciliation], "table"))
    say("Merged views now serve the day from batch (source='batch')")
    show(engine, "SELECT source, count(*) AS windows, round(sum(revenue), 2) AS revenue, sum(orders) AS orders "
                 "FROM revenue_by_category_5m GROUP BY source")
    show(engine, "SELECT status, count(*) AS orders, source FROM order_payments "
                 "GROUP BY status, source ORDER BY status")
    show(engine, "SELECT kind, count(*) AS alerts, source FROM alerts GROUP BY kind, source ORDER BY kind")
    say("revenue_by_segment_1h point in time: each order with the segment its customer had when it ordered")
    show(engine, "SELECT segment, round(sum(revenue), 2) AS revenue, sum(orders) AS orders, source "
                 "FROM revenue_by_segment_1h GROUP BY segment, source ORDER BY revenue DESC")

    say("5/5 Checked against the ground truth")
    batch_revenue = engine.rows("SELECT round(sum(revenue), 2) AS r, sum(orders) AS o FROM revenue_by_category_5m")[0]
    recovered = next(r for r in reconciliation if r["metric"] == "late_matches_recovered")["batch_value"]
    health = engine.rows("SELECT sum(readings) AS readings FROM device_health_5m")[0]
    day_views = engine.rows("SELECT sum(views) AS views FROM traffic_by_page_10m "
                            f"WHERE CAST(window_start AS DATE) = DATE '{day}'")[0]
    with (result.truth_dir / "traffic_by_page_10m.csv").open() as handle:
        truth_views = sum(int(row["views"]) for row in csv.DictReader(handle)
                          if row["window_start"].startswith(day.isoformat()))
    sessions = engine.rows("SELECT count(*) AS n, sum(events) AS events FROM user_sessions "
                           f"WHERE CAST(session_start AS DATE) = DATE '{day}'")[0]
    with (result.truth_dir / "user_sessions.csv").open() as handle:
        truth_sessions = [row for row in csv.DictReader(handle)
                          if row["in_batch"] == "True" and row["session_start"].startswith(day.isoformat())]
    raised = engine.rows(f"SELECT count(*) AS n FROM alerts WHERE CAST(event_time AS DATE) = DATE '{day}'")[0]
    with (result.truth_dir / "alerts.csv").open() as handle:
        truth_alerts = [row for row in csv.DictReader(handle)
                        if row["in_batch"] == "True" and row["event_time"].startswith(day.isoformat())]
    customers = engine.rows("SELECT count(*) AS n FROM customers")[0]["n"]
    versions = engine.rows("SELECT count(*) AS n FROM customers_history")[0]["n"]
    segments = engine.rows("SELECT sum(orders) AS o FROM revenue_by_segment_1h "
                           f"WHERE segment = 'unknown' AND CAST(window_start AS DATE) = DATE '{day}'")[0]["o"]
    with (result.truth_dir / "order_segments.csv").open() as handle:
        truth_orders = [row for row in csv.DictReader(handle) if row["order_time"].startswith(day.isoformat())]
    differently = next(r for r in reconciliation if r["metric"] == "orders_enriched_differently")["batch_value"]
    checks = [
        ("revenue, all days served", truth["revenue_by_category_5m"]["revenue"], batch_revenue["r"]),
        ("orders, all days served", truth["revenue_by_category_5m"]["orders"], batch_revenue["o"]),
        ("late-paid orders recovered", truth["order_payments"]["late_paid"], int(recovered)),
        ("page views in the day's traffic windows", truth_views, day_views["views"]),
        ("sensor readings, all days served", truth["device_health_5m"]["readings"], health["readings"]),
        ("user sessions starting on the day", len(truth_sessions), sessions["n"]),
        ("clicks in those sessions", sum(int(row["events"]) for row in truth_sessions), sessions["events"]),
        ("alerts on the day", len(truth_alerts), raised["n"]),
        ("customers (SCD1)", truth["customers"]["rows"], customers),
        ("customer versions (SCD2)", truth["customers_history"]["rows"], versions),
        ("orders on the day without a customer then",
         sum(row["segment_at_order"] == "unknown" for row in truth_orders), segments),
        ("orders the stream enriched differently",
         sum(row["late"] == "False" and row["segment_at_order"] != row["segment_at_end"] for row in truth_orders),
         int(differently)),
    ]
    print(format_rows([{"check": c, "ground_truth": t, "served": b, "equal": t == b} for c, t, b in checks], "table"))
    print(
        f"""
What happened ({time.monotonic() - started:.0f}s):
- The speed layer turned each micro-batch of landing files into Bronze (raw, append-only),
  Silver (typed, deduplicated) and the DLQ, and kept the Gold views current. It is fast
  but approximate: events that arrived behind the watermark were listed in late_events and left
  out, payments that arrived late left their orders unpaid, and distinct buyers are estimated.
- The nightly batch recomputed the day from Bronze with the same view definitions, exactly and
  including every late event, then reconciled: {int(recovered)} orders paid late were recovered,
  and {int(differently)} orders the stream enriched with a segment their customer only had later
  were counted under the segment valid when they ordered.
- The serving layer now answers from the batch view for {day} and from the speed view for any
  day without a batch run. Try: .venv/bin/lambdalake query --home {settings.home} "SELECT * FROM reconciliation"

See it on the dashboard: .venv/bin/lambdalake serve --home {settings.home}
and open the address it prints (http://127.0.0.1:8090/#token=...); Ctrl-C stops it.
"""
    )
