"""Producing the generated lines to Kafka (the cluster deployment's event bus).

Each line becomes one record on the topic of the same name: the value is the line's exact
bytes (as in a landing file), the key is the event's entity id (``Topic.entity_field``), so
every entity's events stay in one partition, in the order they were generated. A line that is
not valid JSON has no key and still arrives: the stream sends it to the DLQ as it would a landed
line. The producer is idempotent (no duplicates on retries, order kept per partition).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from include.schemas import TOPICS

DELIVERY_TIMEOUT_SECONDS = 60


class KafkaUnavailable(RuntimeError):
    """The brokers could not be reached, or refused the topics or the records."""


def record_key(topic: str, line: str) -> bytes | None:
    """The entity id of a line (CDC rows: from ``after``, else ``before``); None when it has none."""
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict):
        return None
    field = TOPICS[topic].entity_field
    if topic == "customers_cdc":
        event = event.get("after") or event.get("before") or {}
        if not isinstance(event, dict):
            return None
    value = event.get(field)
    return None if value is None else str(value).encode()


class KafkaSink:
    """Writes lines as records; ``write`` has the landing zone's signature so a generator run
    lands or produces the same lines in the same order."""

    def __init__(self, bootstrap_servers: str, partitions: int, topics: Sequence[str] = tuple(TOPICS)) -> None:
        from confluent_kafka import Producer

        self.bootstrap_servers = bootstrap_servers
        ensure_topics(bootstrap_servers, topics, partitions)
        self._errors: list[str] = []
        self._producer = Producer({
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,  # acks=all, retries keep order and add no duplicates
            "linger.ms": 20,
            "compression.type": "lz4",
        })

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._errors.append(f"{message.topic()}: {error}")

    def write(self, topic: str, name: str, lines: Iterable[str]) -> str:
        for line in lines:
            while True:
                try:
                    self._producer.produce(topic, value=line.encode(), key=record_key(topic, line),
                                           headers={"lambdalake-batch": name}, on_delivery=self._delivered)
                    break
                except BufferError:  # local queue full: let deliveries drain it
                    self._producer.poll(0.5)
            self._producer.poll(0)
        self._raise_errors()
        return f"kafka://{self.bootstrap_servers}/{topic}"

    def flush(self) -> None:
        """Wait until every record is acknowledged; raise if any was not."""
        left = self._producer.flush(DELIVERY_TIMEOUT_SECONDS)
        if left:
            raise KafkaUnavailable(f"{left} records not acknowledged by {self.bootstrap_servers} "
                                   f"within {DELIVERY_TIMEOUT_SECONDS} s")
        self._raise_errors()

    def _raise_errors(self) -> None:
        if self._errors:
            raise KafkaUnavailable(f"{len(self._errors)} records failed, e.g. {self._errors[0]}")


def ensure_topics(bootstrap_servers: str, topics: Sequence[str], partitions: int) -> None:
    """Create the missing topics with ``partitions`` partitions; existing ones are left as they are."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        existing = admin.list_topics(timeout=15).topics
    except KafkaException as exc:
        raise KafkaUnavailable(f"cannot reach Kafka at {bootstrap_servers}: {exc.args[0]}") from None
    missing = [NewTopic(topic, num_partitions=partitions, replication_factor=-1)
               for topic in topics if topic not in existing]
    for topic, future in (admin.create_topics(missing) if missing else {}).items():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaUnavailable(f"cannot create topic {topic} on {bootstrap_servers}: {exc.args[0]}") from None
