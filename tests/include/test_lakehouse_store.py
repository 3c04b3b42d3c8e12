"""The lakehouse store, against real Delta tables, on every engine that can run here."""

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

from include.lakehouse import CommitConflictError, TableNotFound, Txn, open_store
from include.lakehouse.delta_rs import DeltaRsStore, read_table_file, table_files
from include.spark import delta_spark_unavailable_reason

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


@pytest.fixture(params=["delta-rs", "delta-spark"])
def store(request, spark, settings):
    if request.param == "delta-spark":
        reason = delta_spark_unavailable_reason(settings)
        if reason:
            print(f"SKIP delta-spark engine: {reason}")
            pytest.skip(f"delta-spark engine: {reason}")
    return open_store(settings, spark, engine=request.param)


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


def test_two_concurrent_writers_both_succeed_through_retry(spark, settings, caplog):
    store = Lockstep(spark, settings.lakehouse_dir, commit_retries=5, backoff_seconds=0.05)
    name = make_table(store)
    # Interleaved keys: each merge's read range (the min to the max of its keys) holds rows the
    # other writer adds, so the two truly conflict (disjoint ranges would both commit at once).
    batches = [rows(spark, (i, f"w{i}", 1.0, T0, D1), (i + 2, f"w{i}", 1.0, T0, D1)) for i in range(2)]
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for version in range(3):
                batch = batches[i].selectExpr(f"id + {10 * version} as id", "name", "amount", "ts", "date")
                store.merge(name, batch, keys=["id"], txn=Txn(f"writer-{i}", version))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.read(name).count() == 12
    assert store.txn_version(name, "writer-0") == store.txn_version(name, "writer-1") == 2
    conflicts = [r for r in caplog.records if "concurrent commit conflict" in r.message]
    assert len(conflicts) >= 3  # one per round


class AlwaysConflicting(DeltaRsStore):
    def _do_append(self, path, data, txn):
        from deltalake.exceptions import CommitFailedError

        raise CommitFailedError("simulated concurrent commit")


def test_persistent_conflict_raises_clear_error(spark, settings, caplog):
    store = AlwaysConflicting(spark, settings.lakehouse_dir, commit_retries=2, backoff_seconds=0.01)
    store.ensure_table("t", SCHEMA)
    with pytest.raises(CommitConflictError, match=r"append to 't' still conflicted after 3 attempts"):
        store.append("t", rows(spark, (1, "a", 1.0, T0, D1)))
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


def test_a_spark_append_is_written_by_the_executors_and_committed_once(spark, settings):
    store = open_store(settings, spark, engine="delta-rs")
    name = make_table(store)
    batch = rows(spark, (1, "x", 1.0, T0, D1), (2, "y", 2.0, T0, D2))
    assert store.append(name, batch, Txn("q", 7)) is True
    assert store.append(name, batch, Txn("q", 7)) is False
    table = DeltaTable(store.path(name))
    assert table.transaction_version("q") == 7 and table.version() == 1
    assert not list((store.root / name / "_staging").glob("*/*"))  # staging emptied
    assertDataFrameEqual(store.read(name), batch)


def test_a_store_keeps_tables_open_and_sees_every_other_writers_commits(spark, settings):
    """Handles stay open between calls (per thread) and read only new log entries: another
    writer's appends, merges, compaction and vacuum must all show."""
    import pyarrow as pa

    def arrow(*ids):
        return pa.table({
            "id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids]),
            "amount": pa.array([1.0] * len(ids)), "ts": pa.array([T0] * len(ids), pa.timestamp("us", "UTC")),
            "date": pa.array([D1] * len(ids), pa.date32()),
        })

    ours, theirs = DeltaRsStore(spark, settings.lakehouse_dir), DeltaRsStore(spark, settings.lakehouse_dir)
    name = make_table(ours)
    assert ours.append(name, arrow(1), Txn("ours", 0))
    assert not ours.is_committed(name, Txn("theirs", 0))  # our handle is open now
    assert theirs.append(name, arrow(2), Txn("theirs", 0))
    theirs.merge(name, arrow(2, 3), keys=["id"], txn=Txn("theirs", 1))
    assert ours.is_committed(name, Txn("theirs", 1))
    assert ours.version(name) == theirs.version(name) == 3
    assert ours.append(name, arrow(4), Txn("ours", 1))  # builds on their commits
    assert sorted(ours.select_arrow(name, ["id"]).column("id").to_pylist()) == [1, 2, 3, 4]

    theirs.optimize(name)
    theirs.vacuum(name, retention_hours=0)  # the files our handle listed before are gone
    assert ours.read(name).count() == 4
    seen = []
    thread = threading.Thread(target=lambda: seen.append(ours.version(name)))  # a handle of its own
    thread.start()
    thread.join()
    assert seen == [ours.version(name)] == [theirs.version(name)]


