"""Freshness of the live speed layer: from a landing file's atomic rename to its events being
visible through the serving layer.

    .venv/bin/python benchmarks/freshness.py [--events-per-second 10000] [--seconds 120]
        [--warmup 30] [--trigger-interval 1] [--views all revenue_by_category_5m,order_payments]
        [--cdc-per-second 0] [--view-triggers '' 'user_sessions=30s,traffic_by_page_10m=30s']
        [--bronze-triggers '' 10s]

1. ``lambdalake stream`` runs continuously in its own process (processing-time trigger
   ``--trigger-interval``; each ``--view-triggers`` and ``--bronze-triggers`` setting in a run of
   its own), on a fresh home.
2. Once its heartbeat says it runs (JVM up, queries started; files landed before would be a
   start-up backlog carried through the run), every second this process lands one file per topic (clicks, sensors, orders, payments) with
   that second's share of ``--events-per-second``, event time = now, written and renamed
   atomically like the generator's files. Order ids carry the file's number.
3. One serving engine stays open in this process (no CLI start-up per poll); every 100 ms it
   refreshes the tables whose Delta version changed and, when a view's speed table changed, checks, per file: its orders in
   ``order_payments``, and ``revenue_by_category_5m`` counting every order landed up to it.
   Freshness = first time seen - rename time. Files landed during ``--warmup`` are not counted
   (JVM start-up, first plans). A sensors file holds one reading of each device of a fixed fleet
   (as many devices as readings per second), plus one reading above the temperature limit from
   a device named after the file: alert latency = its ``high_temperature`` row in ``alerts``
   first seen - rename time.

   With ``--cdc-per-second N`` each second also lands a ``customers_cdc`` file of N changes
   (updates spread over 300,000 customers, plus the creation of a customer named after the
   file): CDC apply latency = that customer in ``customers`` first seen - rename time. If the
   latency does not grow over the run, the dimension keeps up with N changes/s.

4. Every 10 s it samples the stream's resident memory (its process and the JVM under it, from
   ``/proc``) and the JVM's heap (``jcmd GC.heap_info``), so growth shows as heap (the JVM
   collects lazily up to its maximum) or beyond it (RocksDB state, metadata, Python workers):
   with ``--seconds 1200`` this is the 20-minute memory run (state bounded by the watermark
   keeps it flat). Afterwards the report gives each query's state rows (first / last tenth of
   its micro-batches), to tell state still filling its window from growth without bound.

Writes a Markdown report to ``benchmarks/results/freshness.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
# Each second's events across topics (clicks dominate, as in the generator's traffic).
SHARES = {"clicks": 0.70, "sensors": 0.20, "orders": 0.05, "payments": 0.05}
CATEGORIES = ("books", "electronics", "fashion", "home")
CDC_CUSTOMERS, CDC_SEGMENTS = 300_000, ("consumer", "premium", "business")


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def lines_for(topic: str, number: int, count: int, now: datetime) -> list[str]:
    at = iso(now)
    if topic == "orders":
        return [json.dumps({"order_id": f"o-{number:06d}-{i}", "user_id": f"U{i % 997}", "product_id": f"P{i % 50}",
                            "category": CATEGORIES[i % 4], "amount": 10.0 + i % 90, "event_time": at}) for i in range(count)]
    if topic == "payments":  # pays the previous file's orders
        return [json.dumps({"payment_id": f"p-{number:06d}-{i}", "order_id": f"o-{number - 1:06d}-{i}",
                            "amount": 10.0 + i % 90, "method": "card", "event_time": at}) for i in range(count)]
    if topic == "clicks":
        return [json.dumps({"event_id": f"c-{number:06d}-{i}", "user_id": f"U{i % 997}", "session_id": f"S{i % 300}",
                            "page_url": f"/p/{i % 40}", "action": "view", "device_type": "mobile", "product_id": None,
                            "event_time": at}) for i in range(count)]
    if topic == "customers_cdc":  # the file's own new customer, then updates across a large customer base
        ts_ms = int(now.timestamp() * 1000)

        def row(customer: str, segment: str) -> dict:
            return {"customer_id": customer, "name": "Ada", "email": f"{customer}@example.com", "segment": segment, "country": "DE"}

        marker = json.dumps({"op": "c", "ts_ms": ts_ms, "before": None, "after": row(f"M{number:06d}", "consumer")})
        return [marker] + [
            json.dumps({"op": "u", "ts_ms": ts_ms, "before": None,
                        "after": row(f"K{(number * count + i) % CDC_CUSTOMERS:06d}", CDC_SEGMENTS[(number + i) % 3])})
            for i in range(count - 1)
        ]
    # A fleet that reports once a second per device (the same devices every second), plus one
    # overheating device named after the file, whose alert is timed.
    hot = [json.dumps({"device_id": f"H{number:06d}", "temperature": 90.0, "humidity": 40.0, "event_time": at})]
    return hot + [json.dumps({"device_id": f"D{i:05d}", "temperature": 21.5, "humidity": 40.0, "event_time": at})
                  for i in range(count - 1)]


class Lander(threading.Thread):
    """Lands one file per topic every second; remembers each file's rename time."""

    def __init__(self, landing: Path, events_per_second: int, seconds: int, cdc_per_second: int = 0) -> None:
        super().__init__(daemon=True)
        self.landing, self.rate, self.seconds = landing, events_per_second, seconds
        self.counts = {topic: max(1, round(events_per_second * share)) for topic, share in SHARES.items()}
        if cdc_per_second:
            self.counts["customers_cdc"] = cdc_per_second
        self.renamed: dict[int, float] = {}
        self.orders: dict[int, int] = {}

    def run(self) -> None:
        start = time.monotonic()
        for number in range(self.seconds):
            time.sleep(max(0.0, start + number - time.monotonic()))
            now = datetime.now(timezone.utc)
            files = []
            for topic, count in self.counts.items():
                folder = self.landing / topic
                folder.mkdir(parents=True, exist_ok=True)
                temporary = folder / f".{number:06d}.tmp"
                temporary.write_text("\n".join(lines_for(topic, number, count, now)) + "\n")
                files.append((temporary, folder / f"{number:06d}.jsonl"))
                if topic == "orders":
                    self.orders[number] = count
            for temporary, final in files:
                os.replace(temporary, final)
            self.renamed[number] = time.monotonic()


