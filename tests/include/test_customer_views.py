"""The customer dimension (SCD1 ``customers``, SCD2 ``customers_history``) and the enrichment of
orders (``revenue_by_segment_1h``) on tiny inline frames: each out-of-order case in the batch
(all changes at once) and in the speed layer (two micro-batches through Spark's state store and
the speed merge into real Delta tables)."""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone

import pytest
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from include.registry import ViewContext
from include.views import VIEWS_BY_NAME
from include.views.cdc import customers, customers_history, revenue_by_segment_1h

IMAGE = "struct<customer_id:string,name:string,email:string,segment:string,country:string>"
CDC = f"op string, ts_ms bigint, before {IMAGE}, after {IMAGE}, event_time timestamp, arrived_at timestamp"
ORDERS = "order_id string, user_id string, category string, amount double, event_time timestamp, arrived_at timestamp"
DAY = date(2026, 11, 20)


def t(minute: int) -> datetime:
    return datetime(2026, 11, 20, 10, 0) + timedelta(minutes=minute)  # naive UTC, as collected


def ms(minute: int) -> int:
    return int(t(minute).replace(tzinfo=timezone.utc).timestamp() * 1000)


def change(op: str, minute: int, segment: str | None, arrived: int, customer: str = "C1") -> tuple:
    """A CDC change of ``customer`` at ``minute`` (its ts_ms) that landed at minute ``arrived``."""
    image = (customer, "Ada", "ada@example.com", segment, "DE")
    before, after = (image, None) if op == "d" else (None, image)
    return (op, ms(minute), before, after, t(minute), t(arrived))


# name: (micro-batches of changes, SCD1 (segment, updated minute, deleted),
#        SCD2 [(segment, from, to, current, deleted)])
SEQUENCES = {
    "update older than the applied one": (
        [[change("c", 1, "a", 1), change("u", 3, "b", 3)], [change("u", 2, "x", 4)]],
        ("b", 3, False),
        [("a", 1, 2, False, False), ("x", 2, 3, False, False), ("b", 3, None, True, False)],
    ),
    "update after a delete": (
        [[change("c", 1, "a", 1), change("d", 3, "a", 3)], [change("u", 2, "x", 4)]],
        ("a", 3, True),
        [("a", 1, 2, False, False), ("x", 2, 3, False, False), ("a", 3, None, False, True)],
    ),
    "delete then re-create": (
        [[change("c", 1, "a", 1), change("d", 2, "a", 2)], [change("c", 3, "b", 3)]],
        ("b", 3, False),
        [("a", 1, 2, False, False), ("a", 2, 3, False, True), ("b", 3, None, True, False)],
    ),
    "duplicate change": (
        [[change("c", 1, "a", 1), change("u", 2, "b", 2)], [change("u", 2, "b", 2)]],
        ("b", 2, False),
        [("a", 1, 2, False, False), ("b", 2, None, True, False)],
    ),
    "equal ts_ms: the later arrival wins": (
        [[change("c", 1, "a", 1), change("u", 2, "b", 2)], [change("u", 2, "x", 5)]],
        ("x", 2, False),
        [("a", 1, 2, False, False), ("x", 2, None, True, False)],
    ),
}


def expected_customers(spark, scd1):
    segment, minute, deleted = scd1
    return spark.createDataFrame(
        [("C1", "Ada", "ada@example.com", segment, "DE", t(minute), deleted, DAY)], VIEWS_BY_NAME["customers"].schema)


def expected_history(spark, scd2):
    return spark.createDataFrame(
        [("C1", "Ada", "ada@example.com", segment, "DE", t(start), None if end is None else t(end), current, deleted,
          DAY)
         for segment, start, end, current, deleted in scd2],
        VIEWS_BY_NAME["customers_history"].schema)


@pytest.mark.parametrize("case", list(SEQUENCES))
def test_batch_sequences_changes_by_ts_ms(spark, settings, case):
    batches, scd1, scd2 = SEQUENCES[case]
    cdc = spark.createDataFrame([row for batch in batches for row in batch], CDC)
    context = ViewContext(settings, exact=True)
    assertDataFrameEqual(customers({"customers_cdc": cdc}, context), expected_customers(spark, scd1))
    assertDataFrameEqual(customers_history({"customers_cdc": cdc}, context), expected_history(spark, scd2))


def run_speed(spark, settings, store, view, batch):
    """The view's speed side on micro-batch ``batch``, as ingest's pass computes it."""
    from include.lakehouse import Txn
    from speed_layer.view_pass import MicroBatch, ViewPass

    events = spark.read.schema(CDC).parquet(str(settings.home / "cdc" / f"b{batch}"))
    micro_batch = MicroBatch(spark=spark, txn=Txn("speed_ingest", batch), at=datetime.now(timezone.utc),
                             fed={"customers_cdc"},
                             events=lambda topic: events, watermarks={}, watermarks_after={})
    for write in ViewPass(settings, store, [view]).writes(micro_batch).values():
        write()


