"""A full disk under the lake (a tmpfs mounted for the test, so the test needs root): the stream
and the nightly batch stop with one line naming the path and the cause (exit 1), no Delta table
holds a partial commit, and once space is freed the same command goes on: the stream
exactly-once, the batch to the day's truth, while the failed run left the previous partition
served.

The whole home sits on the small file system, as it would on a real disk: the landed files are
written before it fills and are never lost, since nothing deletes them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import pytest
from e2e.test_lambda_end_to_end import iso, read_truth, served_day
from exactly_once import assert_every_line_once

from batch_layer.nightly import run_batch
from include import tables
from include.config import Settings, load_settings
from include.doctor import examine
from include.generator import GenerationResult, TrafficOptions, generate
from include.lakehouse import all_tables, open_store
from include.views import VIEWS

LAMBDALAKE = Path(sys.executable).parent / "lambdalake"
pytestmark = pytest.mark.slow
DAY = date(2026, 11, 20)
ROOMY_KIB = 64 * 1024
STREAM_ROOM_KIB = 1200  # about half of what streaming the two hours adds to the lake
BATCH_ROOM_KIB = 96  # some of the day's batch views fit, not all
RUN_TIME = "detected_at"  # a batch alert's: when the batch ran
FULL_DISK = re.compile(r"lambdalake: error: (.* )?no space left on device writing (?P<path>/\S+): "
                       r"free space and run the same command again")


def mount_tmpfs(folder: Path, kib: int, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join((*options, f"size={kib}k")), "tmpfs", str(folder)],
                          capture_output=True, text=True)


def resize(folder: Path, kib: int) -> None:
    resized = mount_tmpfs(folder, kib, "remount")
    assert resized.returncode == 0, resized.stderr


def used_kib(folder: Path) -> int:
    stat = os.statvfs(folder)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize // 1024


def lambdalake(settings: Settings, *arguments: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2",
           "LAMBDALAKE_MAX_FILES_PER_TRIGGER": "1", "LAMBDALAKE_SPEED_VIEWS": "order_payments"}
    return subprocess.run([LAMBDALAKE, arguments[0], "--home", str(settings.home), *arguments[1:]], env=env,
                          capture_output=True, text=True, timeout=600)


def one_line_error(run: subprocess.CompletedProcess, settings: Settings) -> Path:
    """The path a failed run's last line names; its stderr holds no traceback."""
    assert run.returncode == 1, run.stderr[-4000:]
    last = run.stderr.strip().splitlines()[-1]
    told = FULL_DISK.fullmatch(last)
    assert told, run.stderr[-4000:]
    assert "Traceback" not in run.stderr, run.stderr[-4000:]
    return Path(told["path"])


def assert_every_table_whole(settings: Settings, store) -> None:
    """Every table opens, its newest commit is whole and every file it references is there and
    complete (the doctor's checks), and Spark reads it."""
    assert examine(settings).findings == []
    for name in all_tables(settings.lakehouse_dir):
        store.read(name).count()


@dataclass(frozen=True)
class FilledThenFreed:
    settings: Settings
    generated: GenerationResult
    failed: subprocess.CompletedProcess  # the stream that filled the disk
    silver_rows_when_full: int
    findings_when_full: list
    restarted: subprocess.CompletedProcess  # the same command once space was freed


@pytest.fixture(scope="module")
def small_disk(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system for the lake needs root")
    folder = tmp_path_factory.mktemp("full-disk") / "home"
    folder.mkdir()
    mounted = mount_tmpfs(folder, ROOMY_KIB)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs for the lake: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=False)


@pytest.fixture(scope="module")
def filled_then_freed(spark, small_disk):
    """Two hours landed, then the disk shrunk to what they use plus less than streaming them
    needs; the stream run until it stops, then run again on a disk with room."""
    settings = load_settings(home=small_disk, spark_master="local[2]", shuffle_partitions=2)
    options = TrafficOptions(orders_per_hour=60, duplicate_fraction=0.03, corrupt_fraction=0.02)
    generated = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 2, options, seed=4, file_minutes=30,
                         progress=False)
    resize(small_disk, used_kib(small_disk) + STREAM_ROOM_KIB)
    failed = lambdalake(settings, "stream", "--available-now")
    store = open_store(settings, spark)
    silver = sum(store.read(tables.silver(topic)).count() for topic in generated.ledger["topics"]
                 if store.exists(tables.silver(topic)))
    findings = examine(settings).findings
    resize(small_disk, ROOMY_KIB)  # space freed; nothing of the lake deleted
    restarted = lambdalake(settings, "stream", "--available-now")
    return FilledThenFreed(settings, generated, failed, silver, findings, restarted)


