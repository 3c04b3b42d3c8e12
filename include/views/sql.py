"""Views declared as Spark SQL, which both engines run: Spark (the batch layer, a backlog) as it
is, DuckDB (a small micro-batch on the driver) transpiled by sqlglot.

A definition that returns SQL text reads its inputs as ``{topic}`` placeholders. Spark binds
them to the input DataFrames (``spark.sql(text, topic=df)``); DuckDB reads Arrow tables of
those names. The few Spark functions DuckDB lacks, or that sqlglot translates loosely, are
given to it here: the DataSketches HLL functions (the ``datasketches`` package writes and reads
Spark's sketch format, so sketches from either engine merge), ``timestamp_seconds``,
``timestamp_millis``, ``timestamp_micros``, ``unix_seconds`` (which truncates) and ``max_by`` /
``min_by`` (whose value may be null).
"""

from __future__ import annotations

import atexit
import math
import re
import threading
import uuid
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING

import pyarrow as pa  # at import: DuckDB reads the functions' annotations

if TYPE_CHECKING:
    import duckdb
    from pyspark.sql import DataFrame

PLACEHOLDER = re.compile(r"\{(\w+)\}")
# Spark's ``date_format`` patterns the views use, as DuckDB's ``strftime`` (``%g``: milliseconds).
DATE_FORMATS = {"yyyy-MM-dd'T'HH:mm:ss.SSS'Z'": "%Y-%m-%dT%H:%M:%S.%gZ"}


def spark_rows(sql: str, inputs: Mapping[str, DataFrame]) -> DataFrame:
    """The SQL run by Spark on the input DataFrames. Inputs of several sessions (a stream's
    micro-batch has its own, a lookup read from a table the main one) meet as global temporary
    views, which every session of the application sees; the plan holds them once analysed."""
    given = {name: inputs[name] for name in set(PLACEHOLDER.findall(sql))}
    session = next(iter(given.values())).sparkSession
    if all(frame.sparkSession is session for frame in given.values()):
        return session.sql(sql, **given)
    names = {name: f"lambdalake_{name}_{uuid.uuid4().hex}" for name in given}
    for name, frame in given.items():
        frame.createGlobalTempView(names[name])
    try:
        return session.sql(PLACEHOLDER.sub(lambda match: f"global_temp.{names[match[1]]}", sql))
    finally:
        for name in names.values():
            session.catalog.dropGlobalTempView(name)


@lru_cache(maxsize=256)
def duckdb_sql(sql: str) -> str:
    """The Spark SQL in DuckDB's dialect: ``{topic}`` read as a table of that name, and Spark's
    aggregate sketch functions as DuckDB's ``list`` aggregate under a scalar function."""
    import sqlglot
    from sqlglot import exp

    def rewrite(node: exp.Expression) -> exp.Expression | None:
        if isinstance(node, exp.Hint):  # Spark's join hints; DuckDB plans its own joins
            return None
        if isinstance(node, (exp.ArgMax, exp.ArgMin)):  # DuckDB's arg_max skips a null value; Spark's max_by keeps it
            name = "arg_max_null" if isinstance(node, exp.ArgMax) else "arg_min_null"
            return exp.Anonymous(this=name, expressions=[node.this, node.expression])
        if isinstance(node, exp.UnixSeconds):  # sqlglot's CAST(EPOCH(t) AS BIGINT) rounds; Spark truncates
            return exp.Anonymous(this="spark_unix_seconds", expressions=[node.this])
        if isinstance(node, exp.TimeToStr) and node.args["format"].this in _date_formats():
            return exp.Anonymous(this="strftime", expressions=[node.this, exp.Literal.string(
                _date_formats()[node.args["format"].this])])
        if isinstance(node, exp.Anonymous) and node.name.lower() in ("hll_sketch_agg", "hll_union_agg"):
            values, *rest = node.expressions
            scalar = "hll_sketch_of" if node.name.lower() == "hll_sketch_agg" else "hll_union_of"
            return exp.Anonymous(this=scalar, expressions=[exp.Anonymous(this="list", expressions=[values]),
                                                            *rest[:1]])
        return node

    tree = sqlglot.parse_one(PLACEHOLDER.sub(r"\1", sql), read="spark").transform(rewrite)
    return tree.sql(dialect="duckdb")


