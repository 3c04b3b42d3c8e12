"""The Delta lakehouse store: one interface (:class:`LakehouseStore`), two engines."""

from __future__ import annotations

from typing import TYPE_CHECKING

from include.config import Settings
from include.lakehouse.base import (
    CommitConflictError,
    CommitInfo,
    LakehouseError,
    LakehouseStore,
    Rewrite,
    TableFile,
    TableNotFound,
    Txn,
)

if TYPE_CHECKING:
    from pathlib import Path

    from pyspark.sql import SparkSession


def all_tables(lakehouse: Path) -> list[str]:
    """Every Delta table under ``lakehouse``, by name (``speed/order_payments``)."""
    return sorted(str(log_dir.parent.relative_to(lakehouse)) for log_dir in lakehouse.rglob("_delta_log"))


def open_store(settings: Settings, spark: SparkSession | None = None, engine: str | None = None) -> LakehouseStore:
    """The store for ``settings`` (engine from configuration unless given). Without ``spark``,
    a session is started only when an operation needs one."""
    from include.spark import delta_spark_unavailable_reason, get_spark, resolve_engine

    engine = engine or resolve_engine(settings)
    options = dict(
        spark=spark if spark is not None else (lambda: get_spark(settings)),
        root=settings.lakehouse_dir,
        commit_retries=settings.commit_retries,
        backoff_seconds=settings.commit_backoff_seconds,
    )
    if engine == "delta-rs":
        from include.lakehouse.delta_rs import DeltaRsStore

        return DeltaRsStore(**options)
    if engine == "delta-spark":
        reason = delta_spark_unavailable_reason(settings)
        if reason:
            raise LakehouseError(f"lakehouse engine 'delta-spark' cannot run here: {reason}")
        from include.lakehouse.delta_spark import DeltaSparkStore

        return DeltaSparkStore(**options)
    raise ValueError(f"lakehouse engine must be 'delta-rs' or 'delta-spark', got '{engine}'")


__all__ = [
    "CommitConflictError",
    "CommitInfo",
    "LakehouseError",
    "LakehouseStore",
    "Rewrite",
    "TableFile",
    "TableNotFound",
    "Txn",
    "open_store",
]
