"""The driver's parser vouches only for verdicts the shared parser reaches, alike.

Every line below goes through both: :func:`include.parsing.parse_topic` and
:func:`include.parsing.with_reason` on Spark, and :class:`include.line_parser.TopicParser`. A line
the driver's parser accepts must be valid to Spark with the same record, event id, event time and
event date, to the last bit of a double; a line it rejects must be rejected by Spark for the same
reason, with the same Bronze date. What it does not vouch for is left to Spark, so the only other
requirement is that it decides the traffic producers send (every line of the generator, corrupt
ones included).
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from include.generator.simulation import Simulator, TrafficOptions
from include.line_parser import topic_parser
from include.parsing import bronze_event_date, parse_topic, with_reason
from include.schemas import TOPICS

RAW = "__raw__"  # a value written into the line as it is (numbers in forms json.dumps never writes)

PAYLOADS = {
    "orders": {"order_id": "o1", "user_id": "u1", "product_id": "p1", "category": "books", "amount": 12.5,
               "event_time": "2026-11-20T10:00:00Z"},
    "payments": {"payment_id": "p1", "order_id": "o1", "amount": 1.5, "method": "card",
                 "event_time": "2026-11-20T10:00:00Z"},
    "clicks": {"event_id": "e1", "user_id": "u", "session_id": "s", "page_url": "/", "action": "view",
               "device_type": "mobile", "product_id": None, "event_time": "2026-11-20T10:00:00Z"},
    "sensors": {"device_id": "D1", "temperature": 20.5, "humidity": 40, "event_time": "2026-11-20T10:00:00.037Z"},
    "customers_cdc": {"op": "u", "ts_ms": 1763632800000,
                      "before": {"customer_id": "C7", "name": "A", "email": None, "segment": "gold", "country": "DE"},
                      "after": {"customer_id": "C7", "name": "B", "email": "b@x", "segment": "vip", "country": "DE"}},
}

VALUES = [None, ..., 0, 1, -1, 17.0, 1.5, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, True, False,
          "", "x", "17", "12.50", "view", "c", "d", {}, {"customer_id": "C1"}, {"customer_id": 1}, [], ["a"],
          "\u00e9\n\t\"\\", "\x00"]
NUMBERS = ["-0", "-0.0", "0.0", "1E2", "1e-400", "0.1", "123456789012345678901234567890", "1.7976931348623157e308",
           "4.9e-324", "2.2250738585072011e-308", "0.30000000000000004", "9007199254740993", "1.0e+0", "-1e2",
           "12345678901234567890", "-9223372036854775808", "9223372036854775807", "9223372036854775808",
           "1e999", "NaN", "Infinity", "01", "1.", ".5", "+1", "0x10"]
TIMESTAMPS = [
    "2026-11-20T10:00:00Z", "2026-11-20T10:00:00.1Z", "2026-11-20T10:00:00.123456Z", "2026-11-20T10:00:00.1234567Z",
    "2026-11-20T10:00:00.123456000Z", "2026-11-20T10:00:00.123456789Z", "2026-11-20T10:00:00.999999999Z",
    "2026-11-20T10:00:00+18:00", "2026-11-20T10:00:00+17:59", "2026-11-20T10:00:00-18:00",
    "2026-11-20T10:00:00+18:01", "2026-11-20T10:00:00+19:00", "2026-11-20T10:00:00-00:00",
    "2026-11-20T10:00:00+00:60", "2026-11-20T10:00:00+05:30", "2026-11-20T23:30:00-02:00",
    "2024-02-29T12:00:00Z", "2023-02-29T12:00:00Z", "2026-04-31T00:00:00Z", "0999-12-31T23:59:59Z",
    "1000-01-01T00:00:00+01:00", "1000-01-01T00:30:00Z", "1969-12-31T23:59:59.999Z", "1970-01-01T00:00:00Z",
    "9998-12-31T23:59:59Z", "9999-12-31T23:59:59Z", "9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00Z",
    "2026-11-20T24:00:00Z", "2026-11-20T23:60:00Z", "2026-11-20T23:59:60Z", "2026-11-20T10:00:00z",
    "2026-11-20t10:00:00Z", "2026-11-20T10:00:00Z\n", " 2026-11-20T10:00:00Z", "2026-11-20T10:00:00Z ",
    "\u0662\u0660\u0662\u0666-11-20T10:00:00Z", "2026-11-20T10:00:00+0100", "2026-11-20T10:00:00.Z",
    "2026-11-20T10:00Z", "2026-11-20 10:00:00Z", "2026-13-45T99:00:00Z", "2026-00-10T10:00:00Z",
    "2026-11-00T10:00:00Z", "+2026-11-20T10:00:00Z", "2026-11-20T10:00:00.000000001Z",
]


def _present(payload: dict) -> dict:
    """``payload`` without its fields set to ``...`` (absent), nested ones too."""
    return {key: _present(value) if isinstance(value, dict) else value
            for key, value in payload.items() if value is not ...}


def _line(payload: dict, raw: str | None = None) -> bytes:
    text = json.dumps(_present(payload))
    return (text.replace(json.dumps(RAW), raw) if raw is not None else text).encode()


def _mutations(topic: str) -> list[bytes]:
    """Each field of a valid line (nested ones too) set to odd values, odd numbers and odd
    timestamps; keys repeated, escaped, in another case; odd framing of the line."""
    base = PAYLOADS[topic]
    lines = [_line(base)]

    def variants(payload: dict, path: tuple[str, ...]) -> list[bytes]:
        found = []
        for key, value in payload.items():
            def put(new, key=key) -> dict:
                copy = json.loads(json.dumps(payload))
                copy[key] = new
                return copy
            changed = [put(v) for v in [*VALUES, *TIMESTAMPS]]
            found += [_rebuild(base, path, c) for c in changed]
            found += [_line(_rebuild_dict(base, path, put(RAW)), raw) for raw in NUMBERS]
            if isinstance(value, dict):
                found += variants(value, (*path, key))
        return found

    lines += variants(base, ())
    text = _line(base).decode()
    first_key = next(iter(base))
    lines += [
        (text[:-1] + f', "{first_key}": "again"}}').encode(),
        (text[:-1] + f', "{first_key}": 5}}').encode(),
        (text[:-1] + f', "{first_key.upper()}": "x"}}').encode(),
        (text[:-1] + ', "extra": {"a": 1, "a": 2}, "more": [1, {"b": null}]}').encode(),
        (text[:-1] + ', "extra": 1e999}').encode(),
        text.replace(f'"{first_key}"', '"' + "".join(f"\\u{ord(c):04x}" for c in first_key) + '"').encode(),
        b"\xef\xbb\xbf" + text.encode(), text.encode() + b"\r", b"  " + text.encode() + b"  ",
        text.encode() + b" x", text.encode() + b"{}", text.encode() + b"\n", text.replace(", ", ",").encode(),
        text.replace('"', "'").encode(), b"", b"{}", b"null", b"[]", b'"x"', text.encode() + b"\x00",
        text.replace("1", "\\u0031").encode(), text.encode().replace(b'"u', b'"\xff'),
        text.replace('": "', '": "\\ud800').encode(), text.replace('": "', '": "\\ud83d\\ude00').encode(),
        text.replace('": "', '": "\u00e9').encode("utf-8"),
    ]
    lines += [text[:end].encode() for end in range(len(text))]  # every cut
    lines += [text[:end].encode() + b" " for end in range(1, len(text), 7)]
    if topic == "customers_cdc":
        lines += [_line({**base, "op": op, "before": before, "after": after})
                  for op in ("c", "u", "d", "r") for before in (None, ..., {"customer_id": "C1"})
                  for after in (None, ..., {"customer_id": "C2"})]
        lines.append(text.replace('"name": "A"', '"name": "A", "name": "Z"').encode())
    return lines


def _rebuild_dict(base: dict, path: tuple[str, ...], inner: dict) -> dict:
    if not path:
        return inner
    copy = json.loads(json.dumps(base))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = inner
    return copy


def _rebuild(base: dict, path: tuple[str, ...], inner: dict) -> bytes:
    return _line(_rebuild_dict(base, path, inner))


def _generated() -> dict[str, list[tuple[bytes, bool]]]:
    """Two hours of the generator's lines, a fifth of them corrupted: (line, valid) per topic."""
    start = datetime(2026, 11, 20, tzinfo=timezone.utc)
    options = TrafficOptions(corrupt_fraction=0.2, devices=5, orders_per_hour=100)
    _, lines = Simulator(options, seed=7).lines(start, start + timedelta(hours=2))
    found: dict[str, list[tuple[bytes, bool]]] = {topic: [] for topic in TOPICS}
    for line in lines:
        found[line.topic].append((line.text.encode(), not line.kind.startswith("corrupt")))
    return found


