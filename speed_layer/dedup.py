"""Ingest's deduplication on the driver (``LAMBDALAKE_PASS_ENGINE=duckdb``): the ids of the events
Silver took within the dedup window, kept in the driver's memory instead of Spark's state store,
so the ingest query keeps no streaming state.

The rule: a valid event of micro-batch N is a copy if its ``(topic, event_id)`` is in Silver with
a ``batch_id`` below N and an ``ingested_at`` at most ``LAMBDALAKE_DEDUP_WINDOW`` before N's, or
comes after its first copy in N by :data:`include.views.rules.FIRST_COPY_ORDER`. The memory holds
exactly what that rule reads; a new process, or a replay of a micro-batch after a crash, reads it
back from Silver (the rows of earlier micro-batches only), so a replay keeps the same copies.
"""

from __future__ import annotations

from collections import deque
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from include import tables
from include.lakehouse import LakehouseStore
from include.registry import sql_time
from include.views.rules import first_copy_rows

SEPARATOR = "\x1f"  # between topic and event id in a key: in neither


class SeenEvents:
    """The dedup's state: when each recent event id was ingested, by micro-batch."""

    def __init__(self, store: LakehouseStore, topics: tuple[str, ...], window: timedelta) -> None:
        self.store, self.topics, self.window = store, topics, window
        self._ingested: dict[str, datetime] = {}  # key -> when its latest first copy was ingested
        self._batches: deque[tuple[datetime, list[str]]] = deque()  # (ingested_at, keys) per micro-batch
        self._through: int | None = None  # the last micro-batch the state includes

    def first_copies(self, rows: pa.Table, batch_id: int) -> pa.Table:
        """``rows`` (a micro-batch: ``topic``, ``event_id``, ``rejected``, ``ingested_at`` and the
        columns of :data:`FIRST_COPY_ORDER`) without the copies of events already kept; rejected
        lines all stay. Call :meth:`keep` once the micro-batch is committed."""
        if rows.num_rows == 0:
            return rows
        now = rows["ingested_at"][0].as_py()  # the micro-batch's time: a replay has the same
        if self._through != batch_id - 1:
            self._read_back(batch_id, now)
        self._forget(now - self.window)
        numbered = rows.append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
        valid = numbered.filter(pc.invert(numbered["rejected"]))
        valid = valid.append_column("_key", pc.binary_join_element_wise(valid["topic"], valid["event_id"], SEPARATOR))
        firsts = valid.take(first_copy_rows(valid, "_key"))
        # The memory holds the window's ids only (forgotten above).
        first = [row for row, key in zip(firsts["_row"].to_pylist(), firsts["_key"].to_pylist())
                 if key not in self._ingested]
        kept = sorted(first + numbered.filter(numbered["rejected"])["_row"].to_pylist())  # in the batch's order
        return rows.take(pa.array(kept, pa.int64()))

    def keep(self, rows: pa.Table, batch_id: int) -> None:
        """Add the micro-batch's kept events (:meth:`first_copies`' rows) once it is committed."""
        if rows.num_rows:
            valid = rows.filter(pc.invert(rows["rejected"]))
            self._add(rows["ingested_at"][0].as_py(),
                      pc.binary_join_element_wise(valid["topic"], valid["event_id"], SEPARATOR).to_pylist())
        self._through = batch_id

    def _add(self, at: datetime, keys: list[str]) -> None:
        for key in keys:
            self._ingested[key] = at
        self._batches.append((at, keys))

    def _forget(self, before: datetime) -> None:
        while self._batches and self._batches[0][0] < before:
            at, keys = self._batches.popleft()
            for key in keys:
                if self._ingested.get(key) == at:
                    del self._ingested[key]

    def _read_back(self, batch_id: int, now: datetime) -> None:
        """The state as the rule reads it before ``batch_id``, from Silver."""
        self._ingested.clear()
        self._batches.clear()
        where = f"batch_id < {batch_id} AND ingested_at >= {sql_time(now - self.window)}"
        parts = []
        for topic in self.topics:
            if self.store.exists(tables.silver(topic)):
                part = self.store.select_arrow(tables.silver(topic), ["event_id", "ingested_at"], where)
                parts.append(part.append_column("topic", pa.array([topic] * part.num_rows, pa.string())))
        if parts:
            stored = pa.concat_tables(parts).sort_by("ingested_at")
            keys = pc.binary_join_element_wise(stored["topic"], stored["event_id"], SEPARATOR).to_pylist()
            batch: list[str] = []
            for key, at, following in zip(keys, stored["ingested_at"].to_pylist(),
                                          [*stored["ingested_at"].to_pylist()[1:], None]):
                batch.append(key)
                if following != at:  # one micro-batch's rows share its ingested_at
                    self._add(at, batch)
                    batch = []
        self._through = batch_id - 1


__all__ = ["SeenEvents"]
