"""The local broker is the one docker-compose.yml runs: same Kafka version, same settings."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from include.kafka_broker import KAFKA_VERSION, server_properties

PROJECT = Path(__file__).resolve().parents[2]


def kafka_service() -> dict:
    return yaml.safe_load((PROJECT / "docker-compose.yml").read_text())["services"]["kafka"]


def test_the_broker_is_the_version_compose_runs():
    default_tag = re.fullmatch(r"apache/kafka:\$\{KAFKA_IMAGE_TAG:-([^}]+)\}", kafka_service()["image"]).group(1)
    assert KAFKA_VERSION == default_tag


def test_the_broker_sets_what_compose_sets(tmp_path):
    compose = {name.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
               for name, value in kafka_service()["environment"].items()}
    local = server_properties(tmp_path, 9092, 9093)
    # Every compose setting is set here too; only the listeners (one host, no EXTERNAL) and the
    # log folder differ, and the single-node values are the same.
    assert set(compose) <= set(local)
    for key in ("node.id", "process.roles", "controller.listener.names", "inter.broker.listener.name",
                "offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "transaction.state.log.min.isr", "auto.create.topics.enable"):
        assert local[key] == compose[key], key
    assert local["log.retention.hours"] == re.search(r":-(\d+)", compose["log.retention.hours"]).group(1)
    assert local["num.partitions"] == re.search(r":-(\d+)", compose["num.partitions"]).group(1)
