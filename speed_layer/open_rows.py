"""A window view's open rows, held in memory by the pass (the speed table's hot files).

A view whose partials are merged when written (``revenue_by_category_5m``, ``traffic_by_page_10m``,
``device_health_5m``) changes only rows whose window is still open: an on-time event comes after
its topic's watermark, so it falls in no window that ends at or before it. So the pass keeps each
day's open rows in one file it rewrote itself, and holds that file's rows in memory. A
micro-batch's partials are merged with the held rows of their keys (DuckDB), and one commit
replaces that file with a new one of the rows still open plus one of the rows the watermark has
just closed, which nothing rewrites again. No read of the table, no Delta merge.

Which files a micro-batch replaces comes from the table's log, not from memory: those of its days
whose key times overlap the partials'. A file this process did not write (after a restart, or one
a compaction wrote) is read once; a closed row an on-time event should never reach would be found
and merged all the same. Memory holds the open rows only: a file is let go once it is replaced or
no longer in the table.

Exactly once: the commit carries ingest's transaction id; a replayed micro-batch the table has
committed is skipped, and one it has not sees the same files and computes the same rows.
"""

from __future__ import annotations

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
        into the table; rows whose window ends at or before ``closed_by`` go to a file of their own."""
        view, columns = self.view, column_names(self.view.speed_fields)
        partials = partials.select(columns).cast(self.schema)
        removed: list[TableFile] = []

        def plan(files: list[TableFile]) -> Rewrite:
            nonlocal removed
            self.held = {file.path: self.held[file.path] for file in files if file.path in self.held}
            removed = self._touched(files, partials, self.held)
            unread = [file for file in removed if file.path not in self.held]
            parts = [self.held[file.path] for file in removed if file.path in self.held]
            if unread:
                parts.append(self.store.read_files(view.speed_table, unread).select(columns).cast(self.schema))
            stored = pa.concat_tables(parts) if parts else self.schema.empty_table()
            same_key = key_match(stored, partials, list(view.keys))
            merged = merge(pa.concat_tables([partials, stored.filter(same_key)])).select(columns).cast(self.schema)
            rows = pa.concat_tables([stored.filter(pc.invert(same_key)), merged])
            closed = self._closed(rows, closed_by)
            return Rewrite(removed=removed, rows=[rows.filter(pc.invert(closed)), rows.filter(closed)])

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

    def _touched(self, files: list[TableFile], partials: pa.Table, held: dict[str, pa.Table]) -> list[TableFile]:
        """The files a micro-batch replaces: of the days of ``partials``, those whose key times
        overlap theirs (all without statistics), and the held ones (the day's open rows, which
        a window that opens after them would otherwise leave behind)."""
        days = {None if day is None else str(day) for day in pc.unique(partials.column("date")).to_pylist()}
        extremes = pc.min_max(partials.column(self.view.key_time))
        low, high = extremes["min"].as_py(), extremes["max"].as_py()

        def overlaps(file: TableFile) -> bool:
            return None in (file.low, file.high, low, high) or (file.low <= high and file.high >= low)

        return [file for file in files if file.partition.get("date") in days and (file.path in held or overlaps(file))]


def key_match(stored: pa.Table, rows: pa.Table, keys: list[str]) -> pa.ChunkedArray:
    """Which of ``stored`` have the keys of some of ``rows`` (a mask; joined on the keys and a row
    number: Arrow joins carry no struct or binary columns)."""
    numbered = stored.select(keys).append_column("_row", pa.array(range(stored.num_rows), pa.int64()))
    matched = numbered.join(rows.select(keys), keys, join_type="left semi").column("_row")
    return pa.chunked_array([pc.is_in(pa.array(range(stored.num_rows), pa.int64()), matched.combine_chunks())])


__all__ = ["OpenRows"]