def test_a_merged_table_rewrites_only_the_files_near_its_matches(spark, settings):
    """Speed tables take a merge every micro-batch. A merge rewrites each file holding a matched
    row; in small files (``tables.MERGED_TABLE_PROPERTIES``) that is the newest few, not the table."""
    import uuid

    import pyarrow as pa

    from include import tables

    store = DeltaRsStore(spark, settings.lakehouse_dir)
    name = "merged"
    store.ensure_table(name, SCHEMA, partition_by=["date"], properties=tables.MERGED_TABLE_PROPERTIES)

    def arrow(ids):
        return pa.table({
            "id": pa.array(ids, pa.int64()), "name": pa.array([uuid.uuid4().hex for _ in ids]),
            "amount": pa.array([1.0] * len(ids)), "ts": pa.array([T0] * len(ids), pa.timestamp("us", "UTC")),
            "date": pa.array([D1] * len(ids), pa.date32()),
        })

    batch = 10_000
    for number in range(12):  # each batch: new keys, and an update of every 20th key of the one before
        ids = list(range(number * batch, (number + 1) * batch)) + list(range((number - 1) * batch, number * batch, 20))
        store.merge(name, arrow(ids if number else ids[:batch]), keys=["id"], txn=Txn("merges", number))
    last = DeltaTable(store.path(name)).history(1)[0]["operationMetrics"]
    assert last["num_target_rows_updated"] == batch // 20
    assert last["num_target_rows_copied"] < 4 * batch  # of 110,000 stored rows
    assert len(DeltaTable(store.path(name)).file_uris()) >= 3
    assert DeltaTable(store.path(name)).to_pyarrow_dataset().count_rows() == 12 * batch