def children_of() -> dict[int, list[int]]:
    """Every process's children (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return children


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, MB (Linux ``/proc``)."""
    children = children_of()
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo += children.get(current, [])
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def jvm_heap_mb(pid: int) -> tuple[float, float] | None:
    """(used, committed) heap of the JVM under ``pid``, MB (``jcmd GC.heap_info``), or None."""
    for child in children_of().get(pid, []):
        try:
            if b"java" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]:
                found = subprocess.run(["jcmd", str(child), "GC.heap_info"], capture_output=True, text=True, timeout=30)
                match = re.search(r"heap\s+total (\d+)K, used (\d+)K", found.stdout)
                return (int(match[2]) / 1024, int(match[1]) / 1024) if match else None
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


MEASURED = ("order_payments", "revenue_by_category_5m", "alerts")
STOP_SECONDS = 600


def wait_until_running(settings, stream: subprocess.Popen, timeout: float = 300) -> None:
    """Until the stream's heartbeat says its queries run: files landed while its JVM starts would
    be a backlog that a stream with little spare capacity carries through the whole run."""
    from include.heartbeat import read_heartbeat

    deadline = time.monotonic() + timeout
    while (read_heartbeat(settings.run_dir) or {}).get("state") != "running":
        if stream.poll() is not None:
            raise SystemExit(f"lambdalake stream exited with {stream.returncode}")
        if time.monotonic() > deadline:
            raise SystemExit(f"lambdalake stream did not start within {timeout:.0f} s")
        time.sleep(0.2)


