"""The anomaly look-back's running moments give, for every fresh event, the integers the
definition's window gives over all on-time events (out of order, ties, forgotten and renumbered
entities, values beyond int64, clocks years apart), and a new process reading them back from
Silver gives the same as the one that kept them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from include import tables
from include.lakehouse import Txn, open_store
from include.registry import Lookback
from include.views.alerting import ANOMALY
from speed_layer.moments import Moments
from speed_layer.recent import RecentEvents

SPAN = 900_000_000  # 15 minutes, in microseconds


def duckdb_rows(sql, tables):
    """SQL over Arrow tables named by ``{name}`` placeholders, by DuckDB: the window the moments
    must equal, computed by another engine than the one under test."""
    connection = duckdb.connect()
    for name, table in tables.items():
        connection.register(name, table)
    return connection.sql(re.sub(r"\{(\w+)\}", r"\1", sql)).to_arrow_table()


def window(entities, micros, values, fresh):
    """The definition's window over every event: count, sum and sum of squares of the fresh ones."""
    table = pa.table({"entity": entities, "micros": micros, "x": pa.array(values, pa.decimal128(38, 0)),
                      "fresh": fresh, "row": np.arange(len(micros))})
    rows = duckdb_rows(f"""
        SELECT row, count(1) OVER w AS n, coalesce(sum(x) OVER w, 0) AS s, coalesce(sum(x * x) OVER w, 0) AS q
        FROM {{events}} WINDOW w AS (PARTITION BY entity ORDER BY micros RANGE BETWEEN {SPAN} PRECEDING AND 1 PRECEDING)
        QUALIFY fresh ORDER BY row""", {"events": table})
    return [(row["n"], int(row["s"]), int(row["q"])) for row in rows.to_pylist()]


def run_batches(batches, spare_codes=None, monkeypatch=None):
    """Feed batches of (entities, micros, values) to one Moments, forgetting before each batch's
    watermark (its earliest event), and compare every batch's statistics with the window's."""
    if spare_codes is not None:
        monkeypatch.setattr("speed_layer.moments.SPARE_CODES", spare_codes)
    moments = Moments(SPAN)
    seen = ([], [], [])
    for entities, micros, values in batches:
        moments.forget(int(min(micros)) - SPAN - 1)
        moments.add(pa.array(entities), np.array(micros, np.int64), pa.array(values, pa.decimal128(38, 0)))
        count, total, squares = moments.window(pa.array(entities), np.array(micros, np.int64))
        for part, new in zip(seen, (entities, micros, values)):
            part.extend(new)
        fresh = [False] * (len(seen[0]) - len(entities)) + [True] * len(entities)
        assert [(int(n), int(s), int(q)) for n, s, q in zip(count, total, squares)] == window(
            *seen, fresh)
    return moments


def test_moments_equal_the_window_out_of_order_with_ties(monkeypatch):
    rng = np.random.default_rng(7)
    start, batches = 1_795_000_000_000_000, []
    for second in range(0, 1800, 60):  # 30 minutes, a batch a minute, the look-back 15
        size = 300
        micros = start + second * 1_000_000 + rng.integers(-20_000_000, 60_000_000, size)  # some out of order
        micros[:20] = micros[20:40]  # ties: equal times of one device do not see each other
        entities = [f"D{device}" for device in rng.integers(0, 40, size)]
        entities[:20] = entities[20:40]
        batches.append((entities, micros.tolist(), rng.integers(-500, 9000, size).tolist()))
    # Devices come and go: with one spare code the codes are renumbered again and again.
    batches += [([f"E{second}"] * 3, [start + (1800 + second) * 1_000_000 + k for k in range(3)], [1, 2, 3])
                for second in range(10)]
    moments = run_batches(batches, spare_codes=1, monkeypatch=monkeypatch)
    live = np.unique(np.concatenate([run.code for run in moments._runs]))
    assert len(moments._codes) <= len(live) + 2  # renumbered, not one code per device seen
    assert [len(part) for part in moments.window(pa.array([], pa.string()), np.empty(0, np.int64))] == [0, 0, 0]


