"""The nightly batch for one event-time day: recompute, reconcile, mark covered."""

from __future__ import annotations

import logging
from datetime import date

from batch_layer.coverage import bronze_fingerprint, mark_covered
from batch_layer.reconcile import reconcile_day
from batch_layer.recompute import recompute_day
from include import tables
from include.config import Settings
from include.lakehouse import LakehouseError, LakehouseStore, open_store
from include.spark import get_spark

log = logging.getLogger(__name__)


def run_batch(settings: Settings, day: date, store: LakehouseStore | None = None) -> list[dict]:
    """Rebuild ``day``'s batch views from Bronze, reconcile them with the speed views and mark
    the day batch-covered. Idempotent. Returns the reconciliation rows."""
    store = store or open_store(settings, get_spark(settings, app_name="lambdalake-batch"))
    if not store.exists(tables.bronze("orders")):
        raise LakehouseError(f"no Bronze data in {settings.lakehouse_dir}: run `lambdalake stream` first")
    fingerprint = bronze_fingerprint(store, settings, day)  # before reading: later arrivals make it stale
    written = recompute_day(store, settings, day)
    log.info("batch %s: views rebuilt %s", day, written)
    reconciliation = reconcile_day(store, day)
    mark_covered(store, day, fingerprint)
    log.info("batch %s: covered", day)
    return reconciliation
