"""The nightly batch on a big day: ``lambdalake batch --date`` over a day of ``--events`` events.

    .venv/bin/python benchmarks/nightly_batch.py [--events 10000000] [--date 2026-11-21]

1. Spark writes the day straight into Bronze (the master dataset, as the stream would have left
   it: raw JSON lines with their ingestion metadata), in the generator's mix: clicks 70%, sensors
   22%, orders 4%, each order paid (payments 4%, some after midnight), 1% of the lines again as
   duplicates; and 100,000 customer changes (each of the 50,000 users read at the day's start,
   then one segment change each). Writing Bronze this way skips the speed layer, which would need far longer than
   the batch for 10M events on 2 cores (see speed_layer.md); the speed tables stay empty, so
   reconciliation reports every batch row as a difference.
2. Runs ``lambdalake batch --date`` in its own process (JVM start-up included) and times it;
   then checks the batch views' totals against the generated counts.

Writes a Markdown report to ``benchmarks/results/nightly_batch.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date, datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from include.generator.simulation import SEGMENTS  # noqa: E402 - from this checkout
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
SHARES = {"clicks": 0.70, "sensors": 0.22, "orders": 0.04, "payments": 0.04}
CUSTOMERS = 50_000  # the users U0..U49999 who click and order
DUPLICATE_EVERY = 100  # one line in a hundred lands twice


def topic_lines(spark, topic: str, count: int, day: date):  # noqa: ANN001, ANN201 - SparkSession -> DataFrame
    """``count`` events of ``topic`` spread over ``day``, as Bronze rows."""
    from pyspark.sql import functions as F

    start = int(datetime(day.year, day.month, day.day, tzinfo=timezone.utc).timestamp())
    i = F.col("id")
    if topic == "customers_cdc":
        return cdc_lines(spark, start, count)
    spread = F.lit(start) + i * 86_400.0 / count
    if topic == "payments":  # pays order i one to sixty minutes later; the last ones after midnight
        spread = spread + 60 + (i % 60) * 60
    rows = spark.range(count).withColumn("event_time", F.timestamp_seconds(spread))
    text_time = F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
    payload = {
        "clicks": lambda: F.struct(
            F.format_string("c-%d", i).alias("event_id"), F.format_string("U%d", i % 50_000).alias("user_id"),
            F.format_string("S%d", (i / 20).cast("long")).alias("session_id"),
            F.format_string("/product/%d", i % 500).alias("page_url"),
            F.element_at(F.array(*[F.lit(a) for a in ["view"] * 7 + ["click"] * 2 + ["add_to_cart"]]),
                         (i % 10 + 1).cast("int")).alias("action"),
            F.lit("mobile").alias("device_type"), text_time.alias("event_time")),
        "sensors": lambda: F.struct(
            F.format_string("D%04d", i % 1_000).alias("device_id"),
            (F.lit(18.0) + (i * 7919 % 1000) / 100).alias("temperature"),
            (F.lit(40.0) + (i % 200) / 10).alias("humidity"), text_time.alias("event_time")),
        "orders": lambda: F.struct(
            F.format_string("o-%d", i).alias("order_id"), F.format_string("U%d", i % 50_000).alias("user_id"),
            F.format_string("P%d", i % 500).alias("product_id"),
            F.element_at(F.array(*[F.lit(c) for c in ("books", "electronics", "fashion", "home")]),
                         (i % 4 + 1).cast("int")).alias("category"),
            (F.lit(5.0) + (i % 9_500) / 100).alias("amount"), text_time.alias("event_time")),
        "payments": lambda: F.struct(
            F.format_string("p-%d", i).alias("payment_id"), F.format_string("o-%d", i).alias("order_id"),
            (F.lit(5.0) + (i % 9_500) / 100).alias("amount"), F.lit("card").alias("method"),
            text_time.alias("event_time")),
    }[topic]()
    lines = rows.select(
        F.to_json(payload).cast("binary").alias("value"),
        F.format_string("bench/%s/%d", F.lit(topic), (i / 100_000).cast("long")).alias("source"),
        F.col("event_time").alias("arrived_at"), F.col("event_time").alias("ingested_at"),
        F.lit(0).cast("long").alias("batch_id"), F.to_date("event_time").alias("event_date"),
    )
    again = (lines.where(F.crc32(F.col("value")) % DUPLICATE_EVERY == 0)
             .withColumn("source", F.lit(f"bench/{topic}/again")))
    return lines.unionByName(again)


def cdc_lines(spark, start: int, count: int):  # noqa: ANN001, ANN201 - SparkSession -> DataFrame
    """Debezium-style changes as Bronze rows: a snapshot read ('r') of every customer at the day's
    start, then one segment change ('u') per customer spread over the day (``count`` = twice the
    customers)."""
    from pyspark.sql import functions as F

    i = F.col("id")
    customer = i % CUSTOMERS
    updated = i >= CUSTOMERS
    moment = (F.when(updated, F.lit(start) + 60 + customer * 86_000.0 / CUSTOMERS)
              .otherwise(F.lit(start) + customer / 1000.0))

    def row(shift: int):
        segment = F.element_at(F.array(*[F.lit(s) for s in SEGMENTS]),
                               ((customer + shift) % len(SEGMENTS) + 1).cast("int"))
        return F.struct(F.format_string("U%d", customer).alias("customer_id"), F.lit("Bench User").alias("name"),
                        F.format_string("u%d@example.com", customer).alias("email"), segment.alias("segment"),
                        F.lit("DE").alias("country"))

    change = F.struct(F.when(updated, "u").otherwise("r").alias("op"), (moment * 1000).cast("long").alias("ts_ms"),
                      F.when(updated, row(0)).alias("before"), F.when(updated, row(1)).otherwise(row(0)).alias("after"))
    rows = spark.range(count).withColumn("event_time", F.timestamp_seconds(moment))
    return rows.select(
        F.to_json(change).cast("binary").alias("value"), F.lit("bench/customers_cdc").alias("source"),
        F.col("event_time").alias("arrived_at"), F.col("event_time").alias("ingested_at"),
        F.lit(0).cast("long").alias("batch_id"), F.to_date("event_time").alias("event_date"),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--date", type=date.fromisoformat, default=date(2026, 11, 21))
    args = parser.parse_args()

    from include import tables
    from include.config import load_settings
    from include.lakehouse import open_store
    from include.spark import get_spark
    from include.views import VIEWS
    from speed_layer.ingest import IngestBatch

    home = Path(tempfile.mkdtemp(prefix="lambdalake-nightly-"))
    settings = load_settings(home=home)
    spark = get_spark(settings, app_name="nightly-benchmark")
    store = open_store(settings, spark)
    written = time.monotonic()
    counts = {topic: round(args.events * share) for topic, share in SHARES.items()}
    counts["payments"] = counts["orders"]
    counts["customers_cdc"] = 2 * CUSTOMERS
    lines = 0
    for topic, count in counts.items():
        store.ensure_table(tables.bronze(topic), tables.BRONZE_SCHEMA, tables.BRONZE_PARTITIONS)
        rows = topic_lines(spark, topic, count, args.date)
        store.append(tables.bronze(topic), rows)
        lines += store.read(tables.bronze(topic)).count()
    IngestBatch(settings, store, tuple(counts))  # the tables a stream leaves behind (Silver, DLQ, ops), empty
    for view in VIEWS:
        store.ensure_table(view.speed_table, view.schema, ["date"])
    written = time.monotonic() - written
    spark.stop()

    runs = {}
    for engine in ["Spark, delta-spark"]:
        engine_home = home.with_name(f"{home.name}-batch")
        shutil.copytree(home, engine_home)
        env = dict(os.environ)
        started = time.monotonic()
        run = subprocess.run(
            [LAMBDALAKE, "batch", "--home", str(engine_home), "--date", args.date.isoformat(), "--format", "json"],
            capture_output=True, text=True, env=env,
        )
        seconds = time.monotonic() - started
        if run.returncode != 0:
            raise SystemExit(f"lambdalake batch on {engine} failed ({run.returncode}): {run.stderr[-2000:]}")
        check = subprocess.run(
            [LAMBDALAKE, "query", "--home", str(engine_home), "--format", "json",
             "SELECT (SELECT sum(orders) FROM revenue_by_category_5m) AS orders, "
             "(SELECT count_if(status = 'paid') FROM order_payments) AS paid, "
             "(SELECT sum(readings) FROM device_health_5m) AS readings, "
             "(SELECT sum(views + clicks + add_to_cart) FROM traffic_by_page_10m) AS click_counts, "
             "(SELECT count(*) FROM customers) AS customers, "
             f"(SELECT sum(orders) FROM revenue_by_segment_1h WHERE segment IN {SEGMENTS}) AS enriched"],
            capture_output=True, text=True, check=True, env=env)
        runs[engine] = (seconds, __import__("json").loads(check.stdout)[0])
        shutil.rmtree(engine_home, ignore_errors=True)
    served = next(iter(runs.values()))[1]
    events_of_day = sum(counts.values())
    report = [
        "# Nightly batch benchmark", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, `--events {args.events} --date {args.date}`.", "",
        f"Bronze for the day: {events_of_day:,} events ({', '.join(f'{t} {n:,}' for t, n in counts.items())}) plus 1% "
        f"duplicate lines, {lines:,} lines in all, written by Spark straight into Bronze in {written:.0f} s.", "",
        f"`lambdalake batch --date {args.date}`, in its own process: JVM start-up, recompute of every view, "
        "reconciliation, data quality, coverage.", "",
        "| engine | seconds | events/s |",
        "|---|---:|---:|",
        *[f"| {engine} | {seconds:.1f} | {events_of_day / seconds:,.0f} |" for engine, (seconds, _) in runs.items()],
        "",
        f"Every run served the same totals: {'yes' if all(r[1] == served for r in runs.values()) else 'NO'}. "
        "Checked after the run (served from the batch views): "
        f"orders {served['orders']:,} of {counts['orders']:,}; paid orders {served['paid']:,} (every order is paid, "
        f"those paid after midnight included); sensor readings {served['readings']:,} of {counts['sensors']:,}; "
        f"click events counted in sliding windows {served['click_counts']:,} (each click in two windows, "
        f"{2 * counts['clicks']:,} but for the window opening the day before); customers {served['customers']:,} "
        f"of {CUSTOMERS:,}; orders enriched with a segment {served['enriched']:,} of {counts['orders']:,}.",
    ]
    text = "\n".join(report) + "\n"
    (ROOT / "benchmarks" / "results" / "nightly_batch.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