def test_a_rewrite_replaces_files_in_one_commit_on_the_files_a_compaction_left(spark, settings):
    """``rewrite`` plans and commits under the table's lock, which a compaction takes too: a
    rewrite waiting behind one plans on the compacted file, never on the files it replaced (delta-rs
    would commit their removal again, and their rows would be there twice). Its files carry the
    statistics readers skip files by; a replayed txn commits nothing."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from include.lakehouse import Rewrite

    store = DeltaRsStore(spark, settings.lakehouse_dir)
    name = make_table(store)
    for number in range(2):
        store.append(name, rows(spark, (number, f"n{number}", 1.0, T0, D1)), Txn("appends", number))
    planned = []

    def plan(files):  # every row again, plus one
        planned.append([file.path for file in files])
        stored = store.read_files(name, files)
        more = stored.slice(0, 1).set_column(0, "id", pa.array([9], pa.int64()))
        return Rewrite(removed=files, rows=[pa.concat_tables([stored, more])])

    path = store.path(name)
    with store._locked(path):
        rewrite = threading.Thread(target=store.rewrite, args=(name, "ts", plan, Txn("rewrites", 0)))
        rewrite.start()
        time.sleep(0.5)
        assert rewrite.is_alive() and not planned  # waits for the lock
        DeltaTable(path).optimize.compact()  # a compaction holding the lock (as _do_optimize does)
    rewrite.join(30)
    compacted = DeltaTable(path).history(2)[1]["operation"]
    assert compacted == "OPTIMIZE" and len(planned) == 1 and len(planned[0]) == 1
    assert sorted(store.select_arrow(name, ["id"]).column("id").to_pylist()) == [0, 1, 9]
    assert store.rewrite(name, "ts", plan, Txn("rewrites", 0)) == []  # a replay
    assert len(planned) == 1
    (file,) = table_files(store._latest(path), "ts")
    assert (file.low, file.high, dict(file.partition)) == (T0, T0, {"date": "2026-11-20"})
    assert pc.sum(store.select_arrow(name, ["amount"], "ts > CAST('2026-11-20T10:00:00Z' AS TIMESTAMP)")
                  .column("amount")).as_py() is None


def test_ensure_table_gives_an_existing_table_new_properties(store, spark):
    from include import tables

    name = make_table(store)
    assert store.ensure_table(name, SCHEMA, ["date"], tables.MERGED_TABLE_PROPERTIES) is False
    configuration = DeltaTable(store.path(name)).metadata().configuration
    assert {k: configuration.get(k) for k in tables.MERGED_TABLE_PROPERTIES} == tables.MERGED_TABLE_PROPERTIES
    version = store.version(name)
    store.ensure_table(name, SCHEMA, ["date"], tables.MERGED_TABLE_PROPERTIES)
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


@pytest.mark.parametrize("first, second", [("delta-rs", "delta-spark"), ("delta-spark", "delta-rs")])
def test_a_table_moves_between_the_engines(spark, settings, first, second):
    """A table one engine created and wrote, the other reads (also as of a version), appends to,
    merges into and replaces a partition of, keeping the first's txn record: the same Delta protocol."""
    reason = delta_spark_unavailable_reason(settings)
    if reason:
        print(f"SKIP delta-spark engine: {reason}")
        pytest.skip(f"delta-spark engine: {reason}")
    writer, other = open_store(settings, spark, engine=first), open_store(settings, spark, engine=second)
    name = make_table(writer)
    assert writer.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, None, None, None, D2)), Txn("q", 0))

    assertDataFrameEqual(other.read(name), rows(spark, (1, "a", 1.0, T0, D1), (2, None, None, None, D2)))
    assert other.is_committed(name, Txn("q", 0))
    assert other.append(name, rows(spark, (9, "x", 9.0, T0, D1)), Txn("q", 0)) is False  # the first's txn holds
    assert other.append(name, rows(spark, (3, "c", 3.0, T0, D1)), Txn("q", 1)) is True
    other.merge(name, rows(spark, (1, "a2", 1.5, T0, D1), (4, "d", 4.0, T0, D2)), keys=["id"], txn=Txn("m", 0))
    other.replace_partition(name, rows(spark, (5, "e", 5.0, T0, D2)), {"date": D2})

    expected = rows(spark, (1, "a2", 1.5, T0, D1), (3, "c", 3.0, T0, D1), (5, "e", 5.0, T0, D2))
    assertDataFrameEqual(writer.read(name), expected)  # and back: the first reads the second's commits
    assertDataFrameEqual(writer.read(name, version=1), rows(spark, (1, "a", 1.0, T0, D1), (2, None, None, None, D2)))
    assert writer.append(name, rows(spark, (6, "f", 6.0, T0, D1)), Txn("q", 2)) is True
    assert other.read(name).count() == 4
    assert [commit.version for commit in other.history(name)] == [5, 4, 3, 2, 1, 0]
    assert DeltaTable(writer.path(name)).transaction_version("q") == 2


def test_a_table_read_file_by_file_equals_the_table_whichever_engine_wrote_it(store, spark):
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


def test_select_arrow_needs_no_spark_session_whichever_engine_writes(store, spark, settings):
    """The nightly run's checks and the speed layer's state reads start no Spark application."""
    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0, D2), (3, None, None, None, D2)))

    def no_session():
        raise AssertionError("select_arrow started a Spark session")

    reader = open_store(settings, spark=no_session, engine=store.engine)
    chosen = reader.select_arrow(name, ["id", "date"], f"date = CAST('{D2.isoformat()}' AS DATE) AND name IS NOT NULL")
    assert chosen.to_pylist() == [{"id": 2, "date": D2}]
    assert chosen.schema.field("date").type == pa.date32()


def test_a_delete_before_an_instant_given_as_a_string_literal(store, spark):
    """What the pass's state deletes (``sql_literal``): delta-rs cannot compare a UTC timestamp
    column with ``CAST(... AS TIMESTAMP)`` in a delete; a string literal works on both engines."""
    from datetime import timedelta

    from include.lakehouse.base import sql_literal

    name = make_table(store)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1), (2, "b", 2.0, T0 + timedelta(hours=1), D1)))
    store.delete(name, f"ts <= {sql_literal(T0 + timedelta(minutes=30))}")
    assert [row["id"] for row in store.read(name).collect()] == [2]


