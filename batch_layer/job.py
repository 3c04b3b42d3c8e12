"""Spark application for the nightly DAG's Spark steps (submitted by SparkSubmitOperator).

    spark-submit batch_layer/job.py {recompute|reconcile|batch} --date YYYY-MM-DD

Settings come from the ``LAMBDALAKE_*`` environment, like every other entry point.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import date

from batch_layer.nightly import require_bronze, run_batch
from batch_layer.reconcile import reconcile_day
from batch_layer.recompute import recompute_day
from include.config import load_settings
from include.lakehouse import open_store


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="batch_layer/job.py")
    parser.add_argument("step", choices=("recompute", "reconcile", "batch"))
    parser.add_argument("--date", type=date.fromisoformat, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = load_settings()
    store = open_store(settings)
    require_bronze(store, settings)
    if args.step == "recompute":
        print(recompute_day(store, settings, args.date))
    elif args.step == "reconcile":
        print(reconcile_day(store, args.date))
    else:
        print(run_batch(settings, args.date, store))
    return 0


if __name__ == "__main__":
    sys.exit(main())