def _canonical(value):  # noqa: ANN001, ANN202 - a value as text that tells -0.0 from 0.0
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float.hex(value)
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    return value


def _as_integers(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([field.with_type(_as_integers(field.type)) for field in kind])
    if pa.types.is_timestamp(kind):
        return pa.int64()
    return pa.int32() if pa.types.is_date32(kind) else kind


@pytest.fixture(scope="module")
def generated():
    return _generated()


@pytest.mark.parametrize("topic", list(TOPICS))
def test_what_the_driver_vouches_for_the_shared_parser_decides_alike(spark, generated, topic):
    lines = _mutations(topic) + [line for line, _ in generated[topic]]
    parsed = topic_parser(topic, 4096).parse(pa.array(lines, pa.binary()))
    accepted_here, rejected_here = parsed.accepted.to_pylist(), parsed.rejected.to_pylist()
    frame = spark.createDataFrame([(bytearray(x),) for x in lines], "value binary")
    theirs = (with_reason(parse_topic(frame, topic, max_line_bytes=4096), topic, max_line_bytes=4096)
              .withColumn("bronze_date", F.coalesce("event_date", bronze_event_date(topic)))
              .select("rejected", "reason", "bronze_date", "event_id", "event_time", "event_date", "record")
              .toArrow())
    # Compared as integers: Spark takes years Python's datetime cannot hold.
    ours = parsed.events
    reasons, bronze_dates = theirs["reason"].to_pylist(), theirs["bronze_date"].cast(pa.int32()).to_pylist()
    theirs = pa.table({"rejected": theirs["rejected"],
                       **{name: theirs[name].cast(_as_integers(ours.schema.field(name).type))
                          for name in ours.column_names}})
    ours = pa.table({name: ours[name].cast(_as_integers(ours.schema.field(name).type)) for name in ours.column_names})
    accepted = [not rejected for rejected in theirs["rejected"].to_pylist()]
    at = [i for i, sure in enumerate(accepted_here) if sure]  # ours holds the accepted lines only
    wrong = []
    for column in ("event_id", "event_time", "event_date", "record"):
        for i, mine in zip(at, ours[column].to_pylist()):
            spark_value = theirs[column][i].as_py()
            if not accepted[i] or _canonical(mine) != _canonical(spark_value):
                wrong.append((lines[i], column, mine, spark_value, accepted[i]))
    at = [i for i, sure in enumerate(rejected_here) if sure]
    ours_rejected = parsed.rejections
    ours_days = ours_rejected["bronze_date"].cast(pa.int32()).to_pylist()
    for i, reason, day in zip(at, ours_rejected["reason"].to_pylist(), ours_days):
        if accepted[i] or (reason, day) != (reasons[i], bronze_dates[i]):
            wrong.append((lines[i], "rejected", reason, day, reasons[i], bronze_dates[i]))
    assert not wrong, "\n".join(map(repr, wrong[:10]))
    # The fast path is the path: every line a producer sends, valid or corrupt, is decided here...
    produced = len(lines) - len(generated[topic])
    assert all(accepted_here[produced + i] == valid and rejected_here[produced + i] != valid
               for i, (_, valid) in enumerate(generated[topic]))
    # ...and the comparison above covered many lines of each kind.
    assert sum(accepted_here) >= 40 and sum(rejected_here) >= 200 and accepted.count(False) >= 40


def test_a_timestamp_is_read_to_the_microsecond_in_utc():
    from include.line_parser import Unsure, timestamp_micros

    at = datetime(2026, 11, 20, 9, 0, 0, 250000, tzinfo=timezone.utc)
    assert timestamp_micros("2026-11-20T10:00:00.25+01:00") == (at - datetime(1970, 1, 1, tzinfo=timezone.utc)) // \
        timedelta(microseconds=1)
    for unsure in ("2026-11-20T10:00:00.1234567Z", "2026-02-30T10:00:00Z", "2026-11-20T10:00:00+18:00"):
        with pytest.raises(Unsure):
            timestamp_micros(unsure)
