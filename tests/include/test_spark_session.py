"""The platform's SparkSession: compiled code is reused, and per-micro-batch values do not defeat it."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timezone

import pyarrow as pa
from pyspark.sql import functions as F

from include.spark import CODEGEN_CACHE_ENTRIES, memory_page_size, with_batch_values


def _compilations(spark) -> int:  # noqa: ANN001
    return spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount()


def test_the_session_keeps_room_for_a_dozen_queries_compiled_code(spark) -> None:  # noqa: ANN001
    assert spark.conf.get("spark.sql.codegen.cache.maxEntries") == str(CODEGEN_CACHE_ENTRIES)


def test_memory_pages_are_the_largest_arrays_in_an_ordinary_heap_region(spark) -> None:  # noqa: ANN001
    """Spark's own default would be 32-64 MB pages; half a G1 region or more would take a whole one."""
    jvm = spark._jvm
    page = jvm.org.apache.spark.SparkEnv.get().memoryManager().pageSizeBytes()
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    region = int(diagnostics.getVMOption("G1HeapRegionSize").getValue())
    assert region // 2 - 2048 <= page + 16 <= region // 2, (page, region)  # 16: a long[]'s header


def test_memory_pages_grow_with_the_heap_and_cover_it() -> None:
    sizes = {heap: memory_page_size(heap) for heap in ("512m", "2g", "3g", "4g", "16g", "128g")}
    assert sizes == {"512m": "511k", "2g": "511k", "3g": "511k", "4g": "1023k", "16g": "4095k", "128g": "16383k"}
    for heap, page in sizes.items():  # Spark's 8,192 pages per task cover what a task may take
        assert 8192 * int(page[:-1]) * 1024 >= 0.6 * int(heap[:-1]) * {"m": 1 << 20, "g": 1 << 30}[heap[-1]]


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


def test_streaming_state_shares_one_bounded_memory_budget(spark) -> None:  # noqa: ANN001
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage") == "true"
    assert spark.conf.get("spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB") == "512"


def test_the_local_jvm_keeps_few_malloc_arenas(spark) -> None:  # noqa: ANN001
    """The JVM the platform starts inherits MALLOC_ARENA_MAX=2 (RocksDB's native memory)."""
    from pathlib import Path

    pid = spark._jvm.java.lang.ProcessHandle.current().pid()
    environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"MALLOC_ARENA_MAX=2" in environment


def test_executors_of_their_own_keep_few_malloc_arenas_too(tmp_path) -> None:
    """With executors in JVMs of their own (here Spark's local-cluster, one worker), each gets
    MALLOC_ARENA_MAX=2 through Spark; the driver's environment is left alone."""
    script = (
        "import os\n"
        "from include.config import load_settings\n"
        "from include.spark import get_spark\n"
        "spark = get_spark(load_settings())\n"
        "seen = spark.sparkContext.parallelize([0], 1)"
        ".map(lambda _: (os.getpid(), os.environ.get('MALLOC_ARENA_MAX'))).collect()\n"
        "print(seen[0][0] != os.getpid(), seen[0][1], os.environ.get('MALLOC_ARENA_MAX'))\n"
        "spark.stop()\n"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("MALLOC_ARENA_MAX", "PYSPARK_GATEWAY_PORT")}
    env.update(LAMBDALAKE_HOME=str(tmp_path), LAMBDALAKE_SPARK_MASTER="local-cluster[1,1,1024]",
               PYSPARK_PYTHON=sys.executable)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["True", "2", "None"]