def test_a_stream_that_fills_the_disk_stops_in_one_line_and_goes_on_exactly_once_after(spark, filled_then_freed):
    run = filled_then_freed
    settings, ledger = run.settings, run.generated.ledger
    path = one_line_error(run.failed, settings)
    assert path.is_relative_to(settings.home)
    valid = sum(topic["valid"] for topic in ledger["topics"].values())
    assert 0 < run.silver_rows_when_full < valid, "the disk did not fill while streaming; the test proves nothing"
    assert run.findings_when_full == []  # no partial commit, no torn checkpoint, while the disk was full

    assert run.restarted.returncode == 0, run.restarted.stderr[-4000:]
    store = open_store(settings, spark)
    assert_every_line_once(store, ledger)
    assert_every_table_whole(settings, store)


def rounded(rows) -> list[tuple]:
    """Rows comparable across batch runs, sorted: without the run's own time, doubles rounded (a
    sum may differ in its last bit)."""
    dicts = (row.asDict() if hasattr(row, "asDict") else row for row in rows)
    return sorted((tuple((k, round(v, 6) if isinstance(v, float) else v) for k, v in row.items() if k != RUN_TIME)
                   for row in dicts), key=repr)


def day_partitions(store) -> dict[str, list]:
    """Every batch view's rows of the day."""
    return {view.batch_table: rounded(store.read(view.batch_table).where(f"date = DATE'{DAY}'").collect())
            for view in VIEWS}


def served(settings) -> list[list[tuple]]:
    return [rounded(rows) for rows in served_day(settings)]


def test_a_batch_rerun_that_fills_the_disk_leaves_the_previous_partitions_served(spark, filled_then_freed, small_disk):
    settings, generated = filled_then_freed.settings, filled_then_freed.generated
    assert filled_then_freed.restarted.returncode == 0, filled_then_freed.restarted.stderr[-4000:]
    store = open_store(settings, spark)
    run_batch(settings, DAY, store)
    partitions, before = day_partitions(store), served(settings)
    versions = {table: store.version(table) for table in partitions}

    # Something else fills the disk, then the day is batched again (a retry, a restatement).
    stat = os.statvfs(small_disk)
    ballast = small_disk / "ballast"
    with ballast.open("wb") as handle:
        handle.write(b"\0" * (stat.f_bavail * stat.f_frsize - BATCH_ROOM_KIB * 1024))
    try:
        failed = lambdalake(settings, "batch", "--date", DAY.isoformat())
        path = one_line_error(failed, settings)
        assert path.is_relative_to(settings.lakehouse_dir)
        rewritten = [table for table in partitions if store.version(table) > versions[table]]
        assert len(rewritten) < len(partitions), "the batch finished; the test proves nothing"
        assert day_partitions(store) == partitions and served(settings) == before
        assert_every_table_whole(settings, store)
    finally:
        ballast.unlink()

    rerun = lambdalake(settings, "batch", "--date", DAY.isoformat())
    assert rerun.returncode == 0, rerun.stderr[-4000:]
    revenue, payments = served_day(settings)
    assert {r["source"] for r in revenue} == {r["source"] for r in payments} == {"batch"}
    assert [(r["window_start"], r["category"], float(r["revenue"]), int(r["orders"]), int(r["unique_buyers"]))
            for r in read_truth(generated, "revenue_by_category_5m")] == \
        [(iso(r["window_start"]), r["category"], r["revenue"], r["orders"], r["unique_buyers"]) for r in revenue]
    truth_payments = sorted(read_truth(generated, "order_payments"), key=lambda r: r["order_id"])
    assert [(r["order_id"], r["status"], r["payment_id"] or None, r["pay_time"] or None, float(r["amount"]))
            for r in truth_payments] == \
        [(r["order_id"], r["status"], r["payment_id"], iso(r["pay_time"]), r["amount"]) for r in payments]
    assert day_partitions(store) == partitions
    assert_every_line_once(store, generated.ledger)
    assert_every_table_whole(settings, store)
