"""The lakehouse store against real Delta tables: delta-spark for the pipeline's tables, delta-rs
for the ops tables (and every read without a JVM)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor
from datetime import date, datetime, timezone

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql.types import DateType, DoubleType, LongType, StringType, StructField, StructType, TimestampType
from pyspark.testing import assertDataFrameEqual

from include import tables
from include.lakehouse import CommitConflictError, LakehouseError, TableNotFound, Txn, open_reader, open_store
from include.lakehouse.delta_rs import DeltaRsStore, read_table_file, table_files

SCHEMA = StructType(
    [
        StructField("id", LongType()),
        StructField("name", StringType()),
        StructField("amount", DoubleType()),
        StructField("ts", TimestampType()),
        StructField("date", DateType()),
    ]
)
T0 = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)
D1, D2 = date(2026, 11, 20), date(2026, 11, 21)


@pytest.fixture
def store(spark, settings):
    return open_store(settings, spark)


def arrow(*ids):
    return pa.table({
        "id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids]),
        "amount": pa.array([1.0] * len(ids)), "ts": pa.array([T0] * len(ids), pa.timestamp("us", "UTC")),
        "date": pa.array([D1] * len(ids), pa.date32()),
    })


def rows(spark, *values):
    return spark.createDataFrame(list(values), SCHEMA)


def make_table(store, name="events"):
    store.ensure_table(name, SCHEMA, partition_by=["date"])
    return name


def test_ensure_table_is_idempotent_and_portable(store, spark):
    assert store.ensure_table("t", SCHEMA, partition_by=["date"]) is True
    assert store.ensure_table("t", SCHEMA, partition_by=["date"]) is False
    store.append("t", rows(spark, (1, "a", 1.5, T0, D1)))
    table = DeltaTable(store.path("t"))  # readable by delta-rs directly
    assert table.metadata().partition_columns == ["date"]
    assert table.metadata().configuration["delta.enableDeletionVectors"] == "false"
    assert "deletionVectors" not in (table.protocol().reader_features or [])
    assert table.to_pyarrow_table().num_rows == 1
    assert "UTC" in str(table.schema().to_arrow().field("ts").type)


def test_ensure_table_rejects_unknown_partition_column(store):
    with pytest.raises(ValueError, match=r"partition columns \['day'\] are not in the schema"):
        store.ensure_table("t", SCHEMA, partition_by=["day"])


def test_bad_table_name_and_missing_table(store):
    with pytest.raises(ValueError, match="table name must be lowercase"):
        store.path("../escape")
    with pytest.raises(TableNotFound, match="table 'nope' does not exist"):
        store.read("nope")


def test_append_and_read_back_with_nulls(store, spark):
    name = make_table(store)
    data = rows(spark, (1, "a", 1.5, T0, D1), (2, None, None, None, D2))
    assert store.append(name, data) is True
    assertDataFrameEqual(store.read(name), data)


def test_same_txn_version_appended_twice_gives_one_copy(store, spark):
    name = make_table(store)
    batch = rows(spark, (1, "a", 1.0, T0, D1))
    assert store.append(name, batch, txn=Txn("query-1", 0)) is True
    assert store.append(name, batch, txn=Txn("query-1", 0)) is False
    assert store.append(name, batch, txn=Txn("query-1", 1)) is True
    assert store.append(name, batch, txn=Txn("query-2", 0)) is True  # another app id is independent
    assert store.read(name).count() == 3
    assert store.txn_version(name, "query-1") == 1
    assert store.append(name, batch, txn=Txn("query-1", 0)) is False  # older versions stay skipped
    assert store.read(name).count() == 3


def test_merge_upserts_on_keys(store, spark):
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0, D1)))
    assert store.merge(name, rows(spark, (2, "B", 20.0, T0, D1), (3, "c", 3.0, T0, D2)), keys=["id"], txn=Txn("m", 7))
    assert not store.merge(name, rows(spark, (2, "X", 0.0, T0, D1)), keys=["id"], txn=Txn("m", 7))
    expected = rows(spark, (1, "a", 1.0, T0, D1), (2, "B", 20.0, T0, D1), (3, "c", 3.0, T0, D2))
    assertDataFrameEqual(store.read(name), expected)


def test_merges_and_appends_from_threads_at_once_each_record_only_their_own_txn(store, spark):
    """Ingest writes its tables from several threads; a txn must never leak from one write to
    another (delta-spark used to pass a MERGE's txn through settings the whole session shares)."""
    merged = [make_table(store, f"merged_{i}") for i in range(2)]
    plain = make_table(store, "plain")

    def merge_rounds(name: str) -> None:
        for version in range(2):
            store.merge(name, rows(spark, (version, name, 1.0, T0, D1)), keys=["id"], txn=Txn(f"app_{name}", version))

    def append_rounds() -> None:
        for version in range(4):
            store.append(plain, rows(spark, (version, "p", 1.0, T0, D1)))

    with ThreadPoolExecutor(max_workers=3) as pool:
        writes = [pool.submit(merge_rounds, name) for name in merged] + [pool.submit(append_rounds)]
        for write in writes:
            write.result()  # raises the thread's error
    for name in merged:
        assert store.read(name).count() == 2
        assert store.txn_version(name, f"app_{name}") == 1
        assert all(store.txn_version(other, f"app_{name}") is None for other in [*merged, plain] if other != name)
    assert store.read(plain).count() == 4


def test_merge_validates_keys(store, spark):
    name = make_table(store)
    with pytest.raises(ValueError, match=r"merge keys \['key'\] are not columns"):
        store.merge(name, rows(spark, (1, "a", 1.0, T0, D1)), keys=["key"])


@pytest.fixture(params=["spark", "arrow"])
def given(request, spark):
    """Rows to write as a Spark DataFrame or as Arrow (the batch on the driver)."""
    if request.param == "spark":
        return lambda *values: rows(spark, *values)
    return lambda *values: rows(spark, *values).toArrow()


def test_replace_partition_leaves_other_partitions_untouched(store, spark, given):
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0, D1), (3, "c", 3.0, T0, D2)))
    store.replace_partition(name, given((10, "z", 9.0, T0, D1)), {"date": D1})
    store.replace_partition(name, given((10, "z", 9.0, T0, D1)), {"date": D1})  # idempotent
    expected = rows(spark, (10, "z", 9.0, T0, D1), (3, "c", 3.0, T0, D2))
    assertDataFrameEqual(store.read(name), expected)