def measure(args: argparse.Namespace, views: str, triggers: str, bronze: str) -> dict:
    """One live stream (``views``: `all` or ``stream --views``; ``triggers``: ``stream
    --view-triggers``; ``bronze``: ``stream --bronze-trigger``) on a fresh home while files land."""
    from include.config import load_settings
    from include.views import VIEWS_BY_NAME
    from serving.engine import ServingEngine, speed_relation

    home = Path(tempfile.mkdtemp(prefix="lambdalake-freshness-"))
    settings = load_settings(home=home)
    env = {**os.environ, "LAMBDALAKE_HOME": str(home), "LAMBDALAKE_TRIGGER_INTERVAL": f"{args.trigger_interval}s",
           "LAMBDALAKE_MAX_FILES_PER_TRIGGER": "1000", "LAMBDALAKE_VIEW_TRIGGERS": triggers,
           "LAMBDALAKE_BRONZE_TRIGGER_INTERVAL": bronze}
    command = [LAMBDALAKE, "stream"] + ([] if views == "all" else ["--views", views])
    intervals = trigger_intervals(home, args.trigger_interval, views, triggers, bronze)
    stream = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_running(settings, stream)
    lander = Lander(settings.landing_dir, args.events_per_second, args.seconds, args.cdc_per_second)
    lander.start()
    measured = [*MEASURED, *(["customers"] if args.cdc_per_second else [])]
    seen: dict[str, dict[int, float]] = {view: {} for view in measured if views == "all" or view in views.split(",")}
    engine = None
    memory: list[tuple[float, float, tuple[float, float] | None]] = []  # (s since start, RSS MB, JVM heap MB)
    started = next_sample = time.monotonic()
    started_at = datetime.now(timezone.utc)
    deadline = time.monotonic() + args.seconds + 180
    try:
        while time.monotonic() < deadline:
            time.sleep(0.1)
            if stream.poll() is not None:
                raise SystemExit(f"lambdalake stream exited with {stream.returncode}")
            # Only a refresh that changed a view's speed table can show a file: the checks below
            # scan whole views, and this process shares the two cores with the stream.
            changed = set() if engine else {speed_relation(VIEWS_BY_NAME[view]) for view in seen}
            engine = engine or ServingEngine(settings)
            changed.update(engine.refresh())
            now = time.monotonic()
            if now >= next_sample:
                memory.append((now - started, tree_rss_mb(stream.pid), jvm_heap_mb(stream.pid)))
                next_sample = now + 10
            if "order_payments" in seen and speed_relation(VIEWS_BY_NAME["order_payments"]) in changed:
                per_file = engine.rows(
                    "SELECT CAST(substr(order_id, 3, 6) AS INTEGER) AS file, count(*) AS orders "
                    "FROM order_payments WHERE order_id LIKE 'o-%' GROUP BY 1"
                )
                for row in per_file:
                    if row["orders"] >= lander.orders.get(row["file"], 1 << 30):
                        seen["order_payments"].setdefault(row["file"], now)
            if "revenue_by_category_5m" in seen and speed_relation(VIEWS_BY_NAME["revenue_by_category_5m"]) in changed:
                counted = engine.rows("SELECT coalesce(sum(orders), 0) AS n FROM revenue_by_category_5m")[0]["n"]
                landed = 0
                for number in sorted(lander.orders):
                    landed += lander.orders[number]
                    if landed <= counted:
                        seen["revenue_by_category_5m"].setdefault(number, now)
            if "alerts" in seen and speed_relation(VIEWS_BY_NAME["alerts"]) in changed:
                for row in engine.rows("SELECT CAST(substr(entity_id, 2) AS INTEGER) AS file FROM alerts "
                                       "WHERE kind = 'high_temperature' AND entity_id LIKE 'H%'"):
                    seen["alerts"].setdefault(row["file"], now)
            if "customers" in seen and speed_relation(VIEWS_BY_NAME["customers"]) in changed:
                for row in engine.rows("SELECT CAST(substr(customer_id, 2) AS INTEGER) AS file FROM customers "
                                       "WHERE customer_id LIKE 'M%'"):
                    seen["customers"].setdefault(row["file"], now)
            if seen and all(len(s) == args.seconds for s in seen.values()):
                break
            if not seen and now - started >= args.seconds:  # no measured view: memory and state only
                break
    finally:
        stream.send_signal(signal.SIGTERM)
        try:  # a backlogged stream finishes its in-flight micro-batches first
            stream.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            print(f"lambdalake stream still running {STOP_SECONDS} s after SIGTERM: killed", file=sys.stderr)
            stream.kill()
            stream.wait()
    return {"views": views, "triggers": triggers, "bronze": bronze, "intervals": intervals, "seen": seen, "renamed": dict(lander.renamed), "memory": memory,
            "state_series": state_series(settings, started_at)}


