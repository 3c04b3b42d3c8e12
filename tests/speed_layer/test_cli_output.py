"""What a person sees from `lambdalake stream --available-now`: progress lines (no terminal here),
the totals, and none of Spark's start-up noise unless --verbose asks."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from include.generator import TrafficOptions, generate

LAMBDALAKE = Path(sys.executable).parent / "lambdalake"
NOISE = ("NativeCodeLoader", "log4j", "incubator", "setLogLevel", "WARN ", "nanobind")
pytestmark = pytest.mark.slow


def stream(settings, *options: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAMBDALAKE_")}
    env.update(LAMBDALAKE_SPARK_MASTER="local[2]", LAMBDALAKE_SHUFFLE_PARTITIONS="2",
               LAMBDALAKE_MAX_FILES_PER_TRIGGER="2",
               LAMBDALAKE_SPEED_VIEWS="order_payments")  # what is printed, not the views, is the point
    return subprocess.run([LAMBDALAKE, "stream", "--available-now", "--home", settings.home, *options],
                          env=env, capture_output=True, text=True, timeout=600)


def test_quiet_by_default_with_progress_lines_then_verbose_on_request(settings):
    generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 1, TrafficOptions(orders_per_hour=60),
             seed=3, file_minutes=30, progress=False)
    landed = len(list(settings.landing_dir.glob("*/*.jsonl")))

    quiet = stream(settings)
    assert quiet.returncode == 0, quiet.stderr
    progress = [line for line in quiet.stderr.splitlines() if line.startswith("ingest: ")]
    assert progress and progress[-1].startswith(f"ingest: {landed}/{landed} files, ")
    assert progress[-1].endswith(" events/s")
    assert not [word for word in NOISE if word in quiet.stderr], quiet.stderr
    assert quiet.stdout.splitlines()[0].split()[:2] == ["topic", "bronze"]
    assert "NativeCodeLoader" in (settings.run_dir / "spark.log").read_text()  # kept, not lost

    verbose = stream(settings, "--verbose")  # nothing new landed: start, find nothing, stop
    assert verbose.returncode == 0, verbose.stderr
    assert "NativeCodeLoader" in verbose.stderr
    assert "ingest: 0/0 files" in verbose.stderr
