"""The speed side's stateful processors alone: does a micro-batch's time stay flat as their state fills?

    .venv/bin/python benchmarks/stateful_processors.py [--devices 500] [--users 3000]
        [--clicks-per-second 700] [--seconds-per-batch 10] [--batches 90]

``alerts`` (``AlertDetector``: each device's readings of the last 15 minutes, each user's open
5-minute order windows) and ``user_sessions`` (``OpenSessions``: each user's open sessions) run as
the speed layer runs them (their view definitions on watermarked streams, ``transformWithState``
on Spark's executors), each on its own stream of Parquet files like ingest's feeds: one file per
micro-batch, ``--seconds-per-batch`` seconds of event time each. Sensors: one reading per device
a second, so after 15 minutes of event time (90 micro-batches of 10 s) a device's look-back is
full. Clicks: ``--clicks-per-second`` from ``--users`` users. A micro-batch's time is its
``foreachBatch`` count (the processors run there); first and last fifth of the micro-batches are
compared. Writes ``benchmarks/results/stateful_processors.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
START = datetime(2026, 11, 20, tzinfo=timezone.utc)


def write_inputs(folder: Path, args: argparse.Namespace) -> dict[str, Path]:
    """Per topic a folder of one Parquet file per micro-batch."""
    rnd = random.Random(1)
    paths = {topic: folder / topic for topic in ("sensors", "orders", "clicks")}
    for path in paths.values():
        path.mkdir(parents=True)
    for number in range(args.batches):
        seconds = [START + timedelta(seconds=number * args.seconds_per_batch + s)
                   for s in range(args.seconds_per_batch)]
        sensors = [(f"D{d:05d}", round(rnd.gauss(40, 3), 2), at) for at in seconds for d in range(args.devices)]
        clicks = [(f"U{rnd.randrange(args.users):06d}", f"/p{rnd.randrange(50)}",
                   rnd.choice(("view", "view", "add_to_cart")), at)
                  for at in seconds for _ in range(args.clicks_per_second)]
        orders = [(f"U{rnd.randrange(args.users):06d}", at) for at in seconds for _ in range(5)]
        for topic, rows, names in (("sensors", sensors, ("device_id", "temperature", "event_time")),
                                   ("clicks", clicks, ("user_id", "page_url", "action", "event_time")),
                                   ("orders", orders, ("user_id", "event_time"))):
            pq.write_table(pa.table(dict(zip(names, map(list, zip(*rows))))), paths[topic] / f"{number:06d}.parquet")
    return paths


def timed_batches(settings, view: str, inputs: dict, checkpoint: Path) -> list[float]:  # noqa: ANN001 - Settings
    from include.registry import ViewContext
    from include.views import VIEWS_BY_NAME

    rows = VIEWS_BY_NAME[view](inputs, ViewContext(settings, exact=False))
    seconds: list[float] = []

    def count(batch, batch_id: int) -> None:  # noqa: ANN001 - DataFrame
        started = time.perf_counter()
        batch.count()
        seconds.append(time.perf_counter() - started)

    (rows.writeStream.outputMode("update").foreachBatch(count).option("checkpointLocation", str(checkpoint))
     .trigger(availableNow=True).start().awaitTermination())
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--users", type=int, default=3000)
    parser.add_argument("--clicks-per-second", type=int, default=700)
    parser.add_argument("--seconds-per-batch", type=int, default=10)
    parser.add_argument("--batches", type=int, default=90)
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "stateful_processors.md")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="lambdalake-processors-") as scratch:
        os.environ.setdefault("LAMBDALAKE_HOME", str(Path(scratch) / "home"))
        from include.config import load_settings
        from include.spark import get_spark

        settings = load_settings()
        spark = get_spark(settings, "lambdalake-processors-benchmark")
        paths = write_inputs(Path(scratch) / "feeds", args)
        schemas = {"sensors": "device_id string, temperature double, event_time timestamp",
                   "orders": "user_id string, event_time timestamp",
                   "clicks": "user_id string, page_url string, action string, event_time timestamp"}
        streams = {topic: spark.readStream.schema(schemas[topic]).option("maxFilesPerTrigger", 1).parquet(str(path))
                   .withWatermark("event_time", "2 minutes") for topic, path in paths.items()}
        runs = {
            "alerts": timed_batches(settings, "alerts", {"sensors": streams["sensors"], "orders": streams["orders"]},
                                    Path(scratch) / "checkpoints" / "alerts"),
            "user_sessions": timed_batches(settings, "user_sessions", {"clicks": streams["clicks"]},
                                           Path(scratch) / "checkpoints" / "user_sessions"),
        }

    span = args.batches * args.seconds_per_batch
    report = [
        "# Stateful processors benchmark", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, `{' '.join(sys.argv[1:]) or 'defaults'}`.", "",
        f"{args.batches} micro-batches of {args.seconds_per_batch} s of event time ({span // 60} min in all): "
        f"{args.devices:,} devices reading once a second and 5 orders a second for `alerts`; "
        f"{args.clicks_per_second:,} clicks a second from {args.users:,} users for `user_sessions`. "
        "Seconds per micro-batch, in the first and the last fifth of the run "
        "(flat: the state's size does not slow it).", "",
        "| view | micro-batches | first fifth s per batch | last fifth s per batch | last / first | total s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for view, seconds in runs.items():
        fifth = max(1, len(seconds) // 5)
        first, last = sum(seconds[:fifth]) / fifth, sum(seconds[-fifth:]) / fifth
        report.append(f"| `{view}` | {len(seconds)} | {first:.2f} | {last:.2f} | {last / first:.2f} "
                      f"| {sum(seconds):.1f} |")
    text = "\n".join(report) + "\n"
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
