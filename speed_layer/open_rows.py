"""A window view's open rows, held in memory by the pass (the speed table's hot files).

A view whose partials are merged when written (``revenue_by_category_5m``, ``traffic_by_page_10m``,
``device_health_5m``) changes only rows whose window is still open: an on-time event comes after
its topic's watermark, so it falls in no window that ends at or before it. So the pass keeps each
window's rows in a file of its own that it wrote itself, and holds the open windows' rows in
memory. A micro-batch's partials are merged with the held rows of their keys (DuckDB), and one
commit replaces the files of the windows they fall in with new ones. No read of the table, no
Delta merge, and a micro-batch rewrites the windows it touches only, however many are open (the
watermark delay keeps several open at once).

Which files a micro-batch replaces comes from the table's log, not from memory: those of its days
whose key times overlap the partials'. A file this process did not write (after a restart, or one
a compaction wrote) is read once; a closed row an on-time event should never reach would be found
and merged all the same. Memory holds the open windows only: a file is let go once it is replaced,
no longer in the table, or all its rows have closed.

Exactly once: the commit carries ingest's transaction id; a replayed micro-batch the table has
committed is skipped, and one it has not sees the same files and computes the same rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from include import ddl
from include.lakehouse import LakehouseStore, Rewrite, TableFile, Txn
from include.registry import ViewSpec, column_names


class OpenRows:
    """The open rows of ``view``'s speed table that this process holds (``held``, by file)."""

    def __init__(self, store: LakehouseStore, view: ViewSpec) -> None:
        self.store, self.view = store, view
        self.schema = ddl.arrow_schema(view.speed_fields)
        self.held: dict[str, pa.Table] = {}

    def add(self, partials: pa.Table, merge: Callable[[pa.Table], pa.Table], closed_by: datetime | None,
            txn: Txn) -> None:
        """Merge a micro-batch's ``partials`` (one row per key; ``merge``: a key's rows into one)
        into the table, a file per window; rows whose window ends at or before ``closed_by`` are
        no longer held."""
        view, columns = self.view, column_names(self.view.speed_fields)
        partials = partials.select(columns).cast(self.schema)
        removed: list[TableFile] = []

        def plan(files: list[TableFile]) -> Rewrite:
            nonlocal removed
            self.held = {file.path: self.held[file.path] for file in files if file.path in self.held}
            removed = self._touched(files, partials)
            unread = [file for file in removed if file.path not in self.held]
            parts = [self.held[file.path] for file in removed if file.path in self.held]
            if unread:
                parts.append(self.store.read_files(view.speed_table, unread).select(columns).cast(self.schema))
            stored = pa.concat_tables(parts) if parts else self.schema.empty_table()
            same_key = key_match(stored, partials, list(view.keys))
            merged = merge(pa.concat_tables([partials, stored.filter(same_key)])).select(columns).cast(self.schema)
            rows = pa.concat_tables([stored.filter(pc.invert(same_key)), merged])
            return Rewrite(removed=removed, rows=self._per_window(rows))

        written = self.store.rewrite(view.speed_table, view.key_time, plan, txn)
        gone = {file.path for file in removed}
        self.held = {path: rows for path, rows in self.held.items() if path not in gone}
        self.held |= {path: rows.select(columns).cast(self.schema) for path, rows in written}
        # A file all of whose rows have closed (another day's, which no partials touch) is let go.
        self.held = {path: rows for path, rows in self.held.items()
                     if not pc.all(self._closed(rows, closed_by)).as_py()}

    def _closed(self, rows: pa.Table, closed_by: datetime | None) -> pa.ChunkedArray:
        if closed_by is None or rows.num_rows == 0:
            return pa.chunked_array([pa.array([False] * rows.num_rows, pa.bool_())])
        ends = rows.column(self.view.closes_at)
        return pc.less_equal(ends, pa.scalar(closed_by, ends.type)).fill_null(False)

    def _per_window(self, rows: pa.Table) -> list[pa.Table]:
        """``rows`` split by their key time (a window's start): a table, so a file, per window."""
        times = rows.column(self.view.key_time)
        return [rows.filter(pc.equal(times, time)) for time in pc.unique(times)] if rows.num_rows else []

    def _touched(self, files: list[TableFile], partials: pa.Table) -> list[TableFile]:
        """The files a micro-batch replaces: of the days of ``partials``, those whose key times
        overlap theirs (all without statistics). Held files are read from memory."""
        days = {None if day is None else str(day) for day in pc.unique(partials.column("date")).to_pylist()}
        times = sorted(pc.unique(partials.column(self.view.key_time)).drop_null().to_pylist())

        def overlaps(file: TableFile) -> bool:  # one of the partials' windows lies in the file's range
            if file.low is None or file.high is None or not times:
                return True
            first = bisect.bisect_left(times, file.low)
            return first < len(times) and times[first] <= file.high

        return [file for file in files if file.partition.get("date") in days and overlaps(file)]


def key_match(stored: pa.Table, rows: pa.Table, keys: list[str]) -> pa.ChunkedArray:
    """Which of ``stored`` have the keys of some of ``rows`` (a mask; joined on the keys and a row
    number: Arrow joins carry no struct or binary columns)."""
    numbered = stored.select(keys).append_column("_row", pa.array(range(stored.num_rows), pa.int64()))
    matched = numbered.join(rows.select(keys), keys, join_type="left semi").column("_row")
    return pa.chunked_array([pc.is_in(pa.array(range(stored.num_rows), pa.int64()), matched.combine_chunks())])


__all__ = ["OpenRows"]
