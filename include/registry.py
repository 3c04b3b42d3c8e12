"""The view registry's vocabulary: what a Gold view declares so every layer can run it.

A view is one definition (Spark SQL over ``{topic}`` placeholders, or DataFrames -> DataFrame)
with its :class:`ViewSpec` declared on it (:func:`view`), in its family's module of
:mod:`include.views`. The speed layer, batch recompute, reconciliation, coverage, nightly data
quality, serving, ``status`` and the nightly DAG's assets loop over :data:`include.views.VIEWS`;
none of them names a view.

DAG files import the registry while Airflow parses them, so nothing here imports pyspark until a
schema is asked for: columns are declared as ``"name type, …"`` and metrics as SQL.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Literal, Protocol

from include import ddl

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from include.config import Settings
    from include.lakehouse import Txn

def column_names(fields: str) -> list[str]:
    """The names of ``"name type, name type"``."""
    return ddl.names(fields)


def struct(fields: str) -> StructType:
    """A StructType (fields nullable unless declared NOT NULL) from ``"name type, name type"``."""
    return ddl.spark_schema(fields)


# A row prefix ("", "s.", "t.") -> SQL sort keys, best row first (ascending, nulls last).
Precedence = Callable[[str], list[str]]


def best_per_key(rows: DataFrame, keys: Sequence[str], precedence: Precedence) -> DataFrame:
    """One row per ``keys``: the first by ``precedence``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = [F.expr(key).asc_nulls_last() for key in precedence("")]
    rank = F.row_number().over(Window.partitionBy(*keys).orderBy(*order))
    return rows.withColumn("_rank", rank).where("_rank = 1").drop("_rank")


def best_per_key_sql(rows: str, keys: Sequence[str], precedence: Precedence, columns: Sequence[str]) -> str:
    """:func:`best_per_key` in SQL: ``columns`` of the best row per ``keys`` of the query ``rows``."""
    order = ", ".join(f"{key} ASC NULLS LAST" for key in precedence(""))
    return (f"SELECT {', '.join(columns)} FROM (SELECT *, row_number() OVER (PARTITION BY {', '.join(keys)} "
            f"ORDER BY {order}) AS _rank FROM ({rows}) AS _rows) AS _ranked WHERE _rank = 1")


def replaces_sql(precedence: Precedence) -> str:
    """The merge condition under which a new row (``s.``) replaces the stored one (``t.``): it
    comes first by ``precedence``, the same order :func:`best_per_key` keeps."""
    new, stored = precedence("s."), precedence("t.")
    earlier = []
    for i, (s, t) in enumerate(zip(new, stored)):
        ties = [f"({a} IS NOT DISTINCT FROM {b})" for a, b in zip(new[:i], stored[:i])]
        earlier.append(" AND ".join([*ties, f"({s} < {t} OR ({s} IS NOT NULL AND {t} IS NULL))"]))
    return " OR ".join(f"({condition})" for condition in earlier)


@dataclass(frozen=True)
class ViewContext:
    """What a definition may depend on besides its inputs."""

    settings: Settings
    # True in the batch layer (full history, exact distinct counts, every join window closed);
    # False in the speed layer (micro-batches, approximations where state would be unbounded).
    exact: bool


@dataclass(frozen=True)
class Differences:
    """Rows on which the layers disagree (e.g. orders paid by a payment that arrived after the
    watermark, alerts the stream missed), kept in their own table and counted by reconciliation."""

    table: str
    extra_fields: str  # columns besides the view's own, ``"name type, …"``
    # the view's spec -> Spark SQL over ``{speed}`` and ``{batch}`` (the day's rows of each layer,
    # the view's columns) selecting the differing rows, the differences' columns in order
    rows: Callable[[ViewSpec], str]
    metrics: Mapping[str, str]  # reconciliation metric -> SQL aggregate over those rows
    # False: the rows are not view rows (e.g. one per order of an aggregate); ``extra_fields``
    # are all their columns, ``date date`` last.
    view_fields: bool = True