def test_arrow_appends_carry_statistics_readers_accept(spark, settings):
    """delta-rs appends write their own files: min and max to the millisecond, rounded outwards,
    whole long strings (delta-rs' reader filters out a file whose column lacks them), no null
    count for a nested column (Delta nests those, and delta-rs refuses a table whose log has one
    flat); a checkpoint and filtered reads work."""
    import json

    import pyarrow as pa

    store = DeltaRsStore(spark, settings.lakehouse_dir)
    schema = StructType([StructField("ts", TimestampType()), StructField("x", DoubleType()),
                         StructField("source", StringType()),
                         StructField("after", StructType([StructField("id", LongType())])),
                         StructField("date", DateType())])
    store.ensure_table("nested", schema, partition_by=["date"])
    moments = [T0.replace(microsecond=123456), T0.replace(second=1)]
    source = "file:///a/landing/folder/with/a/name/longer/than/thirty-two.jsonl"
    rows = pa.table({"ts": pa.array(moments, pa.timestamp("us", "UTC")), "x": [1.0, float("nan")],
                     "source": [source, source],
                     "after": pa.array([{"id": 1}, None]), "date": pa.array([D1, D1], pa.date32())})
    for number in range(2):
        store.append("nested", rows, Txn("appends", number))
    path = store.path("nested")
    DeltaTable(path).create_checkpoint()
    log = (Path(path) / "_delta_log" / "00000000000000000001.json").read_text().splitlines()
    (stats,) = [json.loads(action["add"]["stats"]) for action in map(json.loads, log) if "add" in action]
    assert stats["minValues"] == {"ts": "2026-11-20T10:00:00.123Z", "x": 1.0, "source": source}
    assert stats["maxValues"] == {"ts": "2026-11-20T10:00:01.000Z", "x": 1.0, "source": source}
    assert "after" not in stats["nullCount"]
    assert store.select_arrow("nested", ["x"], "ts > CAST('2026-11-20T10:00:00.5Z' AS TIMESTAMP)").num_rows == 2
    assert DeltaTable(path).to_pyarrow_table(columns=["x"], filters=[("source", "in", [source])]).num_rows == 4


def test_appends_write_their_own_log_entries_race_for_versions_and_checkpoint(spark, settings):
    """delta-rs' appends write their log entries themselves (a hard link takes the version).
    Two writers appending at once both land every row, once; a checkpoint comes every 100
    versions; a fresh reader, and a new store, see every row and transaction id."""
    import pyarrow as pa

    def arrow(i):
        return pa.table({"id": pa.array([i], pa.int64()), "name": [f"n{i}"], "amount": [1.0],
                         "ts": pa.array([T0], pa.timestamp("us", "UTC")), "date": pa.array([D1], pa.date32())})

    ours, theirs = DeltaRsStore(spark, settings.lakehouse_dir), DeltaRsStore(spark, settings.lakehouse_dir)
    name = make_table(ours)

    def appends(store, app, ids):
        for i in ids:
            assert store.append(name, arrow(i), Txn(app, i))

    with ThreadPoolExecutor(2) as pool:
        both = [pool.submit(appends, ours, "ours", range(0, 120, 2)),
                pool.submit(appends, theirs, "theirs", range(1, 120, 2))]
        [writer.result() for writer in both]
    assert not ours.append(name, arrow(118), Txn("ours", 118))  # committed: skipped
    log = Path(ours.path(name)) / "_delta_log"
    assert (log / f"{100:020d}.checkpoint.parquet").exists()
    assert not list(log.glob(".*.tmp"))
    fresh = DeltaTable(ours.path(name))
    assert fresh.version() == 120
    assert sorted(fresh.to_pyarrow_table().column("id").to_pylist()) == list(range(120))
    assert fresh.transaction_version("ours") == 118 and fresh.transaction_version("theirs") == 119
    later = DeltaRsStore(spark, settings.lakehouse_dir)
    assert later.is_committed(name, Txn("theirs", 119)) and not later.is_committed(name, Txn("theirs", 120))
    assert sorted(ours.select_arrow(name, ["id"]).column("id").to_pylist()) == list(range(120))


def test_a_newer_version_is_found_in_the_log_also_once_its_entries_are_cleaned_up(spark, settings):
    """Handles are refreshed only when the log has a newer version: the next entry, or a
    checkpoint after it (entries before a checkpoint are deleted once older than the log's
    retention)."""
    from include.lakehouse.base import has_newer_version

    store = DeltaRsStore(spark, settings.lakehouse_dir)
    name = make_table(store)
    path = store.path(name)
    assert not has_newer_version(path, 0)
    store.append(name, rows(spark, (1, "a", 1.0, T0, D1)))
    assert has_newer_version(path, 0) and not has_newer_version(path, 1)
    DeltaTable(path).create_checkpoint()
    (Path(path) / "_delta_log" / f"{1:020d}.json").unlink()  # as a cleanup would
    assert has_newer_version(path, 0) and not has_newer_version(path, 1)
