"""Lakehouse maintenance on real tables and files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from deltalake import DeltaTable

from batch_layer.maintenance import checkpoint_hygiene
from include.lakehouse import all_tables
from include.views import VIEWS_BY_NAME
from include.lakehouse import open_store

REVENUE = VIEWS_BY_NAME["revenue_by_category_5m"]


def test_compaction_and_vacuum_keep_every_row_and_remove_old_uncommitted_files(spark, settings):
    store = open_store(settings, spark)
    store.ensure_table(REVENUE.speed_table, REVENUE.schema, ["date"])
    start = datetime(2026, 11, 20, 10, tzinfo=timezone.utc)
    for i in range(5):
        row = (start, start, f"c{i}", float(i), 1, 1, date(2026, 11, 20))
        store.append(REVENUE.speed_table, spark.createDataFrame([row], REVENUE.schema))
    before = sorted(store.read(REVENUE.speed_table).collect())
    # Files a writer moved in but never committed (killed in between): the old one goes.
    data_file = Path(DeltaTable(store.path(REVENUE.speed_table)).file_uris()[0])
    stray_old, stray_new = data_file.with_name("stray-old.parquet"), data_file.with_name("stray-new.parquet")
    for stray in (stray_old, stray_new):
        stray.write_bytes(data_file.read_bytes())
    eight_days_ago = time.time() - 8 * 86400
    os.utime(stray_old, (eight_days_ago, eight_days_ago))
    assert all_tables(settings.lakehouse_dir) == [REVENUE.speed_table]
    maintain = subprocess.run(  # what the lakehouse_maintenance DAG runs
        [Path(sys.executable).parent / "lambdalake", "maintain", "--home", settings.home, "--format", "json"],
        capture_output=True, text=True, check=True,
    )
    result, *hygiene = json.loads(maintain.stdout)
    assert result["table"] == REVENUE.speed_table and result["files_removed"] == 5 and result["files_added"] == 1
    assert {row["table"] for row in hygiene} == {"feed_files", "temporary_files"}
    assert len(DeltaTable(store.path(REVENUE.speed_table)).file_uris()) == 1
    assert sorted(store.read(REVENUE.speed_table).collect()) == before
    # The replaced files are younger than the 7-day retention, and so is the fresh stray file.
    assert result["vacuumed"] == 1 and not stray_old.exists() and stray_new.exists()


def test_checkpoint_hygiene_removes_what_no_query_reads_again_and_old_temporary_files(spark, settings):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.errors import StreamingQueryException

    orders, clicks = settings.feeds_dir / "orders", settings.feeds_dir / "clicks"
    two_days_ago = time.time() - 2 * 86400
    for folder, names in ((orders, ("000000000001", "000000000002")), (clicks, ("000000000001", "000000000002"))):
        folder.mkdir(parents=True)
        for name in names:
            pq.write_table(pa.table({"n": [1]}), folder / f"{name}.parquet")
    old_tmp = orders / ".000000000003.tmp"
    old_tmp.write_bytes(b"x")
    for age, path in enumerate((orders / "000000000002.parquet", orders / "000000000001.parquet", old_tmp,
                                clicks / "000000000001.parquet")):  # the file source reads the oldest first
        os.utime(path, (two_days_ago - age, two_days_ago - age))

    def fail_on_the_second(batch, batch_id):
        if batch_id == 1:
            raise RuntimeError("killed before its commit")

    # A query reads the orders feed: batch 0 committed, batch 1 planned and not committed.
    query = (spark.readStream.schema("n long").option("maxFilesPerTrigger", 1).parquet(str(orders))
             .writeStream.foreachBatch(fail_on_the_second).trigger(availableNow=True)
             .option("checkpointLocation", str(settings.checkpoints_dir / "speed_orders")).start())
    with pytest.raises(StreamingQueryException):
        query.awaitTermination()

    assert checkpoint_hygiene(settings) == {"feed_files": 2, "temporary_files": 1}
    # The committed batch's file, the old file no query reads; batch 1's file stays for its replay.
    assert sorted(p.name for p in orders.iterdir()) == ["000000000002.parquet"]
    assert sorted(p.name for p in clicks.iterdir()) == ["000000000002.parquet"]


def test_maintenance_is_due_at_most_once_a_utc_day(settings):
    from batch_layer.maintenance import last_maintenance, maintenance_due, record_maintenance

    evening = datetime(2026, 11, 20, 23, 50, tzinfo=timezone.utc)
    assert last_maintenance(settings) is None and maintenance_due(settings, evening)
    record_maintenance(settings, datetime(2026, 11, 20, 1, 35, tzinfo=timezone.utc))
    assert not maintenance_due(settings, evening)
    assert maintenance_due(settings, datetime(2026, 11, 21, 0, 5, tzinfo=timezone.utc))


def test_a_covered_day_with_unchanged_bronze_needs_no_second_run(settings):
    from batch_layer.nightly import batch_needed
    from include.coverage import bronze_fingerprint, mark_covered, mark_rerun_started

    store, day = open_store(settings), date(2026, 11, 20)
    assert batch_needed(settings, day.isoformat())
    mark_covered(store, day, bronze_fingerprint(store, settings, day))
    assert not batch_needed(settings, day.isoformat())
    assert batch_needed(settings, day.isoformat(), {"date": day.isoformat()})  # asked for by hand
    mark_covered(store, day, {"orders:2026-11-20": 1})  # Bronze has changed since
    assert batch_needed(settings, day.isoformat())
    mark_covered(store, day, bronze_fingerprint(store, settings, day))
    mark_rerun_started(store, day)  # a rerun that never published: run the day again
    assert batch_needed(settings, day.isoformat())


def test_a_run_takes_the_newest_day_the_stream_announced():
    from batch_layer.nightly import day_for_run

    run_after = datetime(2026, 11, 22, 1, 15, tzinfo=timezone.utc)
    assert day_for_run(run_after, {}, ["2026-11-20", "2026-11-21"]) == "2026-11-21"
    assert day_for_run(run_after, {"date": "2026-11-19"}, ["2026-11-21"]) == "2026-11-19"
    assert day_for_run(run_after, None) == "2026-11-21"
