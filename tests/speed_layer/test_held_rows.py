"""Held rows: one per key (the last given wins), looked up by any column, taken out by a
condition or by values, and the same rows after the table is rebuilt to let go of what deletes
left behind."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa

from include.lakehouse.base import sql_literal
from speed_layer import held_rows
from speed_layer.held_rows import HeldRows

FIELDS = "order_id string, order_time timestamp, paid boolean"


def orders(*rows):
    return pa.table({"order_id": [row[0] for row in rows],
                     "order_time": pa.array([datetime(2026, 11, 20, 10, row[1], tzinfo=timezone.utc) for row in rows],
                                            pa.timestamp("us", "UTC")),
                     "paid": [row[2] for row in rows]})


def by_id(table):
    return {row["order_id"]: (row["order_time"].minute, row["paid"]) for row in table.to_pylist()}


def test_one_row_per_key_looked_up_taken_and_rebuilt(monkeypatch):
    monkeypatch.setattr(held_rows, "REBUILD_AFTER", 1)
    monkeypatch.setattr(held_rows, "IN_LIST_SLICE", 2)
    held = HeldRows(FIELDS, "order_id")
    held.put(orders(("o1", 1, False), ("o2", 2, False), ("o1", 3, False)))  # the last o1 wins
    held.put(orders(("o2", 2, True), ("o4", 4, False), ("o5", 5, False)))  # o2 replaced
    assert by_id(held.get("order_id", ["o1", "o2", "o3", "o4", "o5"])) == {
        "o1": (3, False), "o2": (2, True), "o4": (4, False), "o5": (5, False)}
    cut = datetime(2026, 11, 20, 10, 4, tzinfo=timezone.utc)
    assert by_id(held.take(f"order_time <= {sql_literal(cut)}")) == {
        "o1": (3, False), "o2": (2, True), "o4": (4, False)}
    assert len(held) == 1 and held._taken == 0  # more taken than held: rebuilt
    held.put(orders(("o5", 5, True), ("o6", 6, False)))
    assert by_id(held.get("paid", [True])) == {"o5": (5, True)}
    assert held.get("order_id", []).num_rows == 0
    assert by_id(held.take_matching("order_id", ["o6", "o7", "o5"])) == {"o5": (5, True), "o6": (6, False)}
    assert len(held) == 0 and held.take_matching("order_id", []).num_rows == 0
