"""The one place that builds the SparkSession (with delta-spark, which writes every table Spark writes)."""

from __future__ import annotations

import os
import re
import sys
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from include.config import ConfigError, Settings
from include.spark_jars import cached_jars

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

DELTA_TABLE_CLASS = "io/delta/tables/DeltaTable.class"
DELTA_EXTENSION = "io.delta.sql.DeltaSparkSessionExtension"
DELTA_CATALOG = "org.apache.spark.sql.delta.catalog.DeltaCatalog"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
LOCAL_LISTING_THRESHOLD = 1_000_000
LOCAL_MASTER = re.compile(r"local(\[(\*|\d+)(,\d+)?\])?")  # driver and executor in one JVM
MALLOC_ARENAS = "2"  # glibc malloc arenas for JVMs that hold RocksDB state (see get_spark)
# Compiled query code kept for reuse. Spark's default of 100 is fewer classes than a dozen
# streaming queries use between two of their micro-batches, so each micro-batch compiled its code
# again: 3,238 compilations in an --available-now run of all views, 577 with room for all.
CODEGEN_CACHE_ENTRIES = 2000
G1_REGIONS = 2048  # the JVM sizes G1's regions to about this many in the heap
G1_REGION_BOUNDS = (1 << 20, 32 << 20)
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def cached_spark_jars(settings: Settings) -> list[Path]:
    """The jars ``make install`` fetched into ``settings.spark_jars_dir`` (the packages of
    :mod:`include.spark_jars`: Delta, the Kafka connector); empty when they were not fetched."""
    return cached_jars(settings.spark_jars_dir)


def session_jars(settings: Settings) -> list[str]:
    """What a session puts on ``spark.jars``: the fetched packages, then ``LAMBDALAKE_SPARK_JARS``."""
    jars = [str(jar) for jar in cached_spark_jars(settings)]
    return jars + [jar.strip() for jar in settings.spark_jars.split(",") if jar.strip()]


def jar_with_class(settings: Settings, class_file: str, pattern: str) -> Path | None:
    """The first jar on this platform's class path (pyspark/jars, $SPARK_HOME/jars, the fetched
    packages, LAMBDALAKE_SPARK_JARS) whose name matches ``pattern`` and that holds ``class_file``."""
    import pyspark

    folders = [Path(pyspark.__file__).parent / "jars"]
    if os.environ.get("SPARK_HOME"):
        folders.append(Path(os.environ["SPARK_HOME"]) / "jars")
    jars = [jar for folder in folders if folder.is_dir() for jar in folder.glob(pattern)]
    jars += [Path(jar) for jar in session_jars(settings) if Path(jar).match(pattern)]
    for jar in jars:
        try:
            with zipfile.ZipFile(jar) as archive:
                if class_file in archive.namelist():
                    return jar
        except (OSError, zipfile.BadZipFile):
            continue
    return None


def missing_package_reason(settings: Settings, what: str) -> str:
    """Why ``what`` (a package of include/spark_jars.py) is not on Spark's class path, and the fix."""
    folder = settings.spark_jars_dir
    fetched = "not fetched" if not cached_spark_jars(settings) else "fetched without it"
    return (f"{what} is not on Spark's class path: the Spark packages in {folder} are {fetched} "
            f"(`make install` fetches them from Maven Central, or `python include/spark_jars.py --into {folder}`; "
            f"or put the jar in $SPARK_HOME/jars or LAMBDALAKE_SPARK_JARS)")


def delta_spark_unavailable_reason(settings: Settings) -> str | None:
    """None when Spark can load the Delta classes; otherwise why it cannot, and the fix."""
    if "delta-spark" in settings.spark_jars_packages:
        return None  # resolved from Maven when the session starts
    if jar_with_class(settings, DELTA_TABLE_CLASS, "*delta-spark*.jar") is not None:
        return None
    return missing_package_reason(settings, "Delta Lake (delta-spark)")


def memory_page_size(heap: str) -> str:
    """Spark's memory page (hash maps, sorts, broadcast tables) for a JVM heap like ``4g``: the
    largest array G1 keeps in an ordinary region, just under half a region.

    Spark sizes pages from the heap alone, so each small micro-batch's hash maps and broadcast
    tables take huge arrays, zeroed on allocation; a page of half a region or more gets a G1
    region of its own and wastes the rest (benchmarks/DECISIONS.md). 8,192 pages per task
    (Spark's limit) of half a region still cover the heap."""
    number, unit = re.fullmatch(r"(\d+)([kmgt]?)", heap.strip().lower()).groups()
    low, high = G1_REGION_BOUNDS
    region = low
    while region < high and region * 2 * G1_REGIONS <= int(number) * UNITS[unit]:
        region *= 2
    return f"{region // 2 // 1024 - 1}k"


def _fast_local_files(builder):  # noqa: ANN001, ANN202 - SparkSession.Builder
    """Local files through :mod:`include.jvm`'s file system (one JVM: the driver's class path)."""
    from include.jvm import ABSTRACT_FILE_SYSTEM_CLASS, FILE_SYSTEM_CLASS, fast_local_fs_jar

    jar = fast_local_fs_jar()
    if jar is None:
        return builder
    return (
        builder.config("spark.driver.extraClassPath", str(jar))
        .config("spark.hadoop.fs.file.impl", FILE_SYSTEM_CLASS)
        .config("spark.hadoop.fs.AbstractFileSystem.file.impl", ABSTRACT_FILE_SYSTEM_CLASS)
    )


