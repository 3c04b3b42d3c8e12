"""Speed-layer throughput, side by side with the native ceiling on the same files.

    .venv/bin/python benchmarks/speed_layer_throughput.py [--orders-per-hour 2000] [--hours 24] [--file-minutes 60]
        [--max-files-per-trigger 1 20] [--views all revenue_by_category_5m,order_payments]
        [--approx-distinct-rsd 0.01 0.02]

1. ``lambdalake generate`` lands N events (no corrupt lines, so pyarrow can read every file).
2. ``lambdalake stream --available-now`` is timed to completion (wall clock, a fresh process:
   Spark start-up included) once per ``--max-files-per-trigger`` value and ``--views`` set (all
   views, or only those named: ``stream --views``) and ``--approx-distinct-rsd`` value (else the
   platform's default), each on its own copy of the files;
   events/s = landed lines / seconds. The processing time (first
   micro-batch start to last end, from Spark's progress) is reported beside it.
3. The native ceiling, in the same run: pyarrow reads each JSON Lines file and writes Parquet.
4. Spark's floor, in the same run (``spark_floor.py``, a fresh process per micro-batch size): one
   Structured Streaming query reads the same files as text and writes Parquet, five files (one
   per topic's) per micro-batch per ``--max-files-per-trigger``: what any speed layer on Spark
   does at least.
Where the stream's time went comes from ``stream_metrics`` (Spark's durationMs per micro-batch).
Writes a Markdown report to ``benchmarks/results/speed_layer.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.json as pj
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")


def run(command: list[str], env: dict) -> float:
    started = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def native_ceiling(landing: Path, out: Path) -> float:
    """pyarrow JSON -> Parquet for every landed file, one after another."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for number, path in enumerate(sorted(landing.glob("*/*.jsonl"))):
        pq.write_table(pj.read_json(path), out / f"{number}.parquet")
    return time.perf_counter() - started


def spark_floor(landing: Path, out: Path, files_per_topic: int) -> dict:
    """``spark_floor.py`` in a fresh process: its wall clock and its processing time."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "spark_floor.py"), str(landing), str(out),
                           str(files_per_topic * len(list(landing.iterdir())))],
                          check=True, capture_output=True, text=True)
    return {"files": files_per_topic, "seconds": time.perf_counter() - started,
            **json.loads(done.stdout.splitlines()[-1])}


def processing_seconds(home: Path) -> float:
    """From the first micro-batch's start to the last one's end, over all queries (Spark's own
    progress timestamps): the stream's work without JVM and session start-up."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(home / "lakehouse" / "ops" / "stream_metrics")).to_pyarrow_table().to_pylist()
    starts = [row["timestamp"].timestamp() for row in rows]
    ends = [row["timestamp"].timestamp() + row["batch_duration_ms"] / 1000 for row in rows]
    return max(ends) - min(starts)


def stream_breakdown(home: Path) -> dict[str, float]:
    from deltalake import DeltaTable

    metrics = DeltaTable(str(home / "lakehouse" / "ops" / "stream_metrics")).to_pyarrow_table().to_pylist()
    totals: Counter = Counter()
    for row in metrics:
        for phase, millis in json.loads(row["duration_ms"]).items():
            totals[f"{row['query']}.{phase}"] += millis / 1000
    batches = Counter(row["query"] for row in metrics)
    return {**{f"{q}.batches": n for q, n in batches.items()}, **dict(totals)}


def stream_run(landing: Path, home: Path, max_files_per_trigger: int, views: str, rsd: float | None) -> dict:
    """``lambdalake stream --available-now`` on a copy of the landing zone, in a fresh home."""
    shutil.copytree(landing, home / "landing")  # copy2 keeps the mtimes, so the arrival order
    env = {**os.environ, "LAMBDALAKE_HOME": str(home)}
    if rsd is not None:
        env["LAMBDALAKE_APPROX_DISTINCT_RSD"] = str(rsd)
    command = [LAMBDALAKE, "stream", "--available-now", "--max-files-per-trigger", str(max_files_per_trigger)]
    seconds = run(command + ([] if views == "all" else ["--views", views]), env)
    return {"files": max_files_per_trigger, "views": views, "rsd": rsd, "seconds": seconds,
            "processing": processing_seconds(home), "breakdown": stream_breakdown(home)}


def label(views: str, rsd: float | None = None) -> str:
    named = "all views" if views == "all" else "views " + ", ".join(f"`{name}`" for name in views.split(","))
    return named + ("" if rsd is None else f", distinct counts at {rsd:g} rsd")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders-per-hour", type=float, default=2000)
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--file-minutes", type=int, default=60)
    parser.add_argument("--max-files-per-trigger", type=int, nargs="+", default=[1],
                        help="one stream run per value, side by side")
    parser.add_argument("--views", nargs="+", default=["all"],
                        help="view sets, `all` or comma-separated names: one stream run per set (and per files value)")
    parser.add_argument("--approx-distinct-rsd", type=float, nargs="+", default=[None],
                        help="distinct-count precisions, relative standard deviation of the HLL sketches "
                        "(LAMBDALAKE_APPROX_DISTINCT_RSD): one stream run per value too")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "speed_layer.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lambdalake-bench-") as scratch:
        home = Path(scratch) / "home"
        env = {**os.environ, "LAMBDALAKE_HOME": str(home)}
        generate = [LAMBDALAKE, "generate", "--start", "2026-11-20T00:00:00Z", "--hours", str(args.hours),
                    "--orders-per-hour", str(args.orders_per_hour), "--corrupt-fraction", "0",
                    "--file-minutes", str(args.file_minutes), "--seed", "1", "--format", "json"]
        generated = subprocess.run(generate, env=env, check=True, capture_output=True, text=True)
        lines = sum(row["lines"] for row in json.loads(generated.stdout))
        files = len(list((home / "landing").glob("*/*.jsonl")))
        size = sum(p.stat().st_size for p in (home / "landing").glob("*/*.jsonl"))

        native_seconds = native_ceiling(home / "landing", Path(scratch) / "native")
        floors = [spark_floor(home / "landing", Path(scratch) / f"floor-{n}", n) for n in args.max_files_per_trigger]
        runs = [stream_run(home / "landing", Path(scratch) / f"run-{n}-{number}-{rsd}", n, views, rsd)
                for n in args.max_files_per_trigger for number, views in enumerate(args.views)
                for rsd in args.approx_distinct_rsd]

    native_rate = lines / native_seconds
    report = [
        "# Speed-layer benchmark",
        "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%M}Z on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, `{' '.join(sys.argv[1:]) or 'defaults'}`.",
        f"Input: {lines:,} events in {files} files ({size / 1e6:.1f} MB), all five topics.",
        "",
        "| what | seconds | events/s | vs native |",
        "|---|---:|---:|---:|",
    ]
    def timed_rows(what: str, run: dict) -> list[str]:
        """A run's wall-clock row (start-up included) and its processing-time row."""
        return [
            f"| {what}, wall clock | {run['seconds']:.1f} | {lines / run['seconds']:,.0f} "
            f"| {lines / run['seconds'] / native_rate:.2f}x |",
            f"| the same run, first micro-batch start to last end | {run['processing']:.1f} "
            f"| {lines / run['processing']:,.0f} | {lines / run['processing'] / native_rate:.2f}x |",
        ]

    for result in runs:
        report += timed_rows(f"`stream --available-now`, {result['files']} file(s) per topic per micro-batch, "
                             f"{label(result['views'], result['rsd'])} (JVM and Spark start-up "
                             "included)", result)
    for floor in floors:
        report += timed_rows(f"Spark's floor: one streaming query, text read + Parquet write, {floor['files']} file(s) "
                             f"per topic per micro-batch ({floor['micro_batches']} micro-batches)", floor)
    report += [
        f"| native ceiling: pyarrow JSON read + Parquet write | {native_seconds:.1f} | {native_rate:,.0f} | 1.00x |",
        "",
        "Against Spark's floor with the same micro-batch size (events/s over the floor's; processing time, first "
        "micro-batch start to last end, so both once running):",
        "",
        *[f"- {result['files']} file(s) per topic per micro-batch, "
          f"{label(result['views'], result['rsd'])}: "
          f"{floor['processing'] / result['processing']:.2f}x"
          for result in runs for floor in floors if floor["files"] == result["files"]],
        "",
        "Where each run's time went (`durationMs` from `stream_metrics` summed over micro-batches, seconds; "
        "queries run concurrently):",
        "",
        "| files per micro-batch | views | query | micro-batches | addBatch s | s per micro-batch "
        "| triggerExecution s |",
        "|---:|---|---|---:|---:|---:|---:|",
    ]
    for result in runs:
        breakdown = result["breakdown"]
        for query in sorted({key.split(".")[0] for key in breakdown}):
            batches = breakdown.get(f"{query}.batches", 0)
            added = breakdown.get(f"{query}.addBatch", 0.0)
            report.append(
                f"| {result['files']} | {label(result['views'], result['rsd'])} | {query} "
                f"| {batches:.0f} "
                f"| {added:.1f} | {added / max(batches, 1):.2f} "
                f"| {breakdown.get(f'{query}.triggerExecution', 0.0):.1f} |"
            )
    report.append("")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text("\n".join(report), encoding="utf-8")
    print("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