@dataclass(frozen=True)
class Partials:
    """How a view's rows add up (a monoid, as Summingbird has it): the definition run on any part
    of its input gives *partial* rows, and the partial rows of one key merge into the row the
    whole input gives. The speed layer runs the definition on each micro-batch alone, so it keeps
    no streaming state; the batch layer runs it on the whole day."""

    # column -> SQL aggregate over a key's partial rows (Spark SQL; for ``merged="read"`` also
    # serving's DuckDB). Columns not listed belong to the key (e.g. ``window_end``, ``date``).
    merge: Mapping[str, str]
    # "write": the partials are merged into the stored row when written (one row per key; state
    # that stays small per key). "read": they are appended, and readers merge a key's rows (state
    # that grows with the window, e.g. the list of the orders counted).
    merged: Literal["write", "read"] = "write"


@dataclass(frozen=True)
class Lookback:
    """A look-back an ``incremental`` step needs statistics of: for each on-time event of
    ``topic``, the count, sum and sum of squares of ``value`` over the same ``entity``'s on-time
    events in ``[event_time - span, event_time)`` (the window ``PARTITION BY entity ORDER BY
    unix_micros(event_time) RANGE BETWEEN span PRECEDING AND 1 PRECEDING``): both layers compute
    that window; the ingest pass over the micro-batch's events and the span before them in Silver
    (:meth:`PassStep.lookback`)."""

    topic: str
    entity: str
    value: str  # Spark SQL of an exact integer of the event (a DECIMAL(38,0)), as the definition writes it
    span: timedelta

    @property
    def window(self) -> str:
        """The window the batch computes the statistics over (Spark SQL)."""
        return (f"PARTITION BY {self.entity} ORDER BY unix_micros(event_time) "
                f"RANGE BETWEEN {self.span // timedelta(microseconds=1)} PRECEDING AND 1 PRECEDING")


def sql_time(instant: datetime) -> str:
    """A UTC instant as a SQL timestamp both engines and DataFusion read."""
    return f"CAST('{instant.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}' AS TIMESTAMP)"



class PassStep(Protocol):
    """One micro-batch as the ingest pass hands it to a view's ``incremental`` function
    (speed_layer/view_pass.py), as Spark DataFrames of the micro-batch's session. Its reads see
    the tables as the micro-batch found them: a view's state is its speed table and Silver, read
    by Spark, never rows kept in the driver."""

    settings: Settings

    def events(self, topic: str) -> DataFrame:
        """The topic's on-time events of the micro-batch (of those since the view last ran, for
        a view on an interval of its own): typed fields, ``event_time``, ``arrived_at`` and
        ``ingested_at`` (their micro-batch's time)."""

    def watermark(self, topic: str, after: bool = False) -> datetime | None:
        """The topic's watermark when the micro-batch arrived (``after``: with its events counted)."""

    def stored(self, table: str) -> DataFrame:
        """A table of the lake as the micro-batch found it (a speed table: the view's state)."""

    def earlier(self, topic: str, where: str) -> DataFrame:
        """The topic's events of earlier micro-batches (the columns of :meth:`events`) matching
        SQL ``where``, read from Silver: on-time ones, unless a dimension reads the topic."""

    def lookback(self, lookback: Lookback) -> DataFrame:
        """The micro-batch's events of the look-back's topic (the columns of :meth:`events`) with
        ``lookback_count``, ``lookback_sum`` and ``lookback_squares`` (DECIMAL(38,0)) over the
        same entity's on-time events within its span, of this and earlier micro-batches."""

    def query(self, sql: str, frames: Mapping[str, DataFrame]) -> DataFrame:
        """Spark SQL over DataFrames named by ``{name}`` placeholders."""