def trigger_intervals(home: Path, trigger: float, views: str, triggers: str, bronze: str) -> dict[str, float]:
    """The micro-batch interval of each of the stream's queries, in seconds, as the stream
    started with these options takes them."""
    from include.config import load_settings
    from speed_layer.runner import query_trigger_intervals

    settings = load_settings(home=home, trigger_interval=f"{trigger}s", view_triggers=triggers,
                             bronze_trigger_interval=bronze or None, speed_views="" if views == "all" else views)
    return {query: interval.total_seconds() for query, interval in query_trigger_intervals(settings).items()}


def state_series(settings, started_at: datetime) -> dict[str, list[tuple[float, int]]]:
    """Per query and micro-batch: (seconds since the landing began, rows its state operators
    keep), from Spark's progress in ``ops/stream_metrics``."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(settings.lakehouse_dir / "ops" / "stream_metrics")).to_pyarrow_table(
        columns=["query", "timestamp", "state_rows"]).to_pylist()
    series: dict[str, list[tuple[float, int]]] = {}
    for row in sorted(rows, key=lambda row: row["timestamp"]):
        series.setdefault(row["query"], []).append(((row["timestamp"] - started_at).total_seconds(), row["state_rows"] or 0))
    return dict(sorted(series.items()))


def state_ends(run: dict, warmup: float) -> dict[str, tuple[float, float]]:
    """Per query, its state rows averaged over the first and the last tenth of its micro-batches
    after the warm-up."""
    ends = {}
    for query, series in run["state_series"].items():
        counts = [rows for at, rows in series if at >= warmup]
        if counts:
            tenth = max(1, len(counts) // 10)
            ends[query] = (sum(counts[:tenth]) / tenth, sum(counts[-tenth:]) / tenth)
    return ends


def over_time(run: dict, args: argparse.Namespace) -> list[str]:
    """The run in tenths after the warm-up: the first measured view's median delay, memory and
    the two largest states. Growth that stops (state filling its window plus the watermark
    delay) shows apart from growth without bound."""
    start, length = args.warmup, (args.seconds - args.warmup) / 10
    ends = state_ends(run, args.warmup)
    largest = sorted(ends, key=lambda query: -ends[query][1])[:2]
    view = next(iter(run["seen"]), None)
    header = ["minutes", *([f"`{view}` p50 s"] if view else []), "RSS MB", "heap used MB", *(f"`{q}` state rows" for q in largest)]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):,.0f}" if values else "-"

    for part in range(10):
        low, high = start + part * length, start + (part + 1) * length
        cells = [f"{low / 60:.1f}-{high / 60:.1f}"]
        if view:
            delays = [run["seen"][view][n] - run["renamed"][n] for n in run["renamed"] if low <= n < high and n in run["seen"][view]]
            cells.append(f"{percentile(delays, 0.5):.1f}" if delays else "-")
        samples = [(rss, heap) for at, rss, heap in run["memory"] if low <= at < high]
        cells += [mean([rss for rss, _ in samples]), mean([heap[0] for _, heap in samples if heap])]
        cells += [mean([rows for at, rows in run["state_series"][q] if low <= at < high]) for q in largest]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events-per-second", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--trigger-interval", type=float, default=1.0)
    parser.add_argument("--cdc-per-second", type=int, default=0, help="customer changes landed per second (0: none)")
    parser.add_argument("--views", nargs="+", default=["all"],
                        help="view sets, `all` or comma-separated names (`stream --views`): one run per set, one after another")
    parser.add_argument("--view-triggers", nargs="+", default=[""],
                        help="`stream --view-triggers` settings (VIEW=DURATION,...; '' for none): one run per setting and view set")
    parser.add_argument("--bronze-triggers", nargs="+", default=[""],
                        help="`stream --bronze-trigger` settings (a duration; '' for --trigger-interval): one run per setting too")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "freshness.md")
    args = parser.parse_args()
    runs = [measure(args, views, triggers, bronze) for views in args.views for triggers in args.view_triggers
            for bronze in args.bronze_triggers]

    report = [
        "# Freshness benchmark", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, `{' '.join(sys.argv[1:]) or 'defaults'}`.",
        "",
        "`lambdalake stream` (all queries, processing-time trigger as above) while this process lands one "
        "file per topic every second (clicks 70%, sensors 20%, orders 5%, payments 5% of the events; each sensors file one "
        "reading per device of a fixed fleet); one serving engine "
        "kept open, refreshed every 100 ms. Freshness: a file's atomic rename to its events visible through the serving "
        f"layer; files of the first {args.warmup} s not counted. `alerts`: alert latency, the file's overheating reading "
        "to its `high_temperature` alert. `customers`: CDC apply latency, the file's new customer to its row in `customers`"
        + (f" ({args.cdc_per_second:,} changes/s)" if args.cdc_per_second else "") + ". One run per view set, one after another.",
    ]
    report += ["", "Micro-batch intervals (each query's processing-time trigger):", ""]
    for run in runs:
        by_interval: dict[float, list[str]] = {}
        for query, seconds in run["intervals"].items():
            by_interval.setdefault(seconds, []).append(f"`{query}`")
        report.append(f"- {label(run)}: " + "; ".join(f"{seconds:g} s: {', '.join(queries)}"
                                                     for seconds, queries in sorted(by_interval.items())) + ".")
    report += ["", "| speed views | view | files measured | p50 s | p95 s | max s | first tenth mean s | last tenth mean s | never seen |",
               "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        counted_files = [n for n in run["renamed"] if n >= args.warmup]
        for view, times in run["seen"].items():
            delays = [times[n] - run["renamed"][n] for n in counted_files if n in times]
            missing = len([n for n in counted_files if n not in times])
            if delays:  # in landing order: a last tenth slower than the first means a growing backlog
                tenth = max(1, len(delays) // 10)
                report.append(f"| {label(run)} | `{view}` | {len(delays)} | {percentile(delays, 0.5):.1f} | "
                              f"{percentile(delays, 0.95):.1f} | {max(delays):.1f} | {sum(delays[:tenth]) / tenth:.1f} | "
                              f"{sum(delays[-tenth:]) / tenth:.1f} | {missing} |")
            else:
                report.append(f"| {label(run)} | `{view}` | 0 | - | - | - | - | - | {missing} |")
    report += ["", "Stream memory (RSS of `lambdalake stream` and its JVM, sampled every 10 s after the warm-up; the JVM's "
               "heap from `jcmd GC.heap_info`; beyond the committed heap: RocksDB state, JVM metadata, Python workers):", ""]
    for run in runs:
        samples = [(rss, heap) for at, rss, heap in run["memory"] if at >= args.warmup]
        if not samples:
            continue
        tenth = max(1, len(samples) // 10)

        def ends(values: list[float]) -> str:
            first, last = sum(values[:tenth]) / tenth, sum(values[-tenth:]) / tenth
            return f"first tenth {first:,.0f} MB, last tenth {last:,.0f} MB ({last / first:.2f}x)"

        rss = [mb for mb, _ in samples]
        report.append(f"- {label(run)}: {len(samples)} samples. RSS {ends(rss)}, peak {max(rss):,.0f} MB.")
        heaps = [(mb, heap) for mb, heap in samples if heap]
        if heaps:
            report.append(f"  Heap used {ends([heap[0] for _, heap in heaps])}; committed {ends([heap[1] for _, heap in heaps])}; "
                          f"RSS beyond the committed heap {ends([mb - heap[1] for mb, heap in heaps])}.")
    report += ["", "State rows per query (Spark's progress, mean of the first / last tenth of its micro-batches after the "
               "warm-up; each bounded by its window or horizon plus the watermark delay, so it grows until that has passed):", ""]
    for run in runs:
        kept = ", ".join(f"`{query}` {first:,.0f} / {last:,.0f}" for query, (first, last) in state_ends(run, args.warmup).items()
                         if last or first)
        report.append(f"- {label(run)}: {kept}.")
    for run in runs:
        report += ["", f"Over time, {label(run)} (means per tenth of the run after the warm-up; the view's delay by the "
                   "files landed in that tenth):", "", *over_time(run, args)]
    text = "\n".join(report) + "\n"
    args.report.write_text(text)
    print(text)


def label(run: dict) -> str:
    views = run["views"]
    named = "all" if views == "all" else ", ".join(f"`{name}`" for name in views.split(","))
    options = [f"--view-triggers {run['triggers']}"] * bool(run["triggers"]) + [f"--bronze-trigger {run['bronze']}"] * bool(run["bronze"])
    return named + "".join(f" (`{option}`)" for option in options)


if __name__ == "__main__":
    main()