def test_moments_equal_the_window_over_many_runs_and_sweeps(monkeypatch):
    """Micro-batches of every size make runs of every size; merges and sweeps drop forgotten readings."""
    monkeypatch.setattr("speed_layer.moments.SWEEP_EVERY", 5)
    rng = np.random.default_rng(11)
    start, batches = 1_795_000_000_000_000, []
    for second in range(0, 2400, 20):
        size = int(rng.choice([1, 3, 40, 250]))
        micros = start + second * 1_000_000 + rng.integers(-30_000_000, 5_000_000, size)
        micros[0] = start + (second - 30) * 1_000_000  # the batch's earliest: its forgetting is the watermark's
        batches.append(([f"D{device}" for device in rng.integers(0, 12, size)], micros.tolist(),
                        rng.integers(-50, 900, size).tolist()))
    moments = run_batches(batches)
    assert 1 < len(moments._runs) < 12
    assert min(run.micros.min() for run in moments._runs) > start  # the first minutes are gone


def test_moments_exact_beyond_int64_and_across_years():
    start = 1_795_000_000_000_000
    huge = 10 ** 15  # squares of a few of these overflow int64: Python integers take over
    run_batches([
        (["D1"] * 4, [start + k for k in range(4)], [huge, -huge, huge + 1, 7]),
        (["D1", "D2"], [start + 10, start + 11], [huge * 3, 5]),
    ])
    # A clock millennia ahead: times too far apart for one int64 key are ranked instead.
    far = int(datetime(9000, 1, 1, tzinfo=timezone.utc).timestamp()) * 1_000_000
    rng = np.random.default_rng(3)
    devices = [f"D{k}" for k in rng.integers(0, 80, 400)]
    run_batches([(devices, (start + rng.integers(0, SPAN, 400)).tolist(), rng.integers(0, 99, 400).tolist()),
                 (devices, (np.where(rng.random(400) < 0.5, far, start + SPAN // 2) + rng.integers(0, SPAN, 400)
                            ).tolist(), rng.integers(0, 99, 400).tolist())])


@pytest.fixture
def silver_sensors(settings):
    """Sensors Silver with three micro-batches of on-time readings (and one late one) of two devices."""
    store = open_store(settings)
    name = tables.silver("sensors")
    store.ensure_table(name, tables.silver_schema("sensors"), tables.SILVER_PARTITIONS)
    at = datetime(2026, 11, 20, 10, 0, tzinfo=timezone.utc)
    schema = tables.arrow_schema(tables.silver_fields("sensors"))
    batches = []
    for batch_id in range(3):
        rows = [{"device_id": f"D{k % 2}", "temperature": 20.0 + (k * batch_id) % 7 / 4, "humidity": 40.0,
                 "event_time": at + timedelta(minutes=batch_id * 6, seconds=k * 7), "event_id": f"{batch_id}-{k}",
                 "batch_id": batch_id, "ingested_at": at + timedelta(minutes=batch_id * 6, seconds=50),
                 "arrived_at": at, "is_late": k == 5, "date": at.date()} for k in range(12)]
        silver = pa.Table.from_pylist(rows, schema=schema)
        store.append(name, silver, Txn("speed_ingest", batch_id))
        events = silver.filter(pa.compute.invert(silver["is_late"]))
        batches.append(events.select(["device_id", "temperature", "humidity", "event_time", "arrived_at",
                                      "ingested_at"]))
    return store, batches


def test_read_back_from_silver_gives_what_was_kept(silver_sensors):
    store, batches = silver_sensors
    lookback = Lookback(topic="sensors", entity="device_id", value=ANOMALY.value, span=timedelta(minutes=6))
    watermarks = [None, *(pa.compute.max(events["event_time"]).as_py() - timedelta(seconds=5) for events in batches)]
    kept = RecentEvents(store, {})
    by_kept = [kept.moments(lookback, batch_id, watermarks[batch_id], events, duckdb_rows)
               for batch_id, events in enumerate(batches)]
    # A new process (or a replay) of the last micro-batch reads the earlier ones back from Silver.
    read_back = RecentEvents(store, {})
    by_read_back = read_back.moments(lookback, 2, watermarks[2], batches[2], duckdb_rows)
    assert len(kept._moments[lookback][0]) == len(read_back._moments[lookback][0])  # forgotten as not read back

    def stats(rows):
        return sorted(zip(*(rows[c].to_pylist() for c in ("device_id", "event_time", "lookback_count",
                                                           "lookback_sum", "lookback_squares"))))

    assert stats(by_read_back) == stats(by_kept[2])
    assert max(stats(by_kept[2]), key=lambda row: row[2])[2] > 5  # the look-back reaches the earlier batches
    # The same micro-batch again in the same process (a failed one retried) is read back too.
    assert stats(kept.moments(lookback, 2, watermarks[2], batches[2], duckdb_rows)) == stats(by_kept[2])
