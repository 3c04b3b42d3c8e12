"""The shared parser: valid lines become typed events; every rejected line gets a precise reason."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from include.parsing import bronze_event_date, parse_topic, with_reason

ORDER = {"order_id": "o1", "user_id": "u1", "product_id": "p1", "category": "books", "amount": 12.5,
         "event_time": "2026-11-20T10:00:00Z"}


def line(**changes):
    record = {**ORDER, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not ...}).encode()


CASES = [
    ("invalid JSON", b'{"order_id": "o1", "amount": '),
    ("invalid UTF-8", b'{"order_id": "\xff\xfe"}'),
    ("line too long: 2100 bytes (limit 2048)", b"x" * 2100),
    ("not a JSON object", b"[1, 2, 3]"),
    ("missing field 'amount'", line(amount=...)),
    ("missing field 'event_time'", line(event_time=...)),
    ("null value for required field 'user_id'", line(user_id=None)),
    ("wrong type for 'amount': expected number", line(amount="12.50")),
    ("wrong type for 'order_id': expected string", line(order_id=17)),
    ("wrong type for 'event_time': expected timestamp", line(event_time=1763632800)),
    ("bad timestamp '2026-13-45T99:00:00Z'", line(event_time="2026-13-45T99:00:00Z")),
    ("bad timestamp '2026-11-20 10:00:00'", line(event_time="2026-11-20 10:00:00")),
    ("bad timestamp '2026-11-20T10:00:00'", line(event_time="2026-11-20T10:00:00")),
    ("invalid JSON", b""),
    ("wrong type for 'user_id': expected string", line(user_id=12345)),
    ("wrong type for 'category': expected string", line(category={"name": "books"})),
    ("invalid JSON", line()[:-1] + b', "x": [1}'),
]


@pytest.mark.parametrize(("expected", "raw"), CASES, ids=[c[0] for c in CASES])
def test_each_bad_line_gets_a_precise_reason(spark, expected, raw):
    parsed = parse_topic(spark.createDataFrame([(bytearray(raw),)], "value binary"), "orders", max_line_bytes=2048)
    row = with_reason(parsed, "orders", max_line_bytes=2048).collect()[0]
    assert row["reason"] == expected
    assert row["rejected"] and row["record"] is None and row["event_time"] is None


CDC_CASES = [
    ("invalid value for 'op': 'x' (expected c, u, d, r)", {"op": "x", "ts_ms": 1, "after": {"customer_id": "C1"}}),
    ("wrong type for 'ts_ms': expected integer", {"op": "c", "ts_ms": "yesterday", "after": {"customer_id": "C1"}}),
    ("missing field 'after' for op 'c'", {"op": "c", "ts_ms": 1, "after": None}),
    ("missing field 'before' for op 'd'", {"op": "d", "ts_ms": 1, "after": None}),
    ("missing field 'after.customer_id'", {"op": "u", "ts_ms": 1, "after": {"name": "x"}}),
    ("wrong type for 'after': expected object", {"op": "u", "ts_ms": 1, "after": "C1"}),
    # Beyond Spark's timestamps: its conversion would fail the whole micro-batch.
    ("ts_ms out of range: 9223372036854775807 (years 1 to 9999)",
     {"op": "c", "ts_ms": 2**63 - 1, "after": {"customer_id": "C1"}}),
    ("ts_ms out of range: -62135596800001 (years 1 to 9999)",
     {"op": "c", "ts_ms": -62135596800001, "after": {"customer_id": "C1"}}),
]


@pytest.mark.parametrize(("expected", "record"), CDC_CASES, ids=[c[0] for c in CDC_CASES])
def test_cdc_envelope_rules(spark, expected, record):
    raw = bytearray(json.dumps(record).encode())
    parsed = parse_topic(spark.createDataFrame([(raw,)], "value binary"), "customers_cdc")
    assert with_reason(parsed, "customers_cdc").collect()[0]["reason"] == expected


def test_valid_lines_are_typed_and_times_normalised_to_utc(spark):
    lines = [
        line(event_time="2026-11-20T11:00:00.250+01:00", extra_field="ignored"),
        line(order_id="o2", amount=3),
    ]
    raw = spark.createDataFrame([(bytearray(x),) for x in lines], "value binary")
    rows = with_reason(parse_topic(raw, "orders"), "orders").collect()
    assert [(r["rejected"], r["reason"]) for r in rows] == [(False, None), (False, None)]
    # Collected timestamps are naive in the session time zone, which is UTC.
    assert rows[0]["event_time"] == datetime(2026, 11, 20, 10, 0, 0, 250000)
    assert rows[0]["event_id"] == "o1" and rows[0]["record"]["amount"] == 12.5
    assert rows[1]["record"]["amount"] == 3.0
    assert str(rows[0]["event_date"]) == "2026-11-20"


def test_typed_values_are_the_values_checked(spark):
    """The typed read and the type checks see the same value of each field: escapes decoded, a
    repeated key resolved the same way (the last one), an integer widened where a number is due."""
    lines = [
        line(user_id="u\u00e9\n1", amount=4),
        line()[:-1] + b', "category": 7, "category": "toys"}',
        line()[:-1] + b', "category": "toys", "category": 7}',
    ]
    rows = parse_topic(spark.createDataFrame([(bytearray(x),) for x in lines], "value binary"), "orders").collect()
    assert [r["rejected"] for r in rows] == [False, False, True]
    assert rows[0]["record"]["user_id"] == "u\u00e9\n1" and rows[0]["record"]["amount"] == 4.0
    assert rows[1]["record"]["category"] == "toys"


def test_event_ids_of_every_topic(spark):
    lines = [
        ("sensors", {"device_id": "D1", "temperature": 20.5, "humidity": 40, "event_time": "2026-11-20T10:00:00.037Z"}),
        ("customers_cdc", {"op": "d", "ts_ms": 1763632800000, "before": {"customer_id": "C7"}, "after": None}),
        ("clicks", {"event_id": "e1", "user_id": "u", "session_id": "s", "page_url": "/", "action": "view",
                    "device_type": "mobile", "event_time": "2026-11-20T10:00:00Z"}),
        ("payments", {"payment_id": "p1", "order_id": "o1", "amount": 1.5, "method": "card",
                      "event_time": "2026-11-20T10:00:00Z"}),
    ]
    rows = {
        topic: parse_topic(spark.createDataFrame([(bytearray(json.dumps(record).encode()),)], "value binary"),
                           topic).first()
        for topic, record in lines
    }
    assert {t: r["rejected"] for t, r in rows.items()} == dict.fromkeys(rows, False)
    assert rows["sensors"]["event_id"] == "D1|2026-11-20T10:00:00.037Z"
    assert rows["customers_cdc"]["event_id"] == "C7|1763632800000"
    assert rows["clicks"]["event_id"] == "e1" and rows["payments"]["event_id"] == "p1"
    assert rows["customers_cdc"]["record"]["before"]["customer_id"] == "C7"


def test_lines_of_several_topics_get_their_own_topics_reasons(spark):
    """The DLQ's writer names the reasons of rejected lines of every topic at once, by their
    ``topic`` column; a valid line keeps a NULL reason."""
    from pyspark.sql import functions as F

    lines = [("orders", line(amount="12.50")), ("payments", line()), ("customers_cdc", b'{"op": "x", "ts_ms": 1}'),
             ("orders", line())]
    parsed = [parse_topic(spark.createDataFrame([(bytearray(raw),)], "value binary"), topic)
              .withColumn("topic", F.lit(topic)).select("topic", "value", "rejected") for topic, raw in lines]
    rows = with_reason(parsed[0].unionByName(parsed[1]).unionByName(parsed[2]).unionByName(parsed[3])).collect()
    assert [(r["topic"], r["reason"]) for r in rows] == [
        ("orders", "wrong type for 'amount': expected number"),
        ("payments", "missing field 'payment_id'"),
        ("customers_cdc", "invalid value for 'op': 'x' (expected c, u, d, r)"),
        ("orders", None),
    ]


def test_unknown_topic_is_rejected(spark):
    with pytest.raises(ValueError, match="unknown topic 'nope'"):
        parse_topic(spark.createDataFrame([(bytearray(b"{}"),)], "value binary"), "nope")


BRONZE_DATE_CASES = [
    ("orders", line(), "2026-11-20"),
    ("orders", line(event_time="2026-11-20T23:30:00-02:00"), "2026-11-21"),  # the UTC day
    ("orders", line(event_time="2026-11-20T00:30:00+01:00"), "2026-11-19"),
    ("orders", line(amount="12.50"), "2026-11-20"),  # rejected, but its time is readable
    ("orders", line(event_time=1763632800), None),
    ("orders", line(event_time={"at": "2026-11-20T10:00:00Z"}), None),
    # A duplicated key: the parser takes the last value (get_json_object took the first, so such
    # a line was kept in Bronze under a day the batch did not read it for).
    ("orders", line()[:-1] + b', "event_time": "2026-11-21T10:00:00Z"}', "2026-11-21"),
    # An escaped key is the same key to the parser.
    ("orders", line(event_time=...)[:-1] + b', "event\\u005ftime": "2026-11-21T10:00:00Z"}', "2026-11-21"),
    ("orders", b'{"order_id": "o1", "amount": ', None),
    ("orders", b"[1, 2, 3]", None),
    ("customers_cdc", json.dumps({"op": "c", "ts_ms": 1795240800000, "after": {"customer_id": "C1"}}).encode(),
     "2026-11-21"),
    ("customers_cdc", json.dumps({"op": "c", "ts_ms": "soon", "after": {"customer_id": "C1"}}).encode(), None),
    ("customers_cdc", json.dumps({"op": "c", "ts_ms": 2**63 - 1, "after": {"customer_id": "C1"}}).encode(), None),
]


@pytest.mark.parametrize(("topic", "raw", "expected"), BRONZE_DATE_CASES)
def test_bronze_event_date_is_the_parsed_event_date(spark, topic, raw, expected):
    """Bronze's partition (read without a full parse) is the day the parser gives a valid line."""
    lines = spark.createDataFrame([(bytearray(raw),)], "value binary")
    row = (parse_topic(lines, topic).select("rejected", "event_date", bronze_event_date(topic).alias("bronze_date"))
           .collect()[0])
    bronze = row["bronze_date"] and row["bronze_date"].isoformat()
    if not row["rejected"]:
        assert bronze == row["event_date"].isoformat()
    assert bronze == expected