@dataclass(frozen=True)
class Speed:
    """What only the speed layer (and serving, reading its table) needs to know of a view."""

    # Its max in the speed table is never later than the newest event counted (a window's start,
    # not its end): what ``status`` shows when the view's query has no progress to tell.
    freshness_time: str
    # Several rows of one key (in a micro-batch, or a new one and the stored one): the first by
    # these sort keys wins. None: the newest row replaces the stored one.
    precedence: Precedence | None = None
    # A speed row matching this SQL condition deletes its key (a session merged into another).
    tombstone: str | None = None
    # Called with the rows whose key is new to the speed table and the micro-batch's transaction
    # id, before they are stored (a replay calls it again for rows it did not get to store).
    announce: Callable[[Settings, list[dict], Txn], None] | None = None
    # A view whose rows add up (:class:`Partials`): the ingest pass computes it from each
    # micro-batch alone and merges the partial rows, instead of a streaming query of its own.
    partials: Partials | None = None
    # A view whose state is more than a monoid, kept by the ingest pass all the same: given one
    # micro-batch (:class:`PassStep`), the rows to merge into the speed table (by ``precedence``;
    # None: none), its state read back by Spark from the speed table and Silver.
    incremental: Callable[[PassStep], DataFrame | None] | None = None
    # A view kept by a streaming query of its own: its definition over the watermarked feeds, its
    # state in Spark's state store (a stream-stream join's open rows), its rows appended; readers
    # keep the first of a key's rows by ``precedence``.
    stateful_query: bool = False
    # Columns only the speed table keeps, not served (``"name type, …"``): what partial rows merge
    # (a distinct-count sketch, exact sums behind a mean), which the definition gives when
    # ``context.exact`` is False, or what an ``incremental`` step reads back (a session's pages).
    state: str = ""
    # How often the continuous stream updates the view, when less often than its trigger interval
    # will do (None: every trigger). Each micro-batch has a fixed cost on cores all queries share,
    # so a view that need not be fresh to the second leaves them to those that must. Declared on
    # an ``incremental`` view, it also says that its step may run on several micro-batches' events
    # at once (it reads no earlier events, look-back or watermark).
    refresh: timedelta | None = None


