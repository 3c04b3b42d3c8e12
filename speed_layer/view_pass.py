"""The views ingest computes itself, in the micro-batch it already holds (the one-pass speed layer).

A view whose rows add up (:class:`include.registry.Partials`) needs no streaming query: the
definition runs on the micro-batch's on-time events alone, and its partial rows are merged into
the speed table (``merged="write"``: with the stored rows of the keys they touch) or appended
(``merged="read"``). A view with ``provisional`` rows (orders ``pending`` until paid) gets them here
too, a micro-batch before its own query could. Every write carries ingest's transaction id
``(speed_ingest, batch_id)``: a replayed micro-batch computes the same partials from the same
events, and a table that has its commit already is skipped, so it merges nothing twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore, Txn
from include.registry import ViewContext, ViewSpec, best_per_key, column_names, merged_partials, replaces_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class ViewPass:
    """The speed rows of ``views`` from one micro-batch: :meth:`writes` gives one function per
    table, for ingest to run beside its own writes."""

    def __init__(self, settings: Settings, store: LakehouseStore, views: list[ViewSpec]) -> None:
        self.settings, self.store = settings, store
        self.computed = [view for view in views if view.in_ingest_pass]
        self.provisional = [view for view in views if view.speed.provisional and not view.in_ingest_pass]
        for view in [*self.computed, *self.provisional]:
            store.ensure_table(view.speed_table, view.speed_schema, ["date"], tables.MERGED_TABLE_PROPERTIES)

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics whose on-time events the pass reads."""
        return tuple(dict.fromkeys(topic for view in [*self.computed, *self.provisional] for topic in view.inputs))

    def writes(self, events: Callable[[str], DataFrame], fed: set[str], txn: Txn) -> list[Callable[[], None]]:
        """``events(topic)``: the topic's on-time events of the micro-batch (typed fields, event and
        arrival time); ``fed``: the topics that have any (the views reading none of them are left out)."""
        def inputs(view: ViewSpec) -> dict[str, DataFrame]:
            return {topic: events(topic) for topic in view.inputs}

        computed = [lambda view=view: self._add_partials(view, inputs(view), txn)
                    for view in self.computed if fed.intersection(view.inputs)]
        early = [lambda view=view: self._store_provisional(view, inputs(view), txn)
                 for view in self.provisional if fed.intersection(view.inputs)]
        return computed + early

    def _add_partials(self, view: ViewSpec, inputs: dict[str, DataFrame], txn: Txn) -> None:
        store, columns = self.store, column_names(view.speed_fields)
        if store.is_committed(view.speed_table, txn):
            return
        partial = view.define(inputs, ViewContext(self.settings, exact=False)).select(*columns)
        if view.speed.partials.merged == "read":
            store.append(view.speed_table, partial, txn)
            return
        rows = partial.toArrow()
        if rows.num_rows == 0:
            return
        stored = store.select_arrow(view.speed_table, columns, self._touched(view, rows))
        if stored.num_rows:  # merge with the stored partials of the same keys (a small local job)
            both = pa.concat_tables([rows, stored.cast(rows.schema)])
            rows = merged_partials(view, partial.sparkSession.createDataFrame(both, schema=view.speed_schema)).toArrow()
        store.merge(view.speed_table, rows, view.merge_on, txn)

    @staticmethod
    def _touched(view: ViewSpec, rows: pa.Table) -> str:
        """SQL selecting the stored rows that may share a key with ``rows``: within their days
        and range of key time (the table's file statistics skip the rest)."""
        days = ", ".join(f"'{day}'" for day in pc.unique(rows.column("date")).to_pylist())
        extremes = pc.min_max(rows.column(view.key_time))
        low, high = (extremes[end].as_py().strftime("%Y-%m-%dT%H:%M:%S.%fZ") for end in ("min", "max"))
        return (f"date IN ({days}) AND {view.key_time} >= CAST('{low}' AS TIMESTAMP) "
                f"AND {view.key_time} <= CAST('{high}' AS TIMESTAMP)")

    def _store_provisional(self, view: ViewSpec, inputs: dict[str, DataFrame], txn: Txn) -> None:
        rows = view.speed.provisional(inputs).select(*column_names(view.fields))
        update_when = None
        if view.speed.precedence is not None:
            rows = best_per_key(rows, view.keys, view.speed.precedence)
            update_when = replaces_sql(view.speed.precedence)
        self.store.merge(view.speed_table, rows.toArrow(), view.merge_on, txn, update_when)


__all__ = ["ViewPass"]