def test_replace_partition_refuses_rows_of_other_partitions(store, spark, given):
    name = make_table(store)
    store.append(name, rows(spark, (3, "c", 3.0, T0, D2)))
    with pytest.raises(ValueError, match="rows outside partition"):
        store.replace_partition(name, given((1, "a", 1.0, T0, D1), (1, "a", 1.0, T0, D2)), {"date": D1})
    with pytest.raises(ValueError, match="rows outside partition"):  # no partition value
        store.replace_partition(name, given((1, "a", 1.0, T0, None)), {"date": D1})
    with pytest.raises(ValueError, match=r"\['name'\] are not partition columns"):
        store.replace_partition(name, given((1, "a", 1.0, T0, D1)), {"name": "a"})
    assert store.read(name).count() == 1


def test_time_travel_by_version_and_timestamp(store, spark):
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1)))  # version 1 (0 is the create)
    time.sleep(1.1)
    between = datetime.now(timezone.utc)
    time.sleep(1.1)
    store.append(name, rows(spark, (2, "b", 2.0, T0, D1)))  # version 2
    assert store.version(name) == 2
    assert store.read(name, version=1).count() == 1
    assert store.read(name, version=0).count() == 0
    assert store.read(name, timestamp=between).count() == 1
    assert store.read(name).count() == 2
    with pytest.raises(ValueError, match="must carry a time zone"):
        store.read(name, timestamp=datetime(2026, 1, 1))


def test_history_newest_first(store, spark):
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1)))
    store.merge(name, rows(spark, (1, "b", 1.0, T0, D1)), keys=["id"])
    history = store.history(name)
    assert [entry.version for entry in history] == [2, 1, 0]
    assert history[0].operation == "MERGE"
    assert history[1].operation == "WRITE"
    assert history[0].timestamp.tzinfo is not None
    assert len(store.history(name, limit=1)) == 1


def test_optimize_compacts_and_vacuum_removes_old_files(store, spark):
    name = make_table(store)
    for i in range(4):
        store.append(name, rows(spark, (i, "x", float(i), T0, D1)))
    files_before = len(DeltaTable(store.path(name)).file_uris())
    assert files_before >= 4
    store.optimize(name)
    assert len(DeltaTable(store.path(name)).file_uris()) < files_before
    store.optimize(name, zorder_by=["id"])
    assert store.vacuum(name, retention_hours=0) >= files_before
    assert store.read(name).count() == 4


def test_vacuum_with_no_file_older_than_the_retention_runs_nothing(store, spark):
    name = make_table(store)
    for i in range(2):
        store.append(name, rows(spark, (i, "x", float(i), T0, D1)))
    store.optimize(name)  # the two appended files are now removed, and young
    version, files = store.version(name), sorted(p.name for p in Path(store.path(name)).rglob("*.parquet"))
    assert store.vacuum(name, retention_hours=1) == 0
    # Not run at all: a VACUUM commits its start and end.
    assert store.version(name) == version
    assert sorted(p.name for p in Path(store.path(name)).rglob("*.parquet")) == files