@dataclass(frozen=True)
class ViewSpec:
    """Everything the layers need to know about one Gold view; calling it runs its definition.
    Declared on the definition with :func:`view`."""

    name: str  # the SQL name in serving, e.g. ``revenue_by_category_5m``
    inputs: tuple[str, ...]  # topics, each handed to ``define`` as a DataFrame of typed events
    define: Callable[[Mapping[str, DataFrame], ViewContext], DataFrame]
    fields: str  # the stored rows, ``"name type, …"``: served columns plus ``date date`` last
    keys: tuple[str, ...]  # one stored row per key
    key_time: str  # its UTC day decides batch coverage (the merge rule)
    speed: Speed
    # Days after the view's day that an input topic must be read for (e.g. a join window that
    # opens before midnight closes after it).
    lookahead: Mapping[str, Callable[[Settings], timedelta]] = field(default_factory=dict)
    # Days before it likewise (e.g. a session or a look-back that starts before midnight).
    lookbehind: Mapping[str, Callable[[Settings], timedelta]] = field(default_factory=dict)
    metrics: Mapping[str, str] = field(default_factory=dict)  # reconciliation: name -> SQL aggregate
    drift_metrics: tuple[str, ...] = ()  # nightly data quality: speed within the allowed drift
    differences: Differences | None = None
    # "fact": rows of event-time days (the per-day merge rule). "dimension": a state built from
    # its inputs' whole history, late changes included; the batch rebuilds it as of the day's end
    # (stored under that ``date``) and serving takes, per key, the speed row when it changed after
    # the last batch-covered day, else the batch row (:func:`dimension_as_of_sql`). Its ``key_time``
    # is an SQL expression: when the row last changed.
    kind: Literal["fact", "dimension"] = "fact"
    # Dimension views the definition joins, handed to it by name: the speed layer's table as it
    # stands at each micro-batch, or the batch's rebuild for the day.
    lookups: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()  # stored columns that serving does not show
    served_when: str | None = None  # SQL: which stored rows serving shows (e.g. not a tombstone)
    # The definition returns Spark SQL over ``{topic}`` placeholders rather than a DataFrame.
    declared_in_sql: bool = False

    def __post_init__(self) -> None:
        partials = self.speed.partials
        unknown = [name for name in (partials.merge if partials else ()) if name not in column_names(self.speed_fields)]
        if unknown:
            raise ValueError(f"view '{self.name}': its partials merge {unknown}, which are not its columns")
        if self.speed.stateful_query:
            if self.speed.precedence is None or self.lookups or self.in_ingest_pass:
                raise ValueError(f"view '{self.name}': a stateful query's rows are merged when read by their "
                                 "precedence; it looks up no dimension and is not in ingest's pass")
        elif not self.in_ingest_pass and (partials is None or partials.merged != "read" or len(self.inputs) != 1):
            # Its own query keeps no streaming state: each micro-batch's rows are appended.
            raise ValueError(f"view '{self.name}': a view that looks up a dimension needs one input topic and "
                             "partials merged when read (Partials(merged='read'))")
        if self.kind == "fact" and self.key_time not in column_names(self.fields):
            raise ValueError(f"view '{self.name}': a fact view's key_time must be one of its columns, "
                             f"not '{self.key_time}'")

    def __call__(self, inputs: Mapping[str, DataFrame], context: ViewContext) -> DataFrame:
        """The definition's rows; a definition given as Spark SQL (over ``{topic}``) is run on the inputs."""
        rows = self.define(inputs, context)
        if isinstance(rows, str):
            from include.views.sql import spark_rows

            rows = spark_rows(rows, inputs)
        return rows

    def sql(self, context: ViewContext) -> str | None:
        """The definition as Spark SQL over ``{topic}`` placeholders, if it is given so (a pass
        step runs it on the rows it gathers), else None."""
        text = self.define({}, context) if self.declared_in_sql else None
        return text if isinstance(text, str) else None

    @property
    def speed_table(self) -> str:
        return f"speed/{self.name}"

    @property
    def speed_query(self) -> str:
        """The name of the streaming query that keeps the speed table (its metrics' ``query``)."""
        return f"speed_{self.name}"

    @property
    def in_ingest_pass(self) -> bool:
        """Whether ingest computes the view's speed rows in its own micro-batch (speed_layer/view_pass.py):
        its rows add up and it looks up no dimension, or it says how the pass keeps it
        (``incremental``). A view that looks one up keeps a query of its own, which
        ``--available-now`` runs once ingest is done: a backlog's orders are enriched after every
        change in it is applied, not as of their micro-batch."""
        if self.speed.stateful_query:
            return False
        return (self.speed.partials is not None and not self.lookups) or self.speed.incremental is not None

    @property
    def merged_when_read(self) -> bool:
        """Whether the speed table holds several rows of a key, merged by readers
        (:func:`speed_rows_sql`): appended partials, or a stateful query's appended rows."""
        partials = self.speed.partials
        return self.speed.stateful_query or (partials is not None and partials.merged == "read")

    @property
    def runs_on_interval(self) -> bool:
        """Whether the ingest pass may compute the view less often than every micro-batch, on the
        events of the micro-batches since it last ran (speed_layer/view_pass.py): its rows add
        up, or it declares a ``refresh``."""
        return self.in_ingest_pass and (self.speed.partials is not None or self.speed.refresh is not None)

    @property
    def merge_on(self) -> tuple[str, ...]:
        """The columns a speed row is matched on when merged into the speed table: its keys and,
        for a fact view, its key time and day, which never change for a key. From their range
        in a micro-batch the merge skips the files of other times (file statistics), so it
        reads what the watermark keeps open, not the whole day."""
        if self.kind != "fact":
            return self.keys
        return (*self.keys, *[name for name in (self.key_time, "date") if name not in self.keys])

    @property
    def batch_table(self) -> str:
        return f"batch/{self.name}"

    @property
    def schema(self) -> StructType:
        return struct(self.fields)

    @property
    def speed_fields(self) -> str:
        """The speed table's columns: the view's, then the state its partials merge."""
        return f"{self.fields}, {self.speed.state}" if self.speed.state else self.fields

    @property
    def speed_schema(self) -> StructType:
        return struct(self.speed_fields)

    @property
    def differences_fields(self) -> str:
        extra = self.differences.extra_fields
        return f"{self.fields}, {extra}" if self.differences.view_fields else extra

    @property
    def differences_schema(self) -> StructType:
        return struct(self.differences_fields)

    @property
    def columns(self) -> list[str]:
        """The served columns (the stored ones without the ``date`` partition and hidden ones)."""
        return [name for name in column_names(self.fields) if name != "date" and name not in self.hidden]

    @property
    def closes_at(self) -> str | None:
        """The column at or before which a row's window has ended (no on-time event that comes
        after it changes the row), if the view has windows."""
        return "window_end" if "window_end" in self.columns else None

    @property
    def merged_by(self) -> list[str]:
        """The columns that identify the partial rows merged into one (all but the merged)."""
        merge = self.speed.partials.merge if self.speed.partials else {}
        return [name for name in column_names(self.speed_fields) if name not in merge]

    @property
    def compared(self) -> list[str]:
        """The stored columns two layers' rows must agree on."""
        return [name for name in column_names(self.fields) if name != "date"]

    def input_days(self, topic: str, day: date, settings: Settings) -> list[date]:
        """The event days of ``topic`` the batch reads to rebuild ``day`` exactly."""
        def days(reach: Mapping[str, Callable[[Settings], timedelta]]) -> int:
            return math.ceil(reach[topic](settings) / timedelta(days=1)) if topic in reach else 0

        return [day + timedelta(days=n) for n in range(-days(self.lookbehind), days(self.lookahead) + 1)]