def get_spark(settings: Settings, app_name: str = "lambdalake") -> SparkSession:
    """Return the active SparkSession, or build one configured for this platform."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active

    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
        .config("spark.sql.streaming.stateStore.providerClass", ROCKSDB_PROVIDER)
        .config("spark.sql.codegen.cache.maxEntries", str(CODEGEN_CACHE_ENTRIES))
        .config("spark.ui.enabled", str(settings.spark_ui).lower())
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Delta's timestamp encoding (Spark's default INT96 is legacy).
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        # Task outputs move into place once, not twice (many small write jobs per micro-batch).
        .config("spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version", "2")
        # Streaming state commits write a small changelog instead of a full RocksDB snapshot.
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        # Every RocksDB instance (one per stateful operator and partition, a few dozen in the
        # stream) shares one bounded cache and write-buffer budget, instead of up to 128 MB of
        # memtables each.
        .config("spark.sql.streaming.stateStore.rocksdb.boundedMemoryUsage", "true")
        .config("spark.sql.streaming.stateStore.rocksdb.maxMemoryUsageMB", str(settings.state_memory_mb))
        # Keep Spark's own metadata files out of the working directory.
        .config("spark.sql.warehouse.dir", str(settings.home / "spark-warehouse"))
        .config("spark.driver.extraJavaOptions", f"-Dderby.system.home={settings.home / 'derby'}")
    )
    in_one_jvm = bool(LOCAL_MASTER.fullmatch(settings.spark_master))  # not local-cluster[...]: executors elsewhere
    # Only a JVM this process starts takes the class path; under spark-submit it is running already.
    if in_one_jvm and "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = _fast_local_files(builder)
    if in_one_jvm:
        # A file source's micro-batch of more than 32 files is listed by a Spark job, which
        # queues behind the other queries' tasks; local files list fast on the driver.
        builder = builder.config("spark.sql.sources.parallelPartitionDiscovery.threshold", str(LOCAL_LISTING_THRESHOLD))
        # The driver's heap is the executor's here (on a cluster, Spark sizes pages per executor).
        builder = builder.config("spark.buffer.pageSize", memory_page_size(settings.spark_driver_memory))
        # Python workers (the latest-version data source) run this interpreter, not whatever python3 is on
        # PATH; the JVM passes its environment on to them.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # glibc gives each of the JVM's many threads its own malloc arena, and RocksDB's native
        # allocations left the memory outside the heap growing.
        os.environ.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENAS)
    else:
        # Executors of their own (a cluster) keep the streaming state's RocksDB: the same arenas.
        builder = builder.config("spark.executorEnv.MALLOC_ARENA_MAX", MALLOC_ARENAS)
    jars = session_jars(settings)
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    if settings.spark_jars_packages:
        builder = builder.config("spark.jars.packages", settings.spark_jars_packages)
    unavailable = delta_spark_unavailable_reason(settings)
    if unavailable:  # every table Spark writes is written with delta-spark
        raise ConfigError(f"Spark cannot write the lakehouse: {unavailable}")
    builder = (
        builder.config("spark.sql.extensions", DELTA_EXTENSION)
        .config("spark.sql.catalog.spark_catalog", DELTA_CATALOG)
        # Keep tables readable by delta-rs and older readers.
        .config("spark.databricks.delta.properties.defaults.enableDeletionVectors", "false")
        # Delta rebuilds a table's snapshot from its log in 50 tasks by default, made for logs
        # of millions of files: ours are small, and every commit and read rebuilds one.
        .config("spark.databricks.delta.snapshotPartitions", str(settings.shuffle_partitions))
        # VACUUM lists a table's files in 10,000 tasks by default: 73 s for a table of nine
        # files on 2 cores, 19 s in as many tasks as shuffle partitions.
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", str(settings.shuffle_partitions))
    )
    # Only a JVM this process starts can be quieted; under spark-submit its output is the job log.
    quiet = settings.log_level in ("WARNING", "ERROR") and "PYSPARK_GATEWAY_PORT" not in os.environ
    with _jvm_output_to(settings.run_dir / "spark.log" if quiet else None):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN" if settings.log_level != "DEBUG" else "INFO")
    return spark


def with_batch_values(df: DataFrame, values: pa.Table, on: str | None = None) -> DataFrame:
    """``df`` with the columns of ``values``: one micro-batch's own values, in one row, or in one
    row per value of the column ``on`` (a row of ``df`` without one gets NULLs). Joined from a
    broadcast table rather than written as literals: Spark compiles a literal into the query's
    generated code, so a value that changes every micro-batch compiles that code again each time."""
    from pyspark.sql import functions as F

    table = F.broadcast(df.sparkSession.createDataFrame(values))  # a local relation: no Spark job
    return df.crossJoin(table) if on is None else df.join(table, on, "left")


@contextmanager
def _jvm_output_to(log: Path | None) -> Iterator[None]:
    """Point file descriptors 1 and 2 at ``log`` (None: 1 at 2) while the JVM starts: the JVM
    keeps them as its stdout and stderr (start-up warnings, log4j's console, what Delta prints,
    such as VACUUM's "Deleted N files"), so none of it lands in a command's output; this process
    gets its own back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    target = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        target = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if target is not None:
            os.dup2(target, 2)
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for descriptor in (*saved, *([target] if target is not None else [])):
            os.close(descriptor)
