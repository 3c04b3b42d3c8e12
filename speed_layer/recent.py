"""The on-time events of recent micro-batches that the pass's steps read again (``Speed.recent``:
the readings an anomaly looks back at, the orders of a window still open), kept on the driver.

What a step reads before micro-batch N is a rule on Silver: the topic's rows of batches below N,
not late, with an event time after N's watermark minus the topic's horizon. The memory holds what
that rule reads (and, until trimmed, a little more, which :meth:`RecentEvents.before` leaves
out); a new process, or a replay after a crash, reads it back from Silver. It is bounded like
Spark's state was: by the horizon plus the watermark delay of event time.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from include import tables
from include.lakehouse import LakehouseStore
from include.registry import ViewSpec, sql_time


def horizons(views: list[ViewSpec]) -> dict[str, timedelta]:
    """Per topic, the longest ``Speed.recent`` of ``views``."""
    longest: dict[str, timedelta] = {}
    for view in views:
        for topic, horizon in view.speed.recent.items():
            longest[topic] = max(horizon, longest.get(topic, horizon))
    return longest


class RecentEvents:
    """Per topic, the on-time events of earlier micro-batches within its horizon."""

    def __init__(self, store: LakehouseStore, horizons: dict[str, timedelta]) -> None:
        self.store, self.horizons = store, horizons
        self._kept: dict[str, list[pa.Table]] = {topic: [] for topic in horizons}
        self._through: int | None = None  # the last micro-batch they include

    def before(self, batch_id: int, watermarks: dict[str, datetime | None], columns: dict[str, pa.Schema]
               ) -> dict[str, pa.Table]:
        """Per topic, its events of the batches before ``batch_id`` after the watermark at
        arrival minus the horizon, as ``columns`` (the step's events' schema) give them."""
        if self._through != batch_id - 1:
            self._read_back(batch_id, watermarks, columns)
        found = {}
        for topic, horizon in self.horizons.items():
            watermark = watermarks.get(topic)
            parts = [part.select(columns[topic].names).cast(columns[topic]) for part in self._kept[topic]]
            kept = pa.concat_tables(parts) if parts else columns[topic].empty_table()
            if watermark is not None:
                since = pa.scalar(watermark - horizon, kept["event_time"].type)
                kept = kept.filter(pc.greater(kept["event_time"], since))
                self._kept[topic] = [kept]  # trimmed: a later watermark is never earlier
            found[topic] = kept
        return found

    def add(self, batch_id: int, events: dict[str, pa.Table]) -> None:
        """The micro-batch's on-time events, once it is committed."""
        for topic in self.horizons:
            if topic in events and events[topic].num_rows:
                self._kept[topic].append(events[topic])
        self._through = batch_id

    def _read_back(self, batch_id: int, watermarks: dict[str, datetime | None], columns: dict[str, pa.Schema]
                   ) -> None:
        for topic, horizon in self.horizons.items():
            watermark, table = watermarks.get(topic), tables.silver(topic)
            self._kept[topic] = []
            if watermark is None or not self.store.exists(table):  # no earlier batch had the topic
                continue
            where = (f"batch_id < {batch_id} AND NOT is_late AND event_time > {sql_time(watermark - horizon)}")
            self._kept[topic] = [self.store.select_arrow(table, columns[topic].names, where)]
        self._through = batch_id - 1


__all__ = ["RecentEvents", "horizons"]