def view(**declared: object) -> Callable[[Callable[[Mapping[str, DataFrame], ViewContext], DataFrame]], ViewSpec]:
    """Declare a Gold view on its definition: ``@view(inputs=..., fields=..., keys=..., ...)``
    above ``def name(inputs, context)``; the view is named after the function."""

    def declare(define: Callable[[Mapping[str, DataFrame], ViewContext], DataFrame]) -> ViewSpec:
        return ViewSpec(name=define.__name__, define=define, **declared)

    return declare


def merged_partials(view: ViewSpec, rows: DataFrame) -> DataFrame:
    """A view's partial rows merged, one per key (its speed columns)."""
    from pyspark.sql import functions as F

    types = {field.name: field.dataType for field in view.speed_schema.fields}
    merged = [F.expr(sql).cast(types[name]).alias(name) for name, sql in view.speed.partials.merge.items()]
    return rows.groupBy(*view.merged_by).agg(*merged).select(*column_names(view.speed_fields))


def merged_partials_sql(view: ViewSpec, relation: str) -> str:
    """:func:`merged_partials` as Spark SQL over ``relation`` (a view of simple-typed merged columns)."""
    types = {field.name: field.type for field in ddl.parse(view.speed_fields)}
    merge = view.speed.partials.merge
    # A nested type keeps what the aggregate gives (the max of a struct is that struct).
    items = [(f"CAST({merge[name]} AS {types[name]}) AS {name}" if isinstance(types[name], str)
              else f"{merge[name]} AS {name}") if name in merge else name
             for name in column_names(view.speed_fields)]
    return f"SELECT {', '.join(items)} FROM {relation} GROUP BY {', '.join(view.merged_by)}"


def first_by_precedence_sql(view: ViewSpec, relation: str, columns: list[str]) -> str:
    """``columns`` of the first of each key's rows in ``relation`` by the view's precedence (a
    stateful query's appended rows; Spark SQL and serving's DuckDB alike)."""
    return best_per_key_sql(f"SELECT * FROM {relation}", view.keys, view.speed.precedence, columns)


