"""Serving latency: dashboard queries through the serving layer, in process, over HTTP and over the
PostgreSQL wire protocol, vs DuckDB on the same Parquet files.

    .venv/bin/python benchmarks/serving_latency.py [--home .lambdalake/demo] [--repeat 50]

Needs a lake with data (``make run`` leaves one in ``.lambdalake/demo``). Starts ``lambdalake
serve`` on free ports. For each query, four ways run alternately, ``--repeat`` times each:
the serving engine in this process, ``POST /api/query`` on the warm server (one keep-alive
connection, as a dashboard holds), the same server over the PostgreSQL wire protocol (one psycopg
connection, as a BI tool holds), and plain DuckDB reading the snapshots' Parquet files directly;
p50/p95 in ms. Then requests/s with ``--clients`` concurrent HTTP clients. Opening the
serving engine (what each ``lambdalake query`` pays once) is timed separately.
Writes ``benchmarks/results/serving.md``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import psycopg
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
     " SELECT category, revenue FROM read_parquet({batch_revenue})"
     " WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT category, revenue FROM read_parquet({speed_revenue})"
     " WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " GROUP BY category ORDER BY revenue DESC"),
    ("last hour of 5-minute windows",
     "SELECT window_start, category, revenue FROM revenue_by_category_5m"
     " WHERE window_start >= (SELECT max(window_start) FROM revenue_by_category_5m) - INTERVAL 1 HOUR",
     "WITH v AS (SELECT window_start, category, revenue FROM read_parquet({batch_revenue})"
     " WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT window_start, category, revenue FROM read_parquet({speed_revenue})"
     " WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " SELECT window_start, category, revenue FROM v"
     " WHERE window_start >= (SELECT max(window_start) FROM v) - INTERVAL 1 HOUR"),
    ("order status counts",
     "SELECT status, count(*) FROM order_payments GROUP BY status",
     "SELECT status, count(*) FROM ("
     " SELECT status FROM read_parquet({batch_order_payments})"
     " WHERE date IN (SELECT date FROM read_parquet({coverage}))"
     " UNION ALL SELECT status FROM read_parquet({speed_order_payments})"
     " WHERE date NOT IN (SELECT date FROM read_parquet({coverage})))"
     " GROUP BY status"),
]


def files(home: Path, table: str) -> str:
    uris = DeltaTable(str(home / "lakehouse" / table)).file_uris()
    return "[" + ", ".join(f"'{uri}'" for uri in uris) + "]"


def percentile(samples: list[float], share: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


TOKEN = "benchmark-token"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(home: Path) -> tuple[subprocess.Popen, int, int]:
    """``lambdalake serve`` on free ports; returns the process, its HTTP and its PostgreSQL port."""
    port, pg_port = free_port(), free_port()
    env = {**os.environ, "LAMBDALAKE_SERVE_TOKEN": TOKEN}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "lambdalake"), "serve", "--home", str(home), "--port", str(port),
         "--pg-port", str(pg_port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            for listening in (port, pg_port):
                socket.create_connection(("127.0.0.1", listening), timeout=1).close()
            return server, port, pg_port
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("lambdalake serve did not start")
            time.sleep(0.2)


def post(connection: http.client.HTTPConnection, sql: str) -> list:
    connection.request("POST", "/api/query", body=json.dumps({"sql": sql}),
                       headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    response = connection.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"HTTP {response.status}: {body[:200]!r}")
    return json.loads(body)


def requests_per_second(port: int, clients: int, seconds: float) -> tuple[float, float]:
    """Every client cycles through the queries on its own connection; returns requests/s and p50 ms."""
    stop = time.monotonic() + seconds
    latencies: list[float] = []

    def client(offset: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        number = offset
        while time.monotonic() < stop:
            started = time.perf_counter()
            post(connection, QUERIES[number % len(QUERIES)][1])
            latencies.append((time.perf_counter() - started) * 1000)
            number += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(latencies) / seconds, statistics.median(latencies)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, default=ROOT / ".lambdalake" / "demo")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8, help="concurrent HTTP clients for the throughput run")
    parser.add_argument("--seconds", type=float, default=20, help="length of the throughput run")
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
    server, port, pg_port = start_server(args.home)
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        pg = psycopg.connect(host="127.0.0.1", port=pg_port, user="benchmark", password=TOKEN, dbname="lambdalake",
                             autocommit=True)
        lines = []
        for name, served_sql, direct_sql in QUERIES:
            direct_sql = direct_sql.format(**lists)
            post(connection, served_sql)  # warm
            pg.execute(served_sql).fetchall()
            served, over_http, over_pg, plain = [], [], [], []
            for _ in range(args.repeat):
                started = time.perf_counter()
                engine.query(served_sql)
                served.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                post(connection, served_sql)
                over_http.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                pg.execute(served_sql).fetchall()
                over_pg.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                direct.execute(direct_sql).fetchall()
                plain.append((time.perf_counter() - started) * 1000)
            assert sorted(engine.query(served_sql)[1]) == sorted(direct.execute(direct_sql).fetchall())
            assert len(post(connection, served_sql)) == len(engine.query(served_sql)[1])
            assert sorted(pg.execute(served_sql).fetchall()) == sorted(engine.query(served_sql)[1])
            p50 = statistics.median(plain)
            lines.append(
                f"| {name} | {statistics.median(served):.1f} | {percentile(served, 0.95):.1f} | "
                f"{statistics.median(over_http):.1f} | {percentile(over_http, 0.95):.1f} | "
                f"{statistics.median(over_pg):.1f} | {percentile(over_pg, 0.95):.1f} | "
                f"{p50:.1f} | {percentile(plain, 0.95):.1f} | "
                f"**{statistics.median(over_http) / p50:.2f}x** | **{statistics.median(over_pg) / p50:.2f}x** |"
            )
        pg.close()
        rate, loaded_p50 = requests_per_second(port, args.clients, args.seconds)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report = [
        "# Serving benchmark",
        "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M}Z on {platform.node()}: {os.cpu_count()} cores, "
        f"DuckDB {duckdb.__version__}, lake `{args.home}`, {args.repeat} runs per query, the four ways alternating.",
        "",
        "| dashboard query | engine p50 ms | engine p95 ms | HTTP p50 ms | HTTP p95 ms | pgwire p50 ms "
        "| pgwire p95 ms | DuckDB on Parquet p50 ms | p95 ms | HTTP / DuckDB p50 | pgwire / DuckDB p50 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *lines,
        "",
        "Engine: `ServingEngine.query` in this process. HTTP: `POST /api/query` to a warm `lambdalake serve` "
        "over one keep-alive connection, JSON parsed. pgwire: the same server's PostgreSQL protocol, one psycopg "
        "connection (autocommit), rows fetched (target for both: at most 1.5x DuckDB on Parquet).",
        "",
        f"Throughput: {args.clients} concurrent HTTP clients cycling through the three queries "
        f"for {args.seconds:.0f} s: **{rate:.0f} requests/s**, p50 {loaded_p50:.1f} ms under that load.",
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
