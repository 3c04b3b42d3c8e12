"""What a crash (or a full disk) can leave behind: the stream refuses it and points at
`lambdalake doctor`, which says what it would repair; `--repair` does it and the stream then
continues exactly-once. What it cannot repair safely it leaves, and says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from exactly_once import assert_every_line_once

from include import tables
from include.config import load_settings
from include.doctor import ABANDONED_AFTER_SECONDS
from include.generator import TrafficOptions, generate
from speed_layer.runner import StreamFailed, run_stream

LAMBDALAKE = Path(sys.executable).parent / "lambdalake"
pytestmark = pytest.mark.slow


def doctor(settings, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([LAMBDALAKE, "doctor", "--home", settings.home, *options],
                          capture_output=True, text=True, timeout=120)


def left_behind(path: Path, content: bytes = b"") -> Path:
    """A file a writer left before it died, older than a live writer's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    then = time.time() - ABANDONED_AFTER_SECONDS - 60
    os.utime(path, (then, then))
    return path


def newest(folder: Path) -> Path:
    return max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


@pytest.fixture
def lake(spark, tmp_path_factory):
    """An hour streamed in two micro-batches through one view; the generator's ledger."""
    settings = load_settings(home=tmp_path_factory.mktemp("torn") / "home", spark_master="local[2]",
                             shuffle_partitions=2, max_files_per_trigger=1, speed_views="order_payments")
    options = TrafficOptions(orders_per_hour=60, duplicate_fraction=0.03, corrupt_fraction=0.02)
    ledger = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 1, options, seed=4, file_minutes=30,
                      progress=False).ledger
    run_stream(settings, available_now=True)
    return settings, ledger


def test_what_cannot_be_repaired_safely_is_left_for_a_person(streamed_lake, tmp_path):
    copy = streamed_lake.copy_to(tmp_path / "copy")  # the doctor reads files only
    ingest = copy.checkpoints_dir / "speed_ingest"
    older = min((p for p in (ingest / "offsets").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    older.write_text("v1\n{\"batchWate")  # a torn plan, but not the newest
    payments_log = copy.lakehouse_dir / tables.silver("payments") / "_delta_log"
    commit = max(payments_log.glob("*.json"))
    commit.write_bytes(commit.read_bytes()[:40])  # a torn Delta commit
    next((copy.lakehouse_dir / tables.silver("clicks")).rglob("*.parquet")).unlink()  # a data file the table references

    for options in ((), ("--repair",)):
        found = doctor(copy, *options)
        assert found.returncode == 1, found.stderr
        lines = found.stdout.splitlines()
        assert len(lines) == 3 and all(line.endswith("(not repaired here)") for line in lines), found.stdout
        assert "restore the checkpoint" in lines[0] and "torn commit" in found.stdout and "missing" in found.stdout
    assert older.read_text() == "v1\n{\"batchWate" and commit.exists()
    assert "0 need you" not in found.stderr and "3 need you" in found.stderr


def test_torn_checkpoint_files_are_refused_then_repaired_and_the_stream_goes_on_exactly_once(lake):
    settings, ledger = lake
    assert doctor(settings).returncode == 0
    ingest = settings.checkpoints_dir / "speed_ingest"
    orders = settings.lakehouse_dir / tables.silver("orders")
    # The newest commit record torn (the batch ran), a newer plan torn (it never ran), and
    # leftovers of writers that died: temporary files and an empty data file.
    newest(ingest / "commits").write_text("v1\n{\"nextBatchW")
    plan = newest(ingest / "offsets")
    empty_plan = plan.with_name(str(int(plan.name) + 1))
    shutil.copy(plan, empty_plan)
    os.truncate(empty_plan, 0)
    leftovers = [left_behind(orders / "_delta_log" / "_commit_1f0e.json.tmp", b"{\"add\""),
                 left_behind(orders / "date=2026-11-20" / "part-00000-1f0e.c000.snappy.parquet")]
    young = left_behind(orders / "_delta_log" / "_commit_2a1b.json.tmp")
    os.utime(young)  # a live writer's: not touched
    half_written = left_behind(ingest / "offsets" / ".2.1f0e.tmp", b"v1\n{")

    # Spark names one torn file (or only a JSON error): the stream's error names both.
    with pytest.raises(StreamFailed, match=r"torn checkpoint files: .*lambdalake doctor --home") as failed:
        run_stream(settings, available_now=True)
    assert str(newest(ingest / "commits")) in str(failed.value) and str(empty_plan) in str(failed.value)
    assert not half_written.exists()  # the stream removes its own logs' temporary files

    found = doctor(settings)
    assert found.returncode == 1
    lines = found.stdout.splitlines()
    assert len(lines) == 4 and all(line.endswith("(--repair deletes it)") for line in lines), found.stdout
    assert "commit record is torn" in found.stdout and "plan is torn or empty and the batch never ran" in found.stdout
    assert "4 found, 4 repairable with --repair" in found.stderr

    repaired = doctor(settings, "--repair")
    assert repaired.returncode == 0 and "repaired 4 of 4" in repaired.stderr, repaired.stderr
    assert all(line.endswith("(deleted)") for line in repaired.stdout.splitlines())
    assert not any(path.exists() for path in leftovers) and young.exists()
    assert doctor(settings).stderr.startswith("ok: ")

    store = run_stream(settings, available_now=True)  # the torn batch again: nothing twice
    assert_every_line_once(store, ledger)
