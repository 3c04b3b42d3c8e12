"""Rows a view's step keeps in memory from one micro-batch to the next (:meth:`PassStep.held`).

A step that would otherwise read the same rows back from the lake every micro-batch (the orders a
payment may still pay, the payments waiting for their order) holds them here instead: a DuckDB
table in this process's memory, indexed by its key, so a lookup or a change costs the rows it
touches, not the rows held. The step bounds what it holds (it takes out what no on-time event can
change any more) and says how to fill it in a new process from the lake, so a restart or a
replayed micro-batch starts from what the lake holds as of that micro-batch.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Sequence
from typing import Any

import duckdb
import pyarrow as pa

from include import ddl
from include.lakehouse.base import sql_literal

# Values per IN list in a lookup.
IN_LIST_SLICE = 1000
# Rows taken at least, and more than are held, before the table is rebuilt.
REBUILD_AFTER = 100_000
# Every HeldRows, so that its database is closed and let go at exit, not destroyed during the interpreter's shutdown.
_ALL: weakref.WeakSet[HeldRows] = weakref.WeakSet()


class HeldRows:
    """Rows of ``fields`` held in memory, one per value of ``key``."""

    def __init__(self, fields: str, key: str) -> None:
        self.schema, self.key = ddl.arrow_schema(fields), key
        self.through: int | None = None  # the last micro-batch whose step changed them (PassStep.held)
        self._taken = 0  # rows taken since the table was last rebuilt
        self._db = duckdb.connect(":memory:")
        self._lock = threading.Lock()
        self._run("SET TimeZone = 'UTC'")
        self._run("SET threads = 1")  # the pass runs its steps in parallel threads
        _ALL.add(self)
        self._db.register("_rows", self.schema.empty_table())
        self._run("CREATE TABLE held AS SELECT * FROM _rows")
        self._db.unregister("_rows")
        self._run(f"CREATE UNIQUE INDEX held_key ON held ({key})")

    def _rebuild(self) -> None:
        """An in-memory DuckDB keeps the rows a delete left behind (it never checkpoints); a copy
        of the live rows, once as many were taken as are held, keeps memory to the rows held. (An
        update leaves nothing behind: it changes no key, so it is done in place.)"""
        self._run("BEGIN TRANSACTION")
        self._run("CREATE TABLE fresh AS SELECT * FROM held")
        self._run("DROP TABLE held")
        self._run("ALTER TABLE fresh RENAME TO held")
        self._run(f"CREATE UNIQUE INDEX held_key ON held ({self.key})")
        self._run("COMMIT")
        self._taken = 0

    def __len__(self) -> int:
        with self._lock:
            return self._run("SELECT count(*) FROM held")[0][0]

    def get(self, column: str, values: Sequence[Any]) -> pa.Table:
        """The held rows whose ``column`` is one of ``values``."""
        return self._concat([self._select(where) for where in _in_lists(column, values)])

    def put(self, rows: pa.Table) -> None:
        """Hold ``rows``, each in place of the held row of its key."""
        if rows.num_rows == 0:
            return
        rows = rows.select(self.schema.names).cast(self.schema)
        numbered = pa.table({"key": rows.column(self.key), "row": pa.array(range(rows.num_rows), pa.int64())})
        last = numbered.group_by("key").aggregate([("row", "max")]).column("row_max")
        if len(last) < rows.num_rows:  # one row per key: the last
            rows = rows.take(last)
        replaced = ", ".join(f"{name} = excluded.{name}" for name in self.schema.names if name != self.key)
        on_conflict = f"DO UPDATE SET {replaced}" if replaced else "DO NOTHING"  # a key alone: held already
        with self._lock:
            self._db.register("_rows", rows)
            self._run(f"INSERT INTO held SELECT * FROM _rows ON CONFLICT ({self.key}) {on_conflict}")
            self._db.unregister("_rows")

    def take(self, where: str) -> pa.Table:
        """Stop holding the rows matching SQL ``where`` (DuckDB's), and give them."""
        with self._lock:
            taken = self._db.sql(f"DELETE FROM held WHERE {where} RETURNING *").to_arrow_table()
            self._taken += taken.num_rows
            if self._taken > max(REBUILD_AFTER, self._run("SELECT count(*) FROM held")[0][0]):
                self._rebuild()
        return taken.cast(self.schema)

    def take_matching(self, column: str, values: Sequence[Any]) -> pa.Table:
        """Stop holding the rows whose ``column`` is one of ``values``, and give them."""
        return self._concat([self.take(where) for where in _in_lists(column, values)])

    def _concat(self, parts: list[pa.Table]) -> pa.Table:
        return pa.concat_tables(parts) if parts else self.schema.empty_table()

    def _run(self, sql: str) -> list[tuple]:
        return self._db.execute(sql).fetchall()

    def _select(self, where: str) -> pa.Table:
        with self._lock:
            return self._db.sql(f"SELECT * FROM held WHERE {where}").to_arrow_table().cast(self.schema)


def _in_lists(column: str, values: Sequence[Any]) -> list[str]:
    """``column IN (...)`` conditions, :data:`IN_LIST_SLICE` values each, that together match ``values``."""
    values = list(values)
    return [f"{column} IN ({', '.join(map(sql_literal, values[start:start + IN_LIST_SLICE]))})"
            for start in range(0, len(values), IN_LIST_SLICE)]


@atexit.register
def _close_all() -> None:
    # The stream's callbacks (and so their HeldRows) live on in the JVM gateway until the
    # interpreter's shutdown; a database still referenced then is reported as leaked on stderr.
    for rows in list(_ALL):
        rows._db.close()
        rows._db = None


__all__ = ["HeldRows"]