def combined_sql(view: ViewSpec, relation: str) -> str:
    """:func:`speed_rows_sql` of a view merged when read, over ``relation``, its served columns
    only (serving's DuckDB runs it)."""
    if view.speed.stateful_query:
        return first_by_precedence_sql(view, relation, [name for name in column_names(view.fields)
                                                          if name not in view.hidden])
    merge = view.speed.partials.merge
    merged = [f"{sql} AS {name}" for name, sql in merge.items() if name not in view.hidden]
    return f"SELECT {', '.join([*view.merged_by, *merged])} FROM {relation} GROUP BY {', '.join(view.merged_by)}"


def input_topics(views: list[ViewSpec]) -> tuple[str, ...]:
    """Every topic some view reads, in first-use order."""
    return tuple(dict.fromkeys(topic for view in views for topic in view.inputs))


def state_topics(views: list[ViewSpec]) -> tuple[str, ...]:
    """Topics some dimension reads: a change is state, not a window, so its late events still count."""
    return input_topics([view for view in views if view.kind == "dimension"])


def dimension_as_of_sql(view: ViewSpec, cut: datetime) -> tuple[str, str]:
    """SQL over ``{speed}`` and ``{batch}``: the two layers' rows of a dimension as of ``cut`` (a
    batch-covered day's end): the speed rows that have not changed since, and the batch rows of
    keys the speed has not changed since. Serving shows the second and every speed row changed
    since (``merged_dimension_sql``)."""
    changed = f"{view.key_time} >= {sql_time(cut)}"
    same_key = " AND ".join(f"s.{key} = b.{key}" for key in view.keys)
    return (f"SELECT * FROM {{speed}} WHERE NOT ({changed})",
            # unqualified, the key time's columns are the inner query's (the speed row's)
            f"SELECT * FROM {{batch}} AS b WHERE NOT EXISTS (SELECT 1 FROM {{speed}} AS s WHERE {same_key} "
            f"AND {changed})")


def speed_rows_sql(view: ViewSpec, relation: str) -> str:
    """SQL over ``relation``: a day's speed rows as the view's columns, one per key (partials
    merged when read are merged; of a stateful query's rows, the first by precedence)."""
    if view.speed.stateful_query:
        relation = f"({first_by_precedence_sql(view, relation, column_names(view.fields))})"
    elif view.merged_when_read:
        relation = f"({merged_partials_sql(view, relation)})"
    return f"SELECT {', '.join(column_names(view.fields))} FROM {relation} AS speed_rows"


def rows_that_differ(spec: ViewSpec) -> str:
    """:attr:`Differences.rows`: the rows of keys on which the layers' rows of a view (one
    ``date``) disagree, a missing row included, each with ``difference``: ``only_speed``,
    ``only_batch`` or ``values`` (the batch's row is shown)."""
    keys, columns = spec.keys, column_names(spec.fields)
    values = [name for name in columns if name not in keys]
    differ = " OR ".join(f"b.{name} IS DISTINCT FROM s.{name}" for name in values if name != "date") or "false"
    shown = ", ".join(f"coalesce(b.{name}, s.{name}) AS {name}" if name in keys
                      else f"CASE WHEN b._present THEN b.{name} ELSE s.{name} END AS {name}" for name in columns)
    on = " AND ".join(f"b.{key} = s.{key}" for key in keys)
    return f"""
        SELECT * FROM (
            SELECT {shown}, CASE WHEN b._present IS NULL THEN 'only_speed' WHEN s._present IS NULL THEN 'only_batch'
                                 WHEN {differ} THEN 'values' END AS difference
            FROM (SELECT *, true AS _present FROM {{batch}}) AS b
                 FULL OUTER JOIN (SELECT *, true AS _present FROM {{speed}}) AS s ON {on}) AS compared
        WHERE difference IS NOT NULL"""
