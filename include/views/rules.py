"""Rules the views share, in both layers: which copy of an event counts, exact money sums,
distinct counts (exact in the batch, sketched in the stream), and how often the views that need
not be fresh to the second refresh."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from include.config import spark_interval
from include.registry import ViewContext

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

# The continuous stream updates some views with queries of their own this often (``Speed.refresh``),
# not every trigger: sessions that close after 30 idle minutes, the customer dimensions and the
# hourly view that looks them up. The views ingest computes come with each of its micro-batches.
DASHBOARD_REFRESH = timedelta(seconds=30)
# Which copy of a duplicated event counts, in both layers: the first to arrive (then the
# first file, then the smallest bytes, so equal arrivals still pick one copy deterministically).
FIRST_COPY_ORDER = ("arrived_at", "source", "value")


def money_sum_sql(column: str) -> str:
    """Exact sum of currency amounts (decimal arithmetic, so any summation order agrees)."""
    return f"CAST(sum(CAST({column} AS DECIMAL(18,2))) AS DOUBLE)"


def hll_lg_k(rsd: float) -> int:
    """log2 of the buckets a DataSketches HLL sketch needs for a relative standard deviation of
    at most ``rsd`` (its error is about 1.04/sqrt(buckets)), within Spark's 4..21."""
    return min(21, max(4, math.ceil(math.log2((1.04 / rsd) ** 2))))


def distinct_count(column: str, name: str, context: ViewContext) -> list[Column]:
    """The number of distinct ``column`` values as ``name``: exact in the batch; in the stream
    estimated from an HLL sketch (``LAMBDALAKE_APPROX_DISTINCT_RSD``), which is also given, as
    :func:`sketch_of` ``name``, for partial rows to merge (:func:`merged_distinct_count`).

    DataSketches' ``hll_sketch_agg``, not ``approx_count_distinct``: HyperLogLog++'s buffer is one
    field per 10 registers, and Spark generates code for a buffer of that width in every task of
    the aggregation (benchmarks/DECISIONS.md). A DataSketches sketch is one binary field, and exact
    while a window has few distinct values. (Spark computes the aggregate once for both columns.)"""
    from pyspark.sql import functions as F

    if context.exact:
        return [F.count_distinct(column).alias(name)]
    sketch = F.hll_sketch_agg(column, hll_lg_k(context.settings.approx_distinct_rsd))
    return [F.hll_sketch_estimate(sketch).alias(name), sketch.alias(sketch_of(name))]


def distinct_count_sql(column: str, name: str, context: ViewContext) -> str:
    """:func:`distinct_count` as SQL select items."""
    if context.exact:
        return f"count(DISTINCT {column}) AS {name}"
    sketch = f"hll_sketch_agg({column}, {hll_lg_k(context.settings.approx_distinct_rsd)})"
    return f"hll_sketch_estimate({sketch}) AS {name}, {sketch} AS {sketch_of(name)}"


def window_start_sql(time: str, seconds: int, minus: str = "0") -> str:
    """The start of the tumbling window of ``seconds`` (from the epoch, as Spark's ``window``) that
    holds ``time``, ``minus`` seconds (a sliding window's earlier starts)."""
    return f"timestamp_seconds(floor(unix_seconds({time}) / {seconds}) * {seconds} - {minus})"


def sketch_of(name: str) -> str:
    """The column holding the sketch behind the distinct count ``name`` in partial rows."""
    return f"{name}_sketch"


def merged_distinct_count(name: str) -> dict[str, str]:
    """:attr:`include.registry.Partials.merge` of a :func:`distinct_count`: the sketches' union
    and its estimate (sketches of another ``lg_k``, from an earlier setting, merge too)."""
    union = f"hll_union_agg({sketch_of(name)}, true)"
    return {name: f"hll_sketch_estimate({union})", sketch_of(name): union}


def first_copies(events: DataFrame, key: Sequence[str], horizon: timedelta | None = None) -> DataFrame:
    """One row per ``key``: the first copy to arrive.

    With ``horizon`` (a stream) Spark's state store remembers keys for that long after they were
    ingested (``ingested_at``, which only moves forward, so nothing is dropped as late); a batch
    keeps the minimum by :data:`FIRST_COPY_ORDER`, the copy the stream kept.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if horizon is not None:
        # Spark drops a key once the watermark (newest ingested_at - delay) reaches its own
        # ingested_at + delay, so a delay of half the horizon keeps it for the horizon (a whole
        # one would keep it twice as long), and each micro-batch scans every key it keeps.
        delay = timedelta(seconds=math.ceil(horizon.total_seconds() / 2))
        return events.withWatermark("ingested_at", spark_interval(delay)).dropDuplicatesWithinWatermark(list(key))
    order = Window.partitionBy(*key).orderBy(*[F.col(c).asc_nulls_last() for c in FIRST_COPY_ORDER])
    return events.withColumn("_copy", F.row_number().over(order)).where("_copy = 1").drop("_copy")


def exact_sum_sql(column: str, scale: int = 2) -> str:
    """Sum of a measurement with ``scale`` decimals as an exact decimal: the speed layer's partial
    sums and the batch's full sum agree to the last digit in any order."""
    return f"sum(CAST({column} AS DECIMAL(18,{scale})))"
