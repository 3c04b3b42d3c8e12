"""One micro-batch's merge into a speed table that already holds hours of rows.

    .venv/bin/python benchmarks/speed_merge.py [--orders-per-second 500] [--hours 1 4]
        [--micro-batch-seconds 6] [--repeats 5]

The speed layer merges each micro-batch of an update- or append-mode view into its speed table
(``speed_layer.gold.MergeBatch``, delta-rs). This fills ``speed/order_payments`` with
``--hours`` of orders at ``--orders-per-second`` (one file a minute, as the stream leaves them
after compaction), then merges micro-batches like the live stream's at 10k events/s: the
``--micro-batch-seconds`` newest orders as ``pending``, as many payments of orders from the last
five minutes, and a few orders from 70 minutes before (``unpaid`` at the watermark). Each
micro-batch is merged two ways, alternating: matched on the key alone (``order_id``, what the
speed layer did before) and on :attr:`include.registry.ViewSpec.merge_on` (the key, its key time
and day, from whose range in the micro-batch delta-rs skips files). Reports the median seconds,
the part delta-rs spent scanning the table for matches, and the rows it rewrote. Writes
``benchmarks/results/speed_merge.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import deque
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
START = datetime(2026, 11, 20, tzinfo=timezone.utc)


def orders(view, count: int, first: datetime, span: timedelta, status: str) -> pa.Table:  # noqa: ANN001 - ViewSpec
    """``count`` orders spread over ``span`` from ``first``, with random ids (as the generator's)."""
    from include.tables import arrow_schema

    times = [first + span * (n / count) for n in range(count)]
    paid = status == "paid"
    return pa.table({
        "order_id": [uuid.uuid4().hex for _ in times], "user_id": ["U1"] * count, "category": ["books"] * count,
        "amount": [10.0] * count, "order_time": times,
        "payment_id": [uuid.uuid4().hex if paid else None for _ in times],
        "paid_amount": [10.0 if paid else None] * count,
        "pay_time": [at + timedelta(minutes=1) if paid else None for at in times], "status": [status] * count,
        "date": [at.date() for at in times],
    }, schema=arrow_schema(view.fields))


def micro_batch(view, stored: deque[pa.Table], now: datetime, args: argparse.Namespace) -> pa.Table:  # noqa: ANN001
    """New pending orders, payments of recent ones, and orders unpaid at the watermark."""
    count = args.orders_per_second * args.micro_batch_seconds
    span = timedelta(seconds=args.micro_batch_seconds)
    new = orders(view, count, now - span, span, "pending")
    recent = pa.concat_tables(list(stored)[-5:])  # the last five minutes' files
    paid = recent.slice(0, count).to_pylist()
    for row in paid:
        row.update(payment_id=uuid.uuid4().hex, paid_amount=row["amount"],
                   pay_time=row["order_time"] + timedelta(minutes=1), status="paid")
    old = stored[0]  # 70 minutes back, or the oldest
    unpaid = old.slice(0, 20).to_pylist()
    for row in unpaid:
        row["status"] = "unpaid"
    return pa.concat_tables([new, pa.Table.from_pylist(paid + unpaid, schema=new.schema)])


def run(hours: int, args: argparse.Namespace) -> dict[str, list]:
    from deltalake import DeltaTable

    from include import tables
    from include.lakehouse import Txn
    from include.lakehouse.delta_rs import DeltaRsStore
    from include.registry import replaces_sql
    from include.views import VIEWS_BY_NAME

    view = VIEWS_BY_NAME["order_payments"]
    results: dict[str, list] = {"key alone": [], "merge_on": []}
    with tempfile.TemporaryDirectory(prefix="lambdalake-speed-merge-") as home:
        store = DeltaRsStore(None, Path(home))
        store.ensure_table(view.speed_table, view.schema, ["date"], tables.MERGED_TABLE_PROPERTIES)
        stored: deque[pa.Table] = deque(maxlen=70)  # what a micro-batch updates: the last 70 minutes
        for minute in range(hours * 60):
            rows = orders(view, args.orders_per_second * 60, START + timedelta(minutes=minute), timedelta(minutes=1),
                          "paid")
            store.append(view.speed_table, rows)
            stored.append(rows)
        now = START + timedelta(hours=hours)
        for repeat in range(args.repeats):
            for way, keys in (("key alone", view.keys), ("merge_on", view.merge_on))[:: 1 if repeat % 2 else -1]:
                batch = micro_batch(view, stored, now, args)
                began = time.perf_counter()
                store.merge(view.speed_table, batch, keys, Txn(way, repeat), replaces_sql(view.speed.precedence))
                seconds = time.perf_counter() - began
                metrics = DeltaTable(store.path(view.speed_table)).history(1)[0]["operationMetrics"]
                results[way].append((seconds, metrics["scan_time_ms"] / 1000, metrics["num_target_rows_copied"]))
                now += timedelta(seconds=args.micro_batch_seconds)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders-per-second", type=int, default=500)
    parser.add_argument("--hours", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--micro-batch-seconds", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "speed_merge.md")
    args = parser.parse_args()

    report = [
        "# Speed-table merge benchmark", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, `{' '.join(sys.argv[1:]) or 'defaults'}`.", "",
        f"`speed/order_payments` holding the hours below at {args.orders_per_second} orders/s (one file a minute); "
        f"each micro-batch: {args.orders_per_second * args.micro_batch_seconds:,} new pending orders, as many "
        "payments of orders from the last five minutes, 20 orders unpaid at the watermark (70 minutes back). "
        f"Medians of {args.repeats} micro-batches per way, the two ways alternating.", "",
        "| hours stored | rows stored | matched on | median s | of which scanning for matches s | rows rewritten "
        "| key alone / merge_on |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for hours in args.hours:
        results = run(hours, args)
        medians = {way: statistics.median(r[0] for r in rows) for way, rows in results.items()}
        for way, rows in results.items():
            ratio = f"**{medians['key alone'] / medians['merge_on']:.1f}x**" if way == "merge_on" else ""
            keys = "`order_id`" if way == "key alone" else "`order_id`, `order_time`, `date`"
            report.append(f"| {hours} | {hours * 3600 * args.orders_per_second:,} | {keys} | {medians[way]:.2f} | "
                          f"{statistics.median(r[1] for r in rows):.2f} | "
                          f"{statistics.median(r[2] for r in rows):,.0f} | {ratio} |")
        print("\n".join(report[-2:]), flush=True)
    text = "\n".join(report) + "\n"
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
