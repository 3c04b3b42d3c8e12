"""Serving latency: dashboard queries through the serving layer vs DuckDB on the same Parquet files.

    .venv/bin/python benchmarks/serving_latency.py [--home .lambdalake/demo] [--repeat 50]

Needs a lake with data (``make run`` leaves one in ``.lambdalake/demo``). For each query, the
serving layer (merged views over Delta snapshots, read-only guard) and plain DuckDB reading the
snapshots' Parquet files directly run alternately, ``--repeat`` times each; p50/p95 in ms.
Opening the serving engine (what each ``lambdalake query`` pays once) is timed separately.
Writes ``benchmarks/results/serving.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from include.config import load_settings  # noqa: E402
from serving.engine import ServingEngine  # noqa: E402

# (name, through serving, directly on Parquet: {speed}/{batch}/{coverage} are file lists)
QUERIES = [
    ("revenue per category, all days",
     "SELECT category, sum(revenue) AS revenue FROM revenue_by_category_5m GROUP BY category ORDER BY revenue DESC",
     "SELECT category, sum(revenue) AS revenue FROM ("
     " SELECT category, revenue FROM read_parquet({batch_revenue}) WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT category, revenue FROM read_parquet({speed_revenue}) WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " GROUP BY category ORDER BY revenue DESC"),
    ("last hour of 5-minute windows",
     "SELECT window_start, category, revenue FROM revenue_by_category_5m"
     " WHERE window_start >= (SELECT max(window_start) FROM revenue_by_category_5m) - INTERVAL 1 HOUR",
     "WITH v AS (SELECT * FROM read_parquet({batch_revenue}) WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT * FROM read_parquet({speed_revenue}) WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " SELECT window_start, category, revenue FROM v WHERE window_start >= (SELECT max(window_start) FROM v) - INTERVAL 1 HOUR"),
    ("order status counts",
     "SELECT status, count(*) FROM order_payments GROUP BY status",
     "SELECT status, count(*) FROM ("
     " SELECT status FROM read_parquet({batch_order_payments}) WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT status FROM read_parquet({speed_order_payments}) WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " GROUP BY status"),
]


def files(home: Path, table: str) -> str:
    uris = DeltaTable(str(home / "lakehouse" / table)).file_uris()
    return "[" + ", ".join(f"'{uri}'" for uri in uris) + "]"


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=ROOT / ".lambdalake" / "demo")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "serving.md")
    args = parser.parse_args()
    settings = load_settings(home=args.home)

    opened = []
    for _ in range(10):
        started = time.perf_counter()
        engine = ServingEngine(settings)
        opened.append((time.perf_counter() - started) * 1000)
    lists = {
        "speed_revenue": files(args.home, "speed/revenue_by_category_5m"),
        "batch_revenue": files(args.home, "batch/revenue_by_category_5m"),
        "speed_order_payments": files(args.home, "speed/order_payments"),
        "batch_order_payments": files(args.home, "batch/order_payments"),
        "coverage": files(args.home, "ops/batch_coverage"),
    }
    direct = duckdb.connect()
    direct.execute("SET TimeZone = 'UTC'")
    lines = []
    for name, served_sql, direct_sql in QUERIES:
        direct_sql = direct_sql.format(**lists)
        served, plain = [], []
        for _ in range(args.repeat):
            started = time.perf_counter()
            engine.query(served_sql)
            served.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            direct.execute(direct_sql).fetchall()
            plain.append((time.perf_counter() - started) * 1000)
        assert sorted(map(str, engine.query(served_sql)[1])) == sorted(map(str, direct.execute(direct_sql).fetchall()))
        lines.append(
            f"| {name} | {statistics.median(served):.1f} | {percentile(served, 0.95):.1f} | "
            f"{statistics.median(plain):.1f} | {percentile(plain, 0.95):.1f} |"
        )
    report = [
        "# Serving benchmark",
        "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M}Z on {platform.node()}: {os.cpu_count()} cores, "
        f"DuckDB {duckdb.__version__}, lake `{args.home}`, {args.repeat} runs per query, alternating.",
        "",
        "| dashboard query | serving p50 ms | serving p95 ms | DuckDB on Parquet p50 ms | p95 ms |",
        "|---|---:|---:|---:|---:|",
        *lines,
        "",
        f"Opening the serving engine (each `lambdalake query` does it once): p50 {statistics.median(opened):.1f} ms, "
        f"p95 {percentile(opened, 0.95):.1f} ms.",
        "",
    ]
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(report), encoding="utf-8")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
