"""The generator's Kafka sink against Apache Kafka's own broker (the ``kafka`` fixture). The
records are read back with a plain consumer and parsed through the Kafka source's projection on a
static frame; tests/speed_layer/test_kafka_source.py streams them through Spark's Kafka source."""

from __future__ import annotations

import json
import socket
import time
from collections import defaultdict
from datetime import datetime, timezone

import pytest

from include.generator import TrafficOptions, generate
from include.generator.kafka import ensure_topics, record_key
from include.parsing import parse_topic
from include.schemas import TOPIC_NAMES
from speed_layer.sources import RAW_COLUMNS, kafka_raw

START = datetime(2026, 11, 20, tzinfo=timezone.utc)
OPTIONS = TrafficOptions(orders_per_hour=60, late_fraction=0.05, duplicate_fraction=0.02, corrupt_fraction=0.02)


def consume(bootstrap: str, topic: str) -> list:
    """Every record of ``topic``, partition by partition, from offset 0."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"test-{topic}", "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        records, quiet_since = [], time.monotonic()
        while time.monotonic() - quiet_since < 2:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                records.append(message)
                quiet_since = time.monotonic()
        return records
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def produced(kafka_broker, tmp_path_factory):
    """One generator run to Kafka and the same seed to a landing zone, side by side."""
    from include.config import load_settings

    kafka = load_settings(home=tmp_path_factory.mktemp("kafka-home"), kafka_bootstrap_servers=kafka_broker,
                          kafka_partitions=4)
    landing = load_settings(home=tmp_path_factory.mktemp("landing-home"))
    to_kafka = generate(kafka, START, 2, OPTIONS, seed=11, file_minutes=10, progress=False, sink="kafka")
    to_landing = generate(landing, START, 2, OPTIONS, seed=11, file_minutes=10, progress=False)
    records = {topic: consume(kafka_broker, topic) for topic in TOPIC_NAMES}
    return to_kafka, to_landing, landing, records


def landed_lines(settings, topic: str) -> list[str]:
    """The topic's landed lines in arrival order (files by name = arrival window)."""
    files = sorted(settings.landing_topic_dir(topic).glob("*.jsonl"))
    return [line for path in files for line in path.read_text(encoding="utf-8").split("\n")[:-1]]


def test_the_same_seed_gives_the_same_truth_on_both_sinks(produced):
    to_kafka, to_landing, _, _ = produced
    assert to_kafka.run_id == to_landing.run_id
    ledger = {key: value for key, value in to_kafka.ledger.items() if key != "parameters"}
    assert ledger == {key: value for key, value in to_landing.ledger.items() if key != "parameters"}
    assert ((to_kafka.truth_dir / "order_payments.csv").read_bytes()
            == (to_landing.truth_dir / "order_payments.csv").read_bytes())


@pytest.mark.parametrize("topic", TOPIC_NAMES)
def test_every_line_arrives_once_in_order_per_key(produced, topic):
    _, to_landing, landing, records = produced
    lines = landed_lines(landing, topic)
    values = [record.value().decode() for record in records[topic]]
    assert sorted(values) == sorted(lines)  # each line once, byte for byte (duplicates and corrupt lines too)
    assert len(values) == to_landing.ledger["topics"][topic]["lines"]

    expected, arrived = defaultdict(list), defaultdict(list)
    for line in lines:
        expected[record_key(topic, line)].append(line)
    partitions = defaultdict(set)
    for record in sorted(records[topic], key=lambda r: (r.partition(), r.offset())):
        assert record.key() == record_key(topic, record.value().decode())
        arrived[record.key()].append(record.value().decode())
        partitions[record.key()].add(record.partition())
    keyed = {key: lines for key, lines in expected.items() if key is not None}
    assert {key: arrived[key] for key in keyed} == keyed  # generation order, per entity
    assert all(len(partitions[key]) == 1 for key in keyed)
    assert len(keyed) > 1 and len({p for key in keyed for p in partitions[key]}) > 1  # spread over partitions


def test_topics_are_created_with_the_configured_partitions(kafka_broker, produced):
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=10).topics
    assert {name: len(topics[name].partitions) for name in TOPIC_NAMES} == dict.fromkeys(TOPIC_NAMES, 4)
    ensure_topics(kafka_broker, TOPIC_NAMES, 8)  # existing topics are left as they are
    topics = AdminClient({"bootstrap.servers": kafka_broker}).list_topics(timeout=10).topics
    assert {len(topics[name].partitions) for name in TOPIC_NAMES} == {4}


def test_records_parse_like_landed_lines_through_the_kafka_source_projection(spark, produced):
    from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

    _, to_landing, _, records = produced
    kafka_schema = StructType([  # the columns of Spark's Kafka source
        StructField("key", BinaryType()), StructField("value", BinaryType()), StructField("topic", StringType()),
        StructField("partition", IntegerType()), StructField("offset", LongType()),
        StructField("timestamp", TimestampType()), StructField("timestampType", IntegerType()),
    ])
    for topic in ("orders", "customers_cdc"):
        rows = [(r.key(), r.value(), r.topic(), r.partition(), r.offset(),
                 datetime.fromtimestamp(r.timestamp()[1] / 1000, timezone.utc), r.timestamp()[0])
                for r in records[topic]]
        raw = kafka_raw(spark.createDataFrame(rows, kafka_schema))
        assert tuple(raw.columns) == RAW_COLUMNS
        parsed = parse_topic(raw, topic)
        counts = to_landing.ledger["topics"][topic]
        assert parsed.where("record IS NOT NULL").count() == counts["valid"] + counts["duplicate"]
        assert parsed.where("rejected").count() == counts["corrupt"]
        assert parsed.where(f"source NOT RLIKE '^{topic}/[0-9]+/[0-9]+$'").count() == 0


def test_generate_cli_produces_to_kafka_and_an_unreachable_broker_is_one_line(kafka_broker, tmp_path, capsys):
    from lambdalake.cli import main

    code = main(["generate", "--home", str(tmp_path / "h"), "--sink", "kafka", "--bootstrap-servers", kafka_broker,
                 "--start", "2026-11-21T00:00:00Z", "--hours", "0.25", "--seed", "3", "--format", "json"])
    assert code == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["topic"] for row in rows} == set(TOPIC_NAMES) and all(row["lines"] > 0 for row in rows)

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    code = main(["generate", "--home", str(tmp_path / "h2"), "--sink", "kafka", "--bootstrap-servers", closed,
                 "--hours", "0.1"])
    error = capsys.readouterr().err.strip()
    assert code != 0 and error.startswith("lambdalake: error: cannot reach Kafka at " + closed) and "\n" not in error


def test_record_key_is_the_entity_and_none_for_a_line_that_is_not_json():
    assert record_key("payments", '{"payment_id": "p1", "order_id": "o7"}') == b"o7"
    assert record_key("customers_cdc", '{"op": "d", "before": {"customer_id": "C1"}, "after": null}') == b"C1"
    assert record_key("sensors", "{not json") is None
    assert record_key("clicks", "[1, 2]") is None
