"""Shared fixtures: one SparkSession for the whole run, a fresh lambdalake home per test, a
throwaway Airflow home."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from include.config import Settings, load_settings
from include.generator import GenerationResult
from include.spark import cached_spark_jars, get_spark
from include.spark_jars import main as spark_jars_main

# Airflow reads its configuration when first imported: point it at a throwaway home first.
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="lambdalake-airflow-"))
os.environ.update({
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).resolve().parents[1] / "dags"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    # No connection and no PATH entry for Spark: the DAGs must find both themselves.
})


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    subprocess.run([Path(sys.executable).parent / "airflow", "db", "migrate"], check=True, capture_output=True)
    return AIRFLOW_HOME


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The one session, with the fetched Spark packages (fetched now if `make install` has not)
    and Delta's extension."""
    settings = load_settings(
        home=tmp_path_factory.mktemp("spark-home"),
        spark_master="local[2]",
        shuffle_partitions=2,
        spark_driver_memory="2g",
    )
    if not cached_spark_jars(settings):
        spark_jars_main(["--into", str(settings.spark_jars_dir)])
    session = get_spark(settings, app_name="lambdalake-tests")
    # py4j says "Closing down clientserver connection" at INFO as Python exits, after pytest has
    # closed the stream Airflow's logging set up for the root logger ("--- Logging error ---").
    logging.getLogger("py4j").setLevel(logging.WARNING)
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
def streamed_lake(spark, tmp_path_factory: pytest.TempPathFactory) -> StreamedLake:
    """A three-hour day (2026-11-20) streamed through the two order views and not yet batched,
    with the generator's result. Tests that batch, serve or stream on work on a copy (``copy_to``)."""
    from include.generator import TrafficOptions, generate
    from speed_layer.runner import run_stream

    # The order views are what the batch reconciles and the tests check; the others stay out.
    settings = load_settings(home=tmp_path_factory.mktemp("streamed") / "home", spark_master="local[2]",
                             shuffle_partitions=2, max_files_per_trigger=4,
                             speed_views="revenue_by_category_5m,order_payments")
    # Hour-long micro-batches keep the stream short; late events land beyond one of them.
    options = TrafficOptions(orders_per_hour=120, late_fraction=0.05, duplicate_fraction=0.02,
                             corrupt_fraction=0.01, late_beyond=timedelta(hours=1))
    result = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), 3, options, seed=5, file_minutes=15,
                      progress=False)
    run_stream(settings, available_now=True)
    return StreamedLake(settings, result)


@dataclass(frozen=True)
class StreamedLake:
    settings: Settings
    result: GenerationResult  # ledger and ground truth

    def copy_to(self, home: Path) -> Settings:
        """This lake's home copied to ``home``; settings that differ only in the home. The copy
        can stream on: Spark's file source logs the landed files it took by absolute path in the
        checkpoints, so the copy's logs are made to name the copy's landing files."""
        shutil.copytree(self.settings.home, home, symlinks=True)
        copy = self.settings.model_copy(update={"home": home})
        taken, moved = f"file:{self.settings.landing_dir}/", f"file:{copy.landing_dir}/"
        for log in copy.checkpoints_dir.glob("*/sources/*/*"):
            log.write_text(log.read_text().replace(taken, moved))
        return copy


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def kafka(tmp_path_factory):
    """Apache Kafka's own broker (KRaft, one node, as docker-compose.yml runs it), from Maven
    Central through include/jvm/kafka-broker.pom.xml; a :class:`include.kafka_broker.KafkaBroker`."""
    from include.kafka_broker import KafkaBroker, broker_unavailable_reason

    reason = broker_unavailable_reason()
    if reason:
        print(f"SKIP Kafka broker: {reason}")
        pytest.skip(f"Kafka broker: {reason}")
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def kafka_broker(kafka) -> str:
    """The session's Kafka broker's address, HOST:PORT."""
    return kafka.bootstrap_servers