def test_speed_sequences_changes_across_micro_batches(spark, settings):
    """Every case at once (one customer each) in two micro-batches: the second brings the change
    that lands out of order; ingest's pass gives the batch's answer."""
    from include.lakehouse import open_store

    store = open_store(settings, spark)
    folder = settings.home / "cdc"
    ids = {case: f"C{number}" for number, case in enumerate(SEQUENCES, start=1)}
    for batch in (0, 1):
        rows = [(op, ts, before and (ids[case], *before[1:]), after and (ids[case], *after[1:]), at, arrived)
                for case, (batches, _, _) in SEQUENCES.items() for op, ts, before, after, at, arrived in batches[batch]]
        spark.createDataFrame(rows, CDC).write.parquet(str(folder / f"b{batch}"))
        for view in (VIEWS_BY_NAME["customers"], VIEWS_BY_NAME["customers_history"]):
            run_speed(spark, settings, store, view, batch)
    for case, (_, scd1, scd2) in SEQUENCES.items():
        mine = F.col("customer_id") == ids[case]
        as_c1 = F.lit("C1").alias("customer_id")
        shown = VIEWS_BY_NAME["customers"].schema.fieldNames()[1:]
        got = store.read("speed/customers").where(mine)
        assertDataFrameEqual(got.select(as_c1, *shown), expected_customers(spark, scd1))
        got = store.read("speed/customers_history").where(mine)
        assertDataFrameEqual(got.select(as_c1, *got.columns[1:]), expected_history(spark, scd2))


def test_history_versions_never_overlap_and_leave_no_gap_while_the_customer_exists(spark, settings):
    cdc = spark.createDataFrame(
        [change("r", 0, "a", 0), change("u", 5, "b", 9), change("u", 3, "c", 10), change("d", 7, "c", 11),
         change("c", 8, "d", 12), change("u", 20, "e", 13)], CDC)
    versions = sorted(
        (r["valid_from"], r["valid_to"], r["deleted"])
        for r in customers_history({"customers_cdc": cdc}, ViewContext(settings, exact=True)).collect())
    for (start, end, _), (next_start, _, _) in zip(versions, versions[1:]):
        assert start < end == next_start  # each version ends where the next begins
    assert [(start.minute, deleted) for start, _, deleted in versions] == [
        (0, False), (3, False), (5, False), (7, True), (8, False), (20, False)]
    assert versions[-1][1] is None


SEGMENT_HISTORY = [
    # customer, segment, valid from, valid to, deleted
    ("C1", "consumer", t(0), t(30), False),
    ("C1", "premium", t(30), None, False),  # C1 moved to premium at 10:30
    ("C2", "business", t(0), t(20), False),
    ("C2", "business", t(20), None, True),  # C2 deleted at 10:20
]


def history(spark, rows):
    return spark.createDataFrame(
        [(c, "n", "e", segment, "DE", start, end, end is None and not deleted, deleted, DAY)
         for c, segment, start, end, deleted in rows],
        VIEWS_BY_NAME["customers_history"].schema)


def test_batch_enrichment_is_point_in_time(spark, settings):
    orders = spark.createDataFrame(
        [("o1", "C1", "books", 10.0, t(29), t(29)),  # before the change: consumer
         ("o2", "C1", "books", 5.0, t(30), t(30)),  # exactly at the change: premium
         ("o3", "C2", "toys", 2.5, t(10), t(10)),  # before the delete
         ("o4", "C2", "toys", 1.0, t(25), t(25)),  # after it: unknown
         ("o5", "G9", "toys", 4.0, t(70), t(70))],  # no such customer, next hour
        ORDERS)
    got = revenue_by_segment_1h({"orders": orders, "customers_history": history(spark, SEGMENT_HISTORY)},
                                ViewContext(settings, exact=True))
    hour = datetime(2026, 11, 20, 10)
    expected = spark.createDataFrame(
        [(hour, hour + timedelta(hours=1), "business", 2.5, 1, ["o3"], [2.5], DAY),
         (hour, hour + timedelta(hours=1), "consumer", 10.0, 1, ["o1"], [10.0], DAY),
         (hour, hour + timedelta(hours=1), "premium", 5.0, 1, ["o2"], [5.0], DAY),
         (hour, hour + timedelta(hours=1), "unknown", 1.0, 1, ["o4"], [1.0], DAY),
         (hour + timedelta(hours=1), hour + timedelta(hours=2), "unknown", 4.0, 1, ["o5"], [4.0], DAY)],
        VIEWS_BY_NAME["revenue_by_segment_1h"].schema)
    assertDataFrameEqual(got, expected)


