"""Shared fixtures: one SparkSession for the whole run, a fresh lambdalake home per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from include.config import Settings, load_settings
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
