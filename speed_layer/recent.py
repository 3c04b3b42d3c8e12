"""The on-time events of recent micro-batches that the pass's steps read again, kept on the
driver: as events (``Speed.recent``: the orders of a window still open) or as running moments of
a look-back (``Speed.lookback``: the readings an anomaly looks back at, :mod:`speed_layer.moments`).

What a step reads before micro-batch N is a rule on Silver: the topic's rows of batches below N,
not late, with an event time after N's watermark minus the topic's horizon. The memory holds what
that rule reads (and, until trimmed, a little more, which :meth:`RecentEvents.before` leaves
out); a new process, or a replay after a crash, reads it back from Silver. It is bounded like
Spark's state was: by the horizon plus the watermark delay of event time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from include import tables
from include.lakehouse import LakehouseStore
from include.registry import Lookback, ViewSpec, sql_time
from speed_layer.moments import Moments

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# A query on Arrow tables named by ``{name}`` placeholders, run by the pass's engine (PassStep.query).
Query = Callable[[str, Mapping[str, pa.Table]], pa.Table]


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
        # Per topic, a part per micro-batch (or read back), with its earliest event time.
        self._kept: dict[str, list[tuple[pa.Table, datetime | None]]] = {topic: [] for topic in horizons}
        self._through: int | None = None  # the last micro-batch they include
        self._moments: dict[Lookback, tuple[Moments, int]] = {}  # and the last micro-batch each includes

    def before(self, batch_id: int, watermarks: dict[str, datetime | None], columns: dict[str, pa.Schema]
               ) -> dict[str, pa.Table]:
        """Per topic, its events of the batches before ``batch_id`` after the watermark at
        arrival minus the horizon, as ``columns`` (the step's events' schema) give them."""
        if self._through != batch_id - 1:
            self._read_back(batch_id, watermarks, columns)
        found = {}
        for topic, horizon in self.horizons.items():
            watermark = watermarks.get(topic)
            if watermark is not None:  # trimmed part by part: one wholly after the horizon is not copied
                since, kept = watermark - horizon, []
                for part, earliest in self._kept[topic]:
                    if earliest is not None and earliest <= since:
                        part, earliest = _part(_after(part, since))
                    if part.num_rows:
                        kept.append((part, earliest))
                self._kept[topic] = kept
            schema = columns[topic]
            parts = [part if part.schema == schema else part.select(schema.names).cast(schema)
                     for part, _ in self._kept[topic]]
            found[topic] = pa.concat_tables(parts) if parts else schema.empty_table()
        return found

    def add(self, batch_id: int, events: dict[str, pa.Table]) -> None:
        """The micro-batch's on-time events, once it is committed."""
        for topic in self.horizons:
            if topic in events and events[topic].num_rows:
                self._kept[topic].append(_part(events[topic]))
        self._through = batch_id

    def moments(self, lookback: Lookback, batch_id: int, watermark: datetime | None, events: pa.Table,
                query: Query) -> pa.Table:
        """``events`` (micro-batch ``batch_id``'s on-time events of the look-back's topic) with
        ``lookback_count``, ``lookback_sum`` and ``lookback_squares`` (DECIMAL(38,0)) over the
        same entity's on-time events of this and earlier micro-batches within the look-back's span."""
        kept, through = self._moments.pop(lookback, (None, None))
        if through != batch_id - 1:  # a new process, or a replay: read back from Silver
            kept = Moments(lookback.span // timedelta(microseconds=1))
            earlier = self._read_back_topic(lookback.topic, batch_id, watermark, lookback.span, events.schema.names)
            if earlier is not None and earlier.num_rows:
                kept.add(*_valued(lookback, earlier.select(events.schema.names).cast(events.schema), query)[1:])
        if watermark is not None:  # no later on-time event looks back before the watermark's span
            kept.forget((watermark - lookback.span - EPOCH) // timedelta(microseconds=1))
        events, *fresh = _valued(lookback, events, query)
        kept.add(*fresh)
        count, total, squares = kept.window(*fresh[:2])
        self._moments[lookback] = (kept, batch_id)
        decimal = pa.decimal128(38, 0)
        for name, column in (("lookback_count", count), ("lookback_sum", total), ("lookback_squares", squares)):
            column = pa.array(column.tolist(), decimal) if column.dtype == object else pa.array(column).cast(decimal)
            events = events.append_column(name, column)
        return events

    def _read_back(self, batch_id: int, watermarks: dict[str, datetime | None], columns: dict[str, pa.Schema]
                   ) -> None:
        for topic, horizon in self.horizons.items():
            rows = self._read_back_topic(topic, batch_id, watermarks.get(topic), horizon, columns[topic].names)
            self._kept[topic] = [] if rows is None or rows.num_rows == 0 else [_part(rows)]
        self._through = batch_id - 1

    def _read_back_topic(self, topic: str, batch_id: int, watermark: datetime | None, horizon: timedelta,
                         columns: list[str]) -> pa.Table | None:
        """The rule on Silver: the topic's on-time events of batches before ``batch_id`` after
        ``watermark`` minus ``horizon`` (None when no earlier batch had the topic)."""
        table = tables.silver(topic)
        if watermark is None or not self.store.exists(table):
            return None
        where = f"batch_id < {batch_id} AND NOT is_late AND event_time > {sql_time(watermark - horizon)}"
        return self.store.select_arrow(table, columns, where)


def _part(events: pa.Table) -> tuple[pa.Table, datetime | None]:
    """Kept events with their earliest event time."""
    return events, pc.min(events["event_time"]).as_py()


def _after(events: pa.Table, since: datetime) -> pa.Table:
    """``events`` with an event time after ``since``."""
    return events.filter(pc.greater(events["event_time"], pa.scalar(since, events["event_time"].type)))


def _valued(lookback: Lookback, events: pa.Table, query: Query) -> tuple[pa.Table, pa.Array, np.ndarray, pa.Array]:
    """``events`` as ``query`` returns them (in its order), with each one's entity, time in
    microseconds and the look-back's value, computed as the view's definition computes it."""
    valued = query(f"SELECT *, {lookback.value} AS lookback_value FROM {{events}}", {"events": events})
    micros = pc.cast(valued["event_time"].cast(pa.timestamp("us", "UTC")), pa.int64()).to_numpy()
    return (valued.drop_columns(["lookback_value"]), valued[lookback.entity].combine_chunks(), micros,
            valued["lookback_value"].combine_chunks())


__all__ = ["Query", "RecentEvents", "horizons"]
