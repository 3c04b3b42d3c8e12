"""Batch coverage: which days the serving layer takes from the batch views, from which run, and
which are stale.

A day is covered once its views are written (the coverage row is committed last, in one commit).
The row fingerprints the Bronze input the run read (rows per topic and event day, from the Delta
log's statistics); when Bronze later holds more rows for those days, the day is stale and a new
``lambdalake batch --date`` restates it. Shared by the batch layer (writes), serving and
``status`` (reads).

The row also publishes the run: the Delta version of every table it wrote for the day
(:func:`published_tables`), taken when it completes. A rerun of a covered day first marks the
row (``rerun_started_at``) and only then replaces partitions, so serving knows which days'
partitions may hold an unpublished run and reads those at the version their last completed run
recorded (:class:`Publication`): a run that fails part-way is never seen, and a run that
completes appears whole, in the one commit that publishes it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.lakehouse.base import log_entry, sql_literal
from include.registry import column_names
from include.views import VIEWS, days_read


def input_days(store: LakehouseStore, settings: Settings, day: date) -> dict[str, list[date]]:
    """Per topic, the event days some view reads to rebuild ``day`` (:func:`days_read`, a whole
    history as the days landed in Bronze)."""
    days, whole = days_read(settings, day)
    for topic in whole:
        landed = (d for d in bronze_row_counts(store, topic) if d is not None and d <= day)
        days.setdefault(topic, set()).update(landed)
    return {topic: sorted(read) for topic, read in days.items()}


def bronze_row_counts(store: LakehouseStore, topic: str) -> dict[date | None, int]:
    """Bronze rows of a topic per event day."""
    table = tables.bronze(topic)
    return store.partition_row_counts(table, "event_date") if store.exists(table) else {}


def bronze_fingerprint(store: LakehouseStore, settings: Settings, day: date) -> dict[str, int]:
    """Bronze rows per input topic and event day that the day's views read."""
    fingerprint = {}
    for topic, days in input_days(store, settings, day).items():
        counts = bronze_row_counts(store, topic)
        for needed in days:
            fingerprint[f"{topic}:{needed.isoformat()}"] = counts.get(needed, 0)
    return fingerprint


def published_tables() -> list[str]:
    """The tables a nightly run replaces the day's partition of, which its coverage row publishes:
    every batch view, reconciliation and the tables of differences."""
    return ([view.batch_table for view in VIEWS] + [tables.RECONCILIATION]
            + [view.differences.table for view in VIEWS if view.differences])


def _coverage_rows(store: LakehouseStore, where: str | None = None) -> list[dict[str, Any]]:
    store.ensure_table(tables.BATCH_COVERAGE, tables.BATCH_COVERAGE_SCHEMA)  # adds columns an older one lacks
    return store.select_arrow(tables.BATCH_COVERAGE, column_names(tables.BATCH_COVERAGE_FIELDS), where).to_pylist()


def _write_coverage_row(store: LakehouseStore, row: dict[str, Any]) -> None:
    written = pa.Table.from_pylist([row], schema=tables.arrow_schema(tables.BATCH_COVERAGE_FIELDS))
    store.merge(tables.BATCH_COVERAGE, written, ["date"])


def mark_rerun_started(store: LakehouseStore, day: date) -> bool:
    """Before a run replaces any partition of a covered day: mark its coverage row, so serving
    keeps the day at its published versions until this run publishes. False: the day is not
    covered (nothing is served from its batch side yet, nothing to hold back)."""
    if not store.exists(tables.BATCH_COVERAGE):
        return False
    rows = _coverage_rows(store, f"date = {sql_literal(day)}")
    if not rows:
        return False
    if rows[0]["rerun_started_at"] is None:  # an earlier unfinished rerun's mark stays: it came first
        _write_coverage_row(store, {**rows[0], "rerun_started_at": datetime.now(timezone.utc)})
    return True