class Lockstep(DeltaRsStore):
    """Both writers load the same snapshot before committing, so one commit must conflict."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.barrier = threading.Barrier(2)
        self.first_attempt = threading.local()

    def merge(self, *args, **kwargs):
        self.first_attempt.value = True
        return super().merge(*args, **kwargs)

    def _open(self, path):
        table = super()._open(path)
        if self.first_attempt.value:  # retries go ahead alone
            self.first_attempt.value = False
            self.barrier.wait(timeout=60)
        return table


OPS = tables.SUPERVISOR_EVENTS  # a table delta-rs writes


def test_two_concurrent_writers_both_succeed_through_retry(spark, settings, caplog):
    store = Lockstep(settings.lakehouse_dir, commit_retries=5, backoff_seconds=0.05)
    name = make_table(store, OPS)
    # Interleaved keys: each merge's read range (the min to the max of its keys) holds rows the
    # other writer adds, so the two truly conflict (disjoint ranges would both commit at once).
    batches = [rows(spark, (i, f"w{i}", 1.0, T0, D1), (i + 2, f"w{i}", 1.0, T0, D1)) for i in range(2)]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for version in range(3):
                batch = batches[i].selectExpr(f"id + {10 * version} as id", "name", "amount", "ts", "date").toArrow()
                store.merge(name, batch, keys=["id"], txn=Txn(f"writer-{i}", version))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.select_arrow(name, ["id"]).num_rows == 12
    assert store.txn_version(name, "writer-0") == store.txn_version(name, "writer-1") == 2
    conflicts = [r for r in caplog.records if "concurrent commit conflict" in r.message]
    assert len(conflicts) >= 3  # one per round


class AlwaysConflicting(DeltaRsStore):
    def _do_append(self, path, data, txn):
        from deltalake.exceptions import CommitFailedError

        raise CommitFailedError("simulated concurrent commit")


def test_persistent_conflict_raises_clear_error(spark, settings, caplog):
    store = AlwaysConflicting(settings.lakehouse_dir, commit_retries=2, backoff_seconds=0.01)
    store.ensure_table(OPS, SCHEMA)
    with pytest.raises(CommitConflictError, match=rf"append to '{OPS}' still conflicted after 3 attempts"):
        store.append(OPS, arrow(1))
    assert sum("concurrent commit conflict" in r.message for r in caplog.records) == 2


def test_append_split_writes_each_value_to_its_table_once(store, spark):
    for name in ("split_a", "split_b", "split_c"):
        make_table(store, name)
    lines = spark.createDataFrame(
        [("a", 1, "x", 1.0, T0, D1), ("a", 2, None, None, None, None), ("b", 3, "y", 3.0, T0, D2)],
        StructType([StructField("kind", StringType()), *SCHEMA.fields]),
    )
    tables = {"a": "split_a", "b": "split_b", "c": "split_c"}
    assert store.append_split(lines, "kind", tables, Txn("q", 0)) == {"split_a": 2, "split_b": 1, "split_c": 0}
    # A replay commits nothing again; a table with no rows never had anything to commit.
    assert store.append_split(lines, "kind", tables, Txn("q", 0)) == {"split_a": None, "split_b": None, "split_c": 0}
    assertDataFrameEqual(store.read("split_a"), rows(spark, (1, "x", 1.0, T0, D1), (2, None, None, None, None)))
    assertDataFrameEqual(store.read("split_b"), rows(spark, (3, "y", 3.0, T0, D2)))
    assert store.read("split_c").count() == 0
    # Partition values and row counts are in the Delta log, as any writer records them.
    assert store.partition_row_counts("split_a", "date") == {D1: 1, None: 1}


def test_ensure_table_gives_an_existing_table_new_properties(store, spark):
    name = make_table(store)
    assert store.ensure_table(name, SCHEMA, ["date"], tables.STREAM_TABLE_PROPERTIES) is False
    configuration = DeltaTable(store.path(name)).metadata().configuration
    assert {k: configuration.get(k) for k in tables.STREAM_TABLE_PROPERTIES} == tables.STREAM_TABLE_PROPERTIES
    version = store.version(name)
    store.ensure_table(name, SCHEMA, ["date"], tables.STREAM_TABLE_PROPERTIES)
    assert store.version(name) == version  # nothing to change: no commit


def test_ensure_table_gives_an_existing_table_the_columns_it_lacks(store, spark):
    name = make_table(store)
    store.append(name, spark.createDataFrame([(1, "a", 1.0, T0, D1)], SCHEMA))
    wider = StructType([*SCHEMA.fields, StructField("note", StringType()), StructField("seen_at", TimestampType())])
    assert store.ensure_table(name, wider, ["date"]) is False
    assert [field.name for field in DeltaTable(store.path(name)).schema().fields] == wider.fieldNames()
    store.append(name, spark.createDataFrame([(2, "b", 2.0, T0, D1, "new", T0)], wider))
    rows = sorted(store.read(name).collect(), key=lambda row: row["id"])
    assert [(row["id"], row["note"], row["seen_at"] is None) for row in rows] == [(1, None, True), (2, "new", False)]
    version = store.version(name)
    store.ensure_table(name, wider, ["date"])
    assert store.version(name) == version  # nothing to add: no commit


def test_a_table_read_file_by_file_equals_the_table(store, spark):
    """What serve does: each file of the log, with its partition values (delta-spark's files hold
    them as well) and a column added after it was written."""
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, None, None, None, D2)))
    wider = StructType([*SCHEMA.fields, StructField("note", StringType())])
    store.ensure_table(name, wider, ["date"])
    store.append(name, spark.createDataFrame([(3, "c", 3.0, T0, D1, "new")], wider))
    table = DeltaTable(store.path(name))
    schema = pa.schema(table.schema().to_arrow())
    files = table_files(table)
    read = pa.concat_tables([read_table_file(store.path(name), file, schema) for file in files])
    whole = store.read(name).toArrow().select(schema.names).cast(schema)
    assert read.sort_by("id").to_pylist() == whole.sort_by("id").to_pylist()
    assert {file.partition["date"] for file in files} == {str(D1), str(D2)}


def test_select_arrow_needs_no_spark_session(store, spark, settings):
    """The nightly run's checks, serving and the speed layer's state reads start no Spark application."""
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0, D2), (3, None, None, None, D2)))

    def no_session():
        raise AssertionError("select_arrow started a Spark session")

    assert open_store(settings, spark=no_session).select_arrow(name, ["id"]).num_rows == 3
    reader = open_reader(settings)
    chosen = reader.select_arrow(name, ["id", "date"], f"date = CAST('{D2.isoformat()}' AS DATE) AND name IS NOT NULL")
    assert chosen.to_pylist() == [{"id": 2, "date": D2}]
    assert chosen.schema.field("date").type == pa.date32()


def test_a_delete_before_an_instant_given_as_a_string_literal(store, spark):
    """What the pass's state deletes (``sql_literal``): a UTC timestamp column compared with a
    string literal."""
    from datetime import timedelta

    from include.lakehouse.base import sql_literal

    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0 + timedelta(hours=1), D1)))
    store.delete(name, f"ts <= {sql_literal(T0 + timedelta(minutes=30))}")
    assert [row["id"] for row in store.read(name).collect()] == [2]


def test_a_newer_version_is_found_in_the_log_also_once_its_entries_are_cleaned_up(spark, settings):
    """Handles are refreshed only when the log has a newer version: the next entry, or a
    checkpoint after it (entries before a checkpoint are deleted once older than the log's
    retention)."""
    from include.lakehouse.base import has_newer_version

    store = open_store(settings, spark)
    name = make_table(store)
    path = store.path(name)
    assert not has_newer_version(path, 0)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1)))
    assert has_newer_version(path, 0) and not has_newer_version(path, 1)
    DeltaTable(path).create_checkpoint()
    (Path(path) / "_delta_log" / f"{1:020d}.json").unlink()  # as a cleanup would
    assert has_newer_version(path, 0) and not has_newer_version(path, 1)


def test_delta_rs_writes_the_ops_tables_only(settings):
    """One writing engine per table: delta-rs (processes without a JVM) refuses a pipeline table,
    and records a transaction id once."""
    reader = open_reader(settings)
    with pytest.raises(LakehouseError, match="table 'events' is written by Spark"):
        reader.ensure_table("events", SCHEMA, partition_by=["date"])
    make_table(reader, OPS)
    assert reader.append(OPS, arrow(1, 2), Txn("q", 0)) is True
    assert reader.append(OPS, arrow(1, 2), Txn("q", 0)) is False
    reader.merge(OPS, arrow(2, 3), keys=["id"], txn=Txn("q", 1))
    assert sorted(reader.select_arrow(OPS, ["id"]).column("id").to_pylist()) == [1, 2, 3]
    assert DeltaTable(reader.path(OPS)).transaction_version("q") == 1
    assert [commit.operation for commit in reader.history(OPS)][:2] == ["MERGE", "WRITE"]


def test_every_commit_of_the_pipeline_store_names_delta_spark(store, spark):
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1)), Txn("q", 0))
    store.merge(name, rows(spark, (1, "b", 2.0, T0, D1)), keys=["id"], txn=Txn("q", 1))
    engines = {entry.get("engineInfo", "") for entry in DeltaTable(store.path(name)).history()}
    assert engines and all(engine.startswith("Apache-Spark/") and "Delta-Lake/" in engine for engine in engines)
