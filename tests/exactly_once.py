"""The check every crash test ends with: each landed line in Bronze once, each valid event in
Silver once, each corrupt line in the DLQ, against the generator's ledger."""

from __future__ import annotations

from include import tables
from include.lakehouse.base import LakehouseStore
from include.schemas import TOPIC_NAMES


def assert_every_line_once(store: LakehouseStore, ledger: dict) -> None:
    for topic in TOPIC_NAMES:
        truth = ledger["topics"][topic]
        assert store.read(tables.bronze(topic)).count() == truth["lines"], topic
        silver = store.read(tables.silver(topic))
        assert silver.count() == truth["valid"] == silver.select("event_id").distinct().count(), topic
    assert store.read(tables.DLQ).count() == sum(t["corrupt"] for t in ledger["topics"].values())