@lru_cache(maxsize=1)
def _date_formats() -> dict[str, str]:
    """:data:`DATE_FORMATS` by the format sqlglot reads from Spark's pattern (it leaves ``SSS``
    and quoted letters unconverted)."""
    import sqlglot

    return {sqlglot.parse_one(f'date_format(t, "{spark}")', read="spark").args["format"].this: duckdb
            for spark, duckdb in DATE_FORMATS.items()}


def duckdb_rows(sql: str, inputs: Mapping[str, pa.Table], connection: duckdb.DuckDBPyConnection | None = None
                ) -> pa.Table:
    """The SQL run by DuckDB on Arrow tables named by the placeholders (by default on the calling
    thread's connection: making one, with its functions, costs more than a small query)."""
    con = connection or _thread_connection()
    names = set(PLACEHOLDER.findall(sql))
    for name in names:
        con.register(name, inputs[name])
    try:
        return con.sql(duckdb_sql(sql)).to_arrow_table()
    finally:
        for name in names:  # a registered table holds its Arrow data
            con.unregister(name)


_threads = threading.local()
# Every thread's connection, also held here: a thread's end then never runs DuckDB's destructor.
# Run there, it may overlap the interpreter's shutdown (a py4j callback thread, the landing
# reader's), and a C++ destructor interrupted by it aborts the process. Connections of ended
# threads are closed when a thread makes a new one, the rest at exit.
_connections: dict[int, tuple[threading.Thread, duckdb.DuckDBPyConnection]] = {}
_connections_lock = threading.Lock()


def _thread_connection() -> duckdb.DuckDBPyConnection:
    if not hasattr(_threads, "connection"):
        _threads.connection = duckdb_connection()
        with _connections_lock:
            for ident, (thread, connection) in list(_connections.items()):
                if not thread.is_alive():
                    connection.close()
                    del _connections[ident]
            _connections[threading.get_ident()] = (threading.current_thread(), _threads.connection)
    return _threads.connection


@atexit.register
def _close_connections() -> None:
    with _connections_lock:
        for _, connection in _connections.values():
            connection.close()
        _connections.clear()


def duckdb_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB on UTC and one thread (steps run in parallel threads), with the Spark
    functions the views use that DuckDB lacks."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'; SET threads = 1")
    con.execute("CREATE MACRO timestamp_seconds(s) AS to_timestamp(s); "
                "CREATE MACRO timestamp_millis(ms) AS make_timestamptz(ms * 1000); "
                "CREATE MACRO timestamp_micros(us) AS make_timestamptz(us); "
                "CREATE MACRO spark_unix_seconds(t) AS CAST(floor(epoch(t)) AS BIGINT)")
    con.create_function("hll_sketch_of", _sketches, ["VARCHAR[]", "INTEGER"], "BLOB", type="arrow")
    con.create_function("hll_union_of", _unions, ["BLOB[]", "BOOLEAN"], "BLOB", type="arrow")
    con.create_function("hll_sketch_estimate", _estimates, ["BLOB"], "BIGINT", type="arrow")
    return con


def _sketches(values: pa.Array, lg_k: pa.Array) -> pa.Array:
    """Per row, an HLL sketch of a list of strings (Spark's ``hll_sketch_agg``: HLL_8)."""
    import datasketches

    out = []
    for ids, k in zip(values.to_pylist(), lg_k.to_pylist()):
        sketch = datasketches.hll_sketch(k, datasketches.tgt_hll_type.HLL_8)
        for value in ids:
            if value is not None:
                sketch.update(value)
        out.append(sketch.serialize_compact())
    return pa.array(out, pa.binary())


def _unions(values: pa.Array, allow_different_k: pa.Array) -> pa.Array:
    """Per row, the union of a list of sketches (Spark's ``hll_union_agg``), as HLL_8."""
    import datasketches

    out = []
    for parts in values.to_pylist():
        sketches = [datasketches.hll_sketch.deserialize(part) for part in parts if part is not None]
        union = datasketches.hll_union(max((sketch.lg_config_k for sketch in sketches), default=12))
        for sketch in sketches:
            union.update(sketch)
        out.append(union.get_result(datasketches.tgt_hll_type.HLL_8).serialize_compact())
    return pa.array(out, pa.binary())


def _estimates(values: pa.Array) -> pa.Array:
    """Per row, a sketch's estimate rounded as Spark's ``hll_sketch_estimate`` rounds it."""
    import datasketches

    sketches = [None if part is None else datasketches.hll_sketch.deserialize(part) for part in values.to_pylist()]
    return pa.array([None if sketch is None else math.floor(sketch.get_estimate() + 0.5) for sketch in sketches],
                    pa.int64())