def mark_covered(store: LakehouseStore, day: date, fingerprint: dict[str, int], run_id: str | None = None) -> None:
    """Publish the run: the day covered, with the version of each table it wrote (their latest:
    the run's own commits, and at most other days' or a compaction's, which leave this day's rows
    as they are) and no rerun pending."""
    store.ensure_table(tables.BATCH_COVERAGE, tables.BATCH_COVERAGE_SCHEMA)
    covered_at = datetime.now(timezone.utc)
    versions = {table: store.version(table) for table in published_tables() if store.exists(table)}
    _write_coverage_row(store, {
        "date": day, "covered_at": covered_at, "bronze_rows": json.dumps(fingerprint, sort_keys=True),
        "run_id": run_id or f"batch__{covered_at.strftime('%Y-%m-%dT%H:%M:%SZ')}",
        "table_versions": json.dumps(versions, sort_keys=True), "rerun_started_at": None,
    })


@dataclass(frozen=True)
class Publication:
    """What serving reads of each published table: the newest version a completed run recorded,
    except the partitions of days a later run has begun to replace without publishing, read at
    the version their own last completed run recorded."""

    versions: Mapping[str, int] = field(default_factory=dict)
    held_back: Mapping[str, Mapping[date, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> Publication:
        """From coverage rows (a row written before runs recorded versions adds nothing: its
        day is read at whatever the others publish, or the latest)."""
        versions: dict[str, int] = {}
        held_back: dict[str, dict[date, int]] = {}
        for row in rows:
            for table, version in json.loads(row.get("table_versions") or "{}").items():
                versions[table] = max(version, versions.get(table, -1))
                if row.get("rerun_started_at") is not None:
                    held_back.setdefault(table, {})[row["date"]] = version
        return cls(versions, held_back)

    def version(self, table: str) -> int | None:
        """The version to read ``table`` at (None: no run has published it, its latest)."""
        return self.versions.get(table)

    def days_held_back(self, table: str) -> dict[date, int]:
        """Days whose partition comes from an older version than :meth:`version`, and that version."""
        newest = self.versions.get(table)
        return {day: version for day, version in self.held_back.get(table, {}).items() if version != newest}


def same_rows_until(table_path: str, version: int) -> tuple[int, bool]:
    """The newest version reached from ``version`` through commits that change no rows (a
    compaction: every file added or removed with ``dataChange`` false), and whether that is
    final (the next commit changes rows; False: there is none yet). Serving follows them, so a
    published version whose files a compaction replaced is not read from files vacuum deletes."""
    while True:
        try:
            text = log_entry(table_path, version + 1).read_text(encoding="utf-8")
        except FileNotFoundError:
            return version, False
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
        rearranged = all(
            set(action) <= {"commitInfo", "add", "remove"}
            and all(not change.get("dataChange", True) for kind, change in action.items() if kind != "commitInfo")
            for action in actions)
        if not rearranged:
            return version, True
        version += 1


def coverage_runs(store: LakehouseStore) -> list[dict[str, Any]]:
    """Per covered day: the run served (``run_id``, ``covered_at``) and ``rerun_started_at`` of a
    later run that has not published (None: none)."""
    if not store.exists(tables.BATCH_COVERAGE):
        return []
    # A table an older version made lacks the newer columns.
    present = pa.schema(DeltaTable(store.path(tables.BATCH_COVERAGE)).schema().to_arrow()).names
    wanted = [name for name in ("date", "covered_at", "run_id", "rerun_started_at") if name in present]
    rows = store.select_arrow(tables.BATCH_COVERAGE, wanted).to_pylist()
    return sorted(({"run_id": None, "rerun_started_at": None, **row} for row in rows), key=lambda row: row["date"])


def covered_days(store: LakehouseStore) -> dict[date, dict[str, int]]:
    """Covered days and the Bronze fingerprint each was built from."""
    if not store.exists(tables.BATCH_COVERAGE):
        return {}
    rows = store.select_arrow(tables.BATCH_COVERAGE, ["date", "bronze_rows"]).to_pylist()
    return {row["date"]: json.loads(row["bronze_rows"]) for row in rows}


def stale_days(store: LakehouseStore, settings: Settings) -> list[date]:
    """Covered days whose Bronze input has changed since they were built."""
    return sorted(
        day for day, built_from in covered_days(store).items()
        if bronze_fingerprint(store, settings, day) != built_from
    )
