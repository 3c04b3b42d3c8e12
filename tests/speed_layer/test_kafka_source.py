"""The speed layer reading Kafka for real: Apache Kafka's own broker (the ``kafka`` fixture),
Spark's Kafka connector, ``generate --sink kafka`` and ``lambdalake stream --source kafka``.

One stream history covers what a deployment lives through, in one test to keep the suite short:
a ``kill -9`` mid-stream, a restart that resumes from the Kafka offsets in the checkpoints, the
broker going down and coming back while the stream runs, poison records, topics of several
partitions. Nothing may be lost or doubled, and the views must equal the generator's truth."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from include import tables
from include.accounting import ingest_totals
from include.generator import TrafficOptions, generate
from include.heartbeat import read_heartbeat
from include.lakehouse import open_store
from include.schemas import TOPIC_NAMES
from speed_layer.runner import run_stream
from speed_layer.sources import kafka_unavailable_reason

pytestmark = pytest.mark.slow
START = datetime(2026, 11, 20, tzinfo=timezone.utc)
PARTITIONS = 3
MAX_LINE_BYTES = 4096  # small, so a poison record over it stays far below the broker's own limit
VIEWS = "revenue_by_category_5m,customers"


def fresh_topics(bootstrap: str) -> None:
    """Delete the five topics (another test of this session's broker may have made them)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = [topic for topic in TOPIC_NAMES if topic in admin.list_topics(timeout=10).topics]
    for future in (admin.delete_topics(existing) if existing else {}).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while set(TOPIC_NAMES) & set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "topics not deleted"
        time.sleep(0.2)


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(topic, value=value)
    assert producer.flush(60) == 0


def kafka_offsets(checkpoint: Path) -> dict:
    """The newest offset file of a query's checkpoint: its sources' positions, by topic."""
    newest = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda path: int(path.name))
    positions = {}
    for line in newest.read_text().splitlines()[2:]:  # a version line, then the batch's metadata
        positions.update(json.loads(line))
    return positions


def behind(settings, query: str = "speed_ingest") -> int | None:
    """The records waiting on Kafka for ``query``, as the stream's heartbeat last reported them."""
    beat = read_heartbeat(settings.run_dir) or {}
    return beat.get("queries", {}).get(query, {}).get("records_behind")


def running_here(settings) -> bool:
    """This process's stream has started its queries (not the heartbeat a killed one left)."""
    beat = read_heartbeat(settings.run_dir) or {}
    return beat.get("pid") == os.getpid() and beat.get("state") == "running"


def truth(result, name: str) -> list[dict]:
    with (result.truth_dir / f"{name}.csv").open() as handle:
        return list(csv.DictReader(handle))


def iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def wait_for(condition, timeout: float, what: str, step: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(step)


def test_kafka_stream_is_exactly_once_through_kill_9_broker_restart_and_poison(spark, settings, kafka):
    settings = settings.model_copy(update={
        "event_source": "kafka", "kafka_bootstrap_servers": kafka.bootstrap_servers, "kafka_partitions": PARTITIONS,
        "max_line_bytes": MAX_LINE_BYTES,
        "max_offsets_per_trigger": 150, "speed_views": VIEWS,  # small: the stream is killed mid-way
    })
    reason = kafka_unavailable_reason(settings)
    if reason:
        print(f"SKIP kafka source: {reason}")
        pytest.skip(f"kafka source: {reason}")
    fresh_topics(kafka.bootstrap_servers)
    options = TrafficOptions(orders_per_hour=120, late_fraction=0.05, duplicate_fraction=0.02, corrupt_fraction=0.01,
                             late_beyond=timedelta(minutes=30))
    result = generate(settings, START, 1, options, seed=31, file_minutes=15, progress=False, sink="kafka")
    ingest_checkpoint = settings.checkpoints_dir / "speed_ingest"

    # 1. `lambdalake stream --source kafka` in a process of its own, killed with -9 mid-stream.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAMBDALAKE_")},
           "LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2",
           "LAMBDALAKE_SPARK_JARS_DIR": str(settings.spark_jars_dir),
           "LAMBDALAKE_KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
           "LAMBDALAKE_MAX_OFFSETS_PER_TRIGGER": "150", "LAMBDALAKE_MAX_LINE_BYTES": str(MAX_LINE_BYTES),
           "LAMBDALAKE_SPEED_VIEWS": VIEWS}
    command = [str(Path(sys.executable).parent / "lambdalake"), "stream", "--source", "kafka",
               "--home", str(settings.home)]
    victim = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        wait_for(lambda: (behind(settings) and (ingest_checkpoint / "offsets" / "0").exists())
                 or victim.poll() is not None, 600,
                 "the stream's first micro-batch, and the backlog in its heartbeat")
        assert victim.poll() is None, (settings.run_dir / "spark.log").read_text()[-3000:]
    finally:
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
    offsets = kafka_offsets(ingest_checkpoint)  # Kafka offsets, per topic and partition, in the checkpoint
    assert set(offsets) == set(TOPIC_NAMES)
    assert all(set(partitions) == {str(p) for p in range(PARTITIONS)} for partitions in offsets.values())
    read_before_kill = sum(sum(partitions.values()) for partitions in offsets.values())
    lines = sum(counts["lines"] for counts in result.ledger["topics"].values())
    assert 0 < read_before_kill < lines, "killed after it had read everything: the test would prove nothing"

    # 2. Restarted (this process, continuous, larger micro-batches): the broker goes down as its
    # queries start (the micro-batch cut short by the kill is replayed from the broker) and comes
    # back; then poison records arrive.
    settings = settings.model_copy(update={"max_offsets_per_trigger": 1000})
    stop, failure = threading.Event(), []

    def stream() -> None:
        try:
            run_stream(settings, stop=stop)
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            failure.append(exc)

    runner = threading.Thread(target=stream)
    runner.start()
    poison = [b"\x00\x01 not json at all", json.dumps({"order_id": "big", "note": "x" * MAX_LINE_BYTES}).encode()]
    expected = {topic: dict(counts) for topic, counts in result.ledger["topics"].items()}
    expected["orders"]["lines"] += len(poison)
    expected["orders"]["corrupt"] += len(poison)

    def read_everything() -> bool:
        totals = {row["topic"]: row["bronze"] for row in ingest_totals(open_store(settings))}
        return not failure and all(totals.get(topic) == expected[topic]["lines"] for topic in TOPIC_NAMES)

    try:
        wait_for(lambda: running_here(settings) or failure, 600, "the restarted stream's queries")
        kafka.stop()
        time.sleep(5)  # the stream's micro-batches find no broker meanwhile
        kafka.start()
        produce(kafka.bootstrap_servers, "orders", poison)
        wait_for(lambda: read_everything() or failure, 600, "every record in Bronze", step=2)
        wait_for(lambda: behind(settings) == 0 or failure, 600, "the heartbeat to report no backlog")
    finally:
        stop.set()
        runner.join(300)
    assert not failure, failure

    # 3. Once more, --available-now: nothing new on Kafka; the views catch up with ingest.
    run_stream(settings, available_now=True)
    store = open_store(settings)

    # Exactly once: every record of every partition once in Bronze, Bronze = Silver + DLQ + duplicates.
    totals = {row["topic"]: row for row in ingest_totals(store)}
    for topic in TOPIC_NAMES:
        counts = expected[topic]
        assert totals[topic]["bronze"] == counts["lines"], topic
        assert (totals[topic]["dlq"], totals[topic]["duplicate"]) == (counts["corrupt"], counts["duplicate"]), topic
        sources = store.read(tables.bronze(topic)).select("source")
        assert sources.distinct().count() == sources.count() == counts["lines"], topic
        partitions = {row["source"].split("/")[1] for row in sources.collect()}
        assert partitions == {str(p) for p in range(PARTITIONS)}, topic
    reasons = {row["raw"]: row["reason"] for row in store.read(tables.DLQ).where("topic = 'orders'").collect()}
    assert "JSON" in reasons[poison[0].decode("utf-8", "replace")] or "UTF-8" in reasons[
        poison[0].decode("utf-8", "replace")]
    assert reasons[poison[1].decode()].startswith(f"line too long: {len(poison[1])} bytes (limit {MAX_LINE_BYTES})")

    # The views equal the truth: revenue differs only by the orders the stream itself listed as
    # late (behind its watermark); the customer dimension, late changes included, is the truth.
    late = {row["event_id"] for row in store.read(tables.LATE_EVENTS).where("topic = 'orders'").collect()}
    windows = defaultdict(lambda: [0.0, 0])
    for order in truth(result, "order_payments"):
        if order["order_id"] not in late:
            moment = datetime.fromisoformat(order["order_time"].replace("Z", "+00:00"))
            key = (iso(moment.replace(minute=moment.minute - moment.minute % 5, second=0, microsecond=0)),
                   order["category"])
            windows[key][0] += float(order["amount"])
            windows[key][1] += 1
    speed = {(iso(row["window_start"]), row["category"]): row
             for row in store.read("speed/revenue_by_category_5m").collect()}
    assert set(speed) == set(windows)
    for key, (revenue, orders) in windows.items():
        assert (speed[key]["revenue"], speed[key]["orders"]) == (pytest.approx(revenue, abs=0.005), orders), key
    columns = ("customer_id", "segment", "email", "updated_at")
    stored = store.read("speed/customers").where("NOT deleted").collect()
    assert sorted(tuple(iso(row[c]) if isinstance(row[c], datetime) else row[c] for c in columns) for row in stored) \
        == sorted(tuple(row[c] or None for c in columns) for row in truth(result, "customers"))