def test_speed_enrichment_follows_the_dimension_while_the_stream_runs(spark, settings):
    """The speed query re-reads the dimension's Delta table every micro-batch: an order processed
    after a segment change gets the new segment without a restart; reconciliation then counts
    the order the stream enriched differently from the point-in-time batch. The view keeps no
    streaming state: each micro-batch appends its own rows, which readers (Spark, serving's
    DuckDB) add up per key (revenue exact in decimal), and a replayed micro-batch adds nothing."""
    from include.lakehouse import open_store
    from include.registry import speed_rows_sql
    from include.views.sql import spark_rows
    from serving.engine import ServingEngine
    from speed_layer.gold import CombineBatch

    def speed_rows(view, rows):
        return spark_rows(speed_rows_sql(view, "{rows}"), {"rows": rows})

    store = open_store(settings, spark)
    view, dimension = VIEWS_BY_NAME["revenue_by_segment_1h"], VIEWS_BY_NAME["customers_history"]
    store.ensure_table(dimension.speed_table, dimension.schema, ["date"])
    store.ensure_table(view.speed_table, view.schema, ["date"])
    store.merge(dimension.speed_table, history(spark, [("C1", "consumer", t(0), None, False),
                                                       ("C2", "consumer", t(0), None, False)]), dimension.keys)
    folder = settings.home / "orders"
    spark.createDataFrame([("o1", "C1", "books", 0.1, t(10), t(10))], ORDERS).write.parquet(str(folder / "b0"))
    combine = CombineBatch(store, view, settings)
    seen, batches = [], {}

    def merge(batch, batch_id):
        batches[batch_id] = batch.collect()
        combine(batch, batch_id)
        seen.append(sorted((r["segment"], r["revenue"], r["orders"], r["order_ids"])
                           for r in speed_rows(view, store.read(view.speed_table)).collect()))

    query = (spark.readStream.schema(ORDERS).parquet(str(folder / "*")).writeStream.foreachBatch(merge)
             .option("checkpointLocation", str(settings.checkpoints_dir / "enrich"))
             .trigger(processingTime="1 second").start())
    try:
        while not seen:
            query.awaitTermination(0.5)
        # C1 changes segment at 10:20 (the dimension's query commits it), then orders of 10:15 land.
        store.merge(dimension.speed_table, history(spark, [("C1", "consumer", t(0), t(20), False),
                                                           ("C1", "premium", t(20), None, False)]), dimension.keys)
        spark.createDataFrame([("o2", "C1", "books", 5.0, t(15), t(25)), ("o3", "C2", "books", 0.2, t(16), t(25))],
                              ORDERS).write.parquet(str(folder / "b1"))
        while len(seen) < 2 or len(seen[-1]) < 2:
            assert query.exception() is None
            query.awaitTermination(0.5)
    finally:
        query.stop()
    assert seen[-1] == [("consumer", 0.3, 2, ["o1", "o3"]), ("premium", 5.0, 1, ["o2"])]
    last = max(batches)
    combine(spark.createDataFrame(batches[last], ORDERS), last)  # a replay of a committed micro-batch
    assert sorted((r["segment"], r["revenue"], r["orders"])
                  for r in speed_rows(view, store.read(view.speed_table)).collect()) == [
        ("consumer", 0.3, 2), ("premium", 5.0, 1)]
    # Stored: a row per key and micro-batch, none rewritten; served: added up.
    assert sorted((r["segment"], r["order_ids"]) for r in store.read(view.speed_table).collect()) == [
        ("consumer", ["o1"]), ("consumer", ["o3"]), ("premium", ["o2"])]
    served = ServingEngine(settings).rows(
        "SELECT segment, revenue, orders, source FROM revenue_by_segment_1h ORDER BY segment")
    assert served == [{"segment": "consumer", "revenue": 0.3, "orders": 2, "source": "speed"},
                      {"segment": "premium", "revenue": 5.0, "orders": 1, "source": "speed"}]

    batch = revenue_by_segment_1h(
        {"orders": spark.createDataFrame([("o1", "C1", "books", 0.1, t(10), t(10)),
                                          ("o2", "C1", "books", 5.0, t(15), t(25)),
                                          ("o3", "C2", "books", 0.2, t(16), t(25))], ORDERS),
         "customers_history": history(spark, [("C1", "consumer", t(0), t(20), False),
                                              ("C1", "premium", t(20), None, False),
                                              ("C2", "consumer", t(0), None, False)])},
        ViewContext(settings, exact=True))
    layers = {"speed": speed_rows(view, store.read(view.speed_table)), "batch": batch}
    differing = spark_rows(view.differences.rows(view), layers).toArrow().to_pylist()
    assert [(r["order_id"], r["amount"], r["speed_segment"], r["batch_segment"]) for r in differing] == [
        ("o2", 5.0, "premium", "consumer")]
