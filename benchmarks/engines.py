"""The two lakehouse engines side by side: one day through the speed layer and the nightly batch.

    .venv/bin/python benchmarks/engines.py [--hours 6] [--orders-per-hour 1000] [--max-files-per-trigger 2]

Lands ``--hours`` of generated traffic once (15-minute files), then, for each engine
(``LAMBDALAKE_LAKEHOUSE_ENGINE=delta-rs`` / ``delta-spark``, local master, the platform's
defaults otherwise) on its own copy of the landing: times ``lambdalake stream --available-now``
(all nine views) and ``lambdalake batch --date`` for the day, each in a fresh process (JVM start-up
included), and counts the Delta commits each wrote. Then checks that both lakes serve the same
views. Needs the Spark packages `make install` fetches (the delta-spark engine).

Writes a Markdown report to ``benchmarks/results/engines.md``.
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
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
ENGINES = ("delta-rs", "delta-spark")
START = datetime(2026, 11, 20, tzinfo=timezone.utc)
CHECK = ("SELECT (SELECT round(sum(revenue), 2) FROM revenue_by_category_5m) AS revenue, "
         "(SELECT count_if(status = 'paid') FROM order_payments) AS paid, "
         "(SELECT sum(readings) FROM device_health_5m) AS readings, "
         "(SELECT count(*) FROM user_sessions) AS sessions, (SELECT count(*) FROM alerts) AS alerts, "
         "(SELECT count(*) FROM customers_history) AS customer_versions, "
         "(SELECT count(*) FROM late_events) AS late, (SELECT count(*) FROM dlq) AS dlq")


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    seconds = time.monotonic() - started
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(command[:2])} failed ({run.returncode}): {run.stderr[-2000:]}")
    return seconds


def commits(lakehouse: Path) -> int:
    return sum(1 for _ in lakehouse.rglob("_delta_log/*.json"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=6)
    parser.add_argument("--orders-per-hour", type=float, default=1000)
    parser.add_argument("--max-files-per-trigger", type=int, default=2)
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "engines.md")
    args = parser.parse_args()

    from include.config import load_settings
    from include.generator import TrafficOptions, generate
    from include.spark import delta_spark_unavailable_reason

    work = Path(tempfile.mkdtemp(prefix="lambdalake-engines-"))
    source = load_settings(home=work / "landed")
    reason = delta_spark_unavailable_reason(source)
    if reason:
        raise SystemExit(f"the delta-spark engine cannot run here: {reason}")
    result = generate(source, START, args.hours, TrafficOptions(orders_per_hour=args.orders_per_hour), seed=7,
                      file_minutes=15, progress=False)
    events = sum(counts["lines"] for counts in result.ledger["topics"].values())
    day = START.date().isoformat()

    figures = {}
    for engine in ENGINES:
        home = work / engine
        shutil.copytree(source.home, home)
        env = {key: value for key, value in os.environ.items() if not key.startswith("LAMBDALAKE_")}
        env.update(LAMBDALAKE_HOME=str(home), LAMBDALAKE_LAKEHOUSE_ENGINE=engine,
                   LAMBDALAKE_MAX_FILES_PER_TRIGGER=str(args.max_files_per_trigger))
        stream = timed([LAMBDALAKE, "stream", "--available-now"], env)
        stream_commits = commits(home / "lakehouse")
        batch = timed([LAMBDALAKE, "batch", "--date", day, "--format", "json"], env)
        check = subprocess.run([LAMBDALAKE, "query", "--format", "json", CHECK], capture_output=True, text=True,
                               env=env, check=True)
        figures[engine] = dict(stream=stream, batch=batch, stream_commits=stream_commits,
                               batch_commits=commits(home / "lakehouse") - stream_commits,
                               served=json.loads(check.stdout)[0])
        print(engine, {k: v for k, v in figures[engine].items() if k != "served"}, flush=True)

    rs, spark = figures["delta-rs"], figures["delta-spark"]
    same = rs["served"] == spark["served"]
    load = os.getloadavg()
    lines = [
        "# Lakehouse engines side by side", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, local master, `--hours {args.hours:g} --orders-per-hour "
        f"{args.orders_per_hour:g} --max-files-per-trigger {args.max_files_per_trigger}`; load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min).", "",
        f"{events:,} landed lines ({args.hours:g} h of the generator's mix, 15-minute files), all nine views.", "",
        "| engine | `stream --available-now` s | events/s | Delta commits | `batch --date` s | Delta commits |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for engine, f in figures.items():
        lines.append(f"| {engine} | {f['stream']:.1f} | {events / f['stream']:,.0f} | {f['stream_commits']:,} | "
                     f"{f['batch']:.1f} | {f['batch_commits']:,} |")
    lines += [
        "",
        f"delta-spark / delta-rs: stream {spark['stream'] / rs['stream']:.2f}x, "
        f"batch {spark['batch'] / rs['batch']:.2f}x the time.", "",
        f"Both lakes serve the same views: **{'yes' if same else 'NO'}** "
        f"({json.dumps(rs['served'])}{'' if same else ' vs ' + json.dumps(spark['served'])}).",
    ]
    text = "\n".join(lines) + "\n"
    args.report.write_text(text)
    print(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
