"""The driver's dedup (``LAMBDALAKE_PASS_ENGINE=duckdb``) on hand-made micro-batches and a real
Silver table: first copies by arrival, the window, and the state read back for a replay."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from include import tables
from include.lakehouse import Txn, open_store
from speed_layer.dedup import SeenEvents

T0 = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)


def micro_batch(at: datetime, lines: list[tuple]) -> pa.Table:
    """``(topic, event_id, arrived second, source, value)`` lines ingested at ``at``; an id of
    None is a rejected line."""
    return pa.table({
        "topic": pa.array([line[0] for line in lines], pa.string()),
        "event_id": pa.array([line[1] for line in lines], pa.string()),
        "rejected": pa.array([line[1] is None for line in lines]),
        "arrived_at": pa.array([T0 + timedelta(seconds=line[2]) for line in lines], pa.timestamp("us", "UTC")),
        "source": pa.array([line[3] for line in lines], pa.string()),
        "value": pa.array([line[4] for line in lines], pa.binary()),
        "ingested_at": pa.array([at] * len(lines), pa.timestamp("us", "UTC")),
    })


def ids(rows: pa.Table) -> list:
    return list(zip(rows["topic"].to_pylist(), rows["event_id"].to_pylist(), rows["value"].to_pylist()))


def store_silver(store, rows: pa.Table, batch_id: int) -> None:
    """Silver's rows of the kept events (the columns the dedup reads back)."""
    for topic in ("clicks", "orders"):
        part = rows.filter(pa.compute.and_(pa.compute.equal(rows["topic"], topic),
                                           pa.compute.invert(rows["rejected"])))
        schema = tables.arrow_schema(tables.silver_fields(topic))
        full = {name: pa.nulls(part.num_rows, schema.field(name).type) for name in schema.names}
        full |= {"event_id": part["event_id"], "ingested_at": part["ingested_at"],
                 "batch_id": pa.array([batch_id] * part.num_rows, pa.int64()),
                 "event_time": part["arrived_at"], "date": pa.compute.cast(part["arrived_at"], pa.date32())}
        if part.num_rows:
            store.append(tables.silver(topic), pa.table(full, schema=schema), Txn("speed_ingest", batch_id))


def test_first_copies_across_micro_batches_within_the_window_and_read_back_for_a_replay(spark, settings):
    store = open_store(settings, spark)
    for topic in ("clicks", "orders"):
        store.ensure_table(tables.silver(topic), tables.silver_schema(topic), tables.SILVER_PARTITIONS)
    def fresh_state() -> SeenEvents:  # a new process's, read back from Silver when it needs it
        return SeenEvents(store, ("clicks", "orders"), timedelta(minutes=5))

    def commit(state: SeenEvents, kept, batch_id: int) -> None:
        store_silver(store, kept, batch_id)
        state.keep(kept, batch_id)

    seen = fresh_state()
    first = micro_batch(T0, [
        ("clicks", "a", 2, "f2", b"a-late"), ("clicks", "a", 1, "f1", b"a-first"),  # the earlier arrival counts
        ("clicks", "b", 1, "f1", b"b2"), ("clicks", "b", 1, "f1", b"b1"),  # same file and time: the smaller bytes
        ("orders", "a", 1, "f1", b"other topic"),  # another topic's id is another event
        ("clicks", None, 1, "f1", b"bad"), ("clicks", None, 1, "f1", b"bad"),  # rejected lines all stay
    ])
    kept = seen.first_copies(first, 0)
    assert ids(kept) == [("clicks", "a", b"a-first"), ("clicks", "b", b"b1"), ("orders", "a", b"other topic"),
                         ("clicks", None, b"bad"), ("clicks", None, b"bad")]
    commit(seen, kept, 0)

    second = micro_batch(T0 + timedelta(minutes=4), [("clicks", "a", 240, "f3", b"again"),
                                                      ("clicks", "c", 240, "f3", b"c")])
    assert ids(seen.first_copies(second, 1)) == [("clicks", "c", b"c")]
    # A new process (or a replay of micro-batch 1) reads the same state back from Silver.
    again = fresh_state()
    kept = again.first_copies(second, 1)
    assert ids(kept) == [("clicks", "c", b"c")]
    commit(again, kept, 1)
    # Past the window, an id counts again (the batch layer still keeps one copy a day).
    third = micro_batch(T0 + timedelta(minutes=6), [("clicks", "a", 360, "f4", b"a, much later"),
                                                     ("clicks", "c", 360, "f4", b"c again")])
    assert ids(again.first_copies(third, 2)) == [("clicks", "a", b"a, much later")]
    # A replay of micro-batch 1 after its Silver rows were committed: those rows are not its state.
    replayed = fresh_state()
    assert ids(replayed.first_copies(second, 1)) == [("clicks", "c", b"c")]
