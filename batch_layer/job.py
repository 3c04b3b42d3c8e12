"""Spark application for the nightly DAG's Spark steps (submitted by SparkSubmitOperator).

    spark-submit batch_layer/job.py {recompute|reconcile|batch} --date YYYY-MM-DD

Settings come from the ``LAMBDALAKE_*`` environment, like every other entry point. :func:`lineage`
says which tables a submission reads and writes; the DAG imports it, so this module imports the
Spark side only when it runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import date

from include import tables
from include.config import Settings, load_settings
from include.lineage import Lineage, Partition
from include.views import VIEWS, days_read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batch_layer/job.py")
    parser.add_argument("step", choices=("recompute", "reconcile", "batch"))
    parser.add_argument("--date", type=date.fromisoformat, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from batch_layer.nightly import require_bronze, run_batch
    from batch_layer.reconcile import reconcile_day
    from batch_layer.recompute import recompute_day
    from include.coverage import mark_rerun_started
    from include.lakehouse import open_reader, open_store

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    store = open_store(settings)
    require_bronze(store, settings)
    if args.step == "recompute":
        # Before any partition is replaced: see include/coverage.py.
        mark_rerun_started(open_reader(settings), args.date)
        print(recompute_day(store, settings, args.date))
    elif args.step == "reconcile":
        print(reconcile_day(store, settings, args.date))
    else:
        print(run_batch(settings, args.date, store))
    return 0


def lineage(argv: list[str]) -> Lineage:
    """The tables one submission reads and writes: recompute reads the Bronze partitions the day's
    views are rebuilt from and replaces the day in every batch view (first marking a covered
    day's coverage row: a rerun, not yet published); reconcile compares the day's
    batch and speed views into ``reconciliation`` (and the tables of differences); batch does both
    and marks the day covered. Declared, not measured: no table is opened."""
    args = parse_args(argv)
    day = [{"date": args.date.isoformat()}]
    batch = {view.batch_table: day for view in VIEWS}
    # A dimension's speed table is read whole (its state as of the day's end).
    speed = {view.speed_table: [] if view.kind == "dimension" else day for view in VIEWS}
    reconciled = {tables.RECONCILIATION: day} | {view.differences.table: day for view in VIEWS if view.differences}
    bronze = bronze_read(load_settings(), args.date)
    if args.step == "recompute":
        return Lineage(reads=bronze, writes=batch | {tables.BATCH_COVERAGE: []})
    if args.step == "reconcile":
        return Lineage(reads=batch | speed, writes=reconciled)
    return Lineage(reads=bronze | speed, writes=batch | reconciled | {tables.BATCH_COVERAGE: []})


def bronze_read(settings: Settings, day: date) -> dict[str, list[Partition]]:
    """Per Bronze table, the event days rebuilding ``day`` reads (no partitions: the whole table,
    a dimension's history)."""
    days, whole = days_read(settings, day)
    return {tables.bronze(topic): [] if topic in whole else [{"event_date": d.isoformat()} for d in sorted(read)]
            for topic, read in {**days, **dict.fromkeys(whole, set())}.items()}


if __name__ == "__main__":
    sys.exit(main())
