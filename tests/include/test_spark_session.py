"""The platform's SparkSession: compiled code is reused, and per-micro-batch values do not defeat it."""

from __future__ import annotations

from datetime import datetime, timezone

import pyarrow as pa
from pyspark.sql import functions as F

from include.spark import CODEGEN_CACHE_ENTRIES, with_batch_values


def _compilations(spark) -> int:  # noqa: ANN001
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def test_the_session_keeps_room_for_a_dozen_queries_compiled_code(spark) -> None:  # noqa: ANN001
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == str(CODEGEN_CACHE_ENTRIES)


def test_batch_values_join_per_key_and_leave_unknown_keys_null(spark) -> None:  # noqa: ANN001
    rows = spark.createDataFrame([("orders", 1), ("clicks", 2), ("sensors", 3)], "topic string, n int")
    watermark = datetime(2026, 11, 20, 12, 0, tzinfo=timezone.utc)
    values = pa.table({
        "topic": pa.array(["orders", "clicks"]),
        "watermark": pa.array([watermark, None], pa.timestamp("us", "UTC")),
        "batch_id": pa.array([7, 7], pa.int64()),
    })
    joined = {row["topic"]: row for row in with_batch_values(rows, values, on="topic").collect()}
    assert joined["orders"]["watermark"] == watermark.replace(tzinfo=None)  # the session's UTC wall time
    assert joined["orders"]["batch_id"] == 7 and joined["orders"]["n"] == 1
    assert joined["clicks"]["watermark"] is None and joined["clicks"]["batch_id"] == 7
    assert joined["sensors"]["watermark"] is None and joined["sensors"]["batch_id"] is None
    constant = with_batch_values(rows, pa.table({"batch_id": pa.array([9], pa.int64())}))
    assert sorted((row["topic"], row["batch_id"]) for row in constant.collect()) == [
        ("clicks", 9), ("orders", 9), ("sensors", 9)]


def test_values_that_change_every_micro_batch_compile_the_code_once(spark) -> None:  # noqa: ANN001
    """As literals, each new value would be compiled into the stage's code again (the control)."""
    base = spark.range(1000).withColumn("text", F.col("id").cast("string"))

    def run(batch_id: int, as_literal: bool) -> None:
        now = datetime.now(timezone.utc)
        if as_literal:
            rows = base.withColumns({"ingested_at": F.lit(now), "batch_id": F.lit(batch_id).cast("long")})
        else:
            values = pa.table({"ingested_at": pa.array([now], pa.timestamp("us", "UTC")),
                               "batch_id": pa.array([batch_id], pa.int64())})
            rows = with_batch_values(base, values)
        rows.where("id % 3 = 0").write.format("noop").mode("overwrite").save()

    for as_literal in (False, True):
        run(0, as_literal)  # compiles the plan's code the first time
        before = _compilations(spark)
        for batch_id in range(1, 4):
            run(batch_id, as_literal)
        compiled = _compilations(spark) - before
        assert (compiled >= 3) if as_literal else (compiled == 0), (as_literal, compiled)
