"""The Delta lakehouse store: one interface (:class:`LakehouseStore`); delta-spark writes the
pipeline's tables, delta-rs reads them all and writes the ops tables (one writing engine per table)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from include.config import Settings
from include.lakehouse.base import (
    CommitConflictError,
    CommitInfo,
    LakehouseError,
    LakehouseStore,
    TableFile,
    TableNotFound,
    Txn,
)

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession

    from include.lakehouse.delta_rs import DeltaRsStore
    from include.lakehouse.delta_spark import DeltaSparkStore


def all_tables(lakehouse: Path) -> list[str]:
    """Every Delta table under ``lakehouse``, by name (``speed/order_payments``)."""
    return sorted(str(log_dir.parent.relative_to(lakehouse)) for log_dir in lakehouse.rglob("_delta_log"))


def open_store(settings: Settings, spark: SparkSession | None = None) -> DeltaSparkStore:
    """The pipeline's store: delta-spark (without ``spark``, a session is started only when an
    operation needs one)."""
    from include.lakehouse.delta_spark import DeltaSparkStore
    from include.spark import get_spark

    return DeltaSparkStore(spark if spark is not None else (lambda: get_spark(settings)), settings.lakehouse_dir,
                           commit_retries=settings.commit_retries, backoff_seconds=settings.commit_backoff_seconds)


def open_reader(settings: Settings) -> DeltaRsStore:
    """The store of processes without a JVM (serving, ``status``, ``doctor``, the sensors, the
    notifier, the supervisor): delta-rs reads every table and writes only the ops tables."""
    from include.lakehouse.delta_rs import DeltaRsStore

    return DeltaRsStore(settings.lakehouse_dir, commit_retries=settings.commit_retries,
                        backoff_seconds=settings.commit_backoff_seconds)


__all__ = [
    "CommitConflictError",
    "CommitInfo",
    "LakehouseError",
    "LakehouseStore",
    "TableFile",
    "TableNotFound",
    "Txn",
    "open_reader",
    "open_store",
]
