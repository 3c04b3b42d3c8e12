"""The shared parser's verdict on ordinary lines, in Python, for lines already on the driver.

:func:`include.parsing.parse_topic` and :func:`include.parsing.with_reason` are the parser: their
rules decide what is valid and why a line is not, both layers run them. They are a Spark plan,
though, and a micro-batch of a few thousand lines paid a Spark job, its planning and its
generated code for it. This module *vouches* for the verdicts it can reach surely:

- a line it accepts is one the shared parser accepts, typed to the same record, event id, time
  and date;
- a line it rejects is one the shared parser rejects, for the same reason and with the same
  Bronze date: an ASCII object cut short, or strict JSON of ordinary values whose first problem
  (a missing field, a wrong type, a bad timestamp, a value outside a field's set, …) it finds
  by the shared parser's checks, in their order.

tests/include/test_line_parser.py checks both on every bad-input case, on mutations of valid
lines and on every cut of a line. Every other line (any it is not sure of: a number beyond
int64, a timestamp with nanoseconds, a zone offset past ±17:59, a key differing from a field's
only in case, non-ASCII text in a reason, a line over the size limit, …) goes to the shared
parser. Vouching only for what it is sure of keeps it a fast path, never a second set of rules.
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import cache, lru_cache
from typing import Any

import orjson
import pyarrow as pa

from include import ddl
from include.schemas import CDC_IMAGES, CDC_TS_MS_RANGE, CUSTOMER_ROW_FIELDS, ENUMS, TOPICS

INT64 = (-(2**63), 2**63)
# The shared parser's timestamp pattern with its parts captured, ASCII digits only, anchored at
# the very end (Java's '$' also matches before a final line break, which this leaves to Spark).
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MICROS_PER_DAY = 86_400_000_000
MILLIS_PER_DAY = 86_400_000
_ABSENT = object()
_CUT_SHORT = "unexpected end of data"  # orjson's error for a line that ends inside its JSON


class Unsure(Exception):
    """A line this parser does not vouch for: the shared parser decides it."""


@lru_cache(maxsize=65_536)
def _minute_seconds(minute: str) -> int:
    """``YYYY-MM-DDTHH:MM`` as seconds since the epoch, or :class:`Unsure` (no such day or time)."""
    hour, minutes = int(minute[11:13]), int(minute[14:16])
    if hour > 23 or minutes > 59:
        raise Unsure
    try:
        days = date(int(minute[:4]), int(minute[5:7]), int(minute[8:10])).toordinal() - 719_163  # 1970-01-01
    except ValueError:
        raise Unsure from None
    return ((days * 24 + hour) * 60 + minutes) * 60


def timestamp_micros(text: str) -> int:
    """An ISO-8601 timestamp as microseconds since the epoch (UTC), or :class:`Unsure`."""
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        raise Unsure
    second, fraction, utc, sign, zone_hours, zone_minutes = match.group(6, 7, 8, 9, 10, 11)
    second = int(second)
    if second > 59:
        raise Unsure
    seconds = _minute_seconds(text[:16]) + second
    micros = 0
    if fraction:
        if len(fraction) > 6 and fraction[6:].strip("0"):
            raise Unsure  # below a microsecond
        micros = int(fraction[:6].ljust(6, "0"))
    if not utc:
        if int(zone_hours) > 17 or int(zone_minutes) > 59:
            raise Unsure
        offset = (int(zone_hours) * 60 + int(zone_minutes)) * 60
        seconds += -offset if sign == "+" else offset
    return seconds * 1_000_000 + micros


def timestamp_is_bad(text: str) -> bool:
    """Whether the shared parser surely rejects ``text`` as a timestamp (False: surely takes it);
    :class:`Unsure` when only Spark's cast can tell."""
    if "\n" in text or "\r" in text or not text.isascii():
        raise Unsure  # Java's '$' matches before a final line break; \\d of other scripts
    match = _TIMESTAMP.fullmatch(text)
    if match is None:
        return True
    try:
        timestamp_micros(text)
    except Unsure:
        month, day, hour, minute = (int(part) for part in match.group(2, 3, 4, 5))
        if not 1 <= month <= 12 or not 1 <= day <= 31 or hour > 23 or minute > 59:
            return True  # no calendar has it; a 30 February or a 60th second is Spark's to judge
        raise
    return False


def _json_type(kind: ddl.Type) -> str:
    """The JSON type the shared parser requires of a field (include/parsing.py ``_json_type``)."""
    if isinstance(kind, ddl.Struct):
        return "object"
    return {"string": "string", "double": "number", "bigint": "integer", "timestamp": "timestamp"}[kind]


def _has_type(value: Any, json_type: str) -> bool:
    kind = type(value)
    if json_type in ("string", "timestamp"):
        return kind is str
    if json_type == "integer":
        return kind is int
    if json_type == "number":
        return kind is int or kind is float
    return kind is dict


def _shown(text: str) -> str:
    """A value as a reason quotes it: its first 64 characters."""
    if not text.isascii():
        raise Unsure  # Spark counts UTF-8 code points; Python's surrogates differ
    return text[:64]


def _first_problem(line: dict, fields: tuple[ddl.Field, ...], enums: dict[str, tuple[str, ...]],
                   prefix: str = "") -> str | None:
    """The shared parser's first field problem (include/parsing.py ``_field_problems``)."""
    for field in fields:
        path = prefix + field.name
        value = line.get(field.name, _ABSENT)
        if value is _ABSENT or value is None:
            if field.nullable:
                continue
            return f"missing field '{path}'" if value is _ABSENT else f"null value for required field '{path}'"
        json_type = _json_type(field.type)
        if not _has_type(value, json_type):
            return f"wrong type for '{path}': expected {json_type}"
        if json_type == "timestamp" and timestamp_is_bad(value):
            return f"bad timestamp '{_shown(value)}'"
        allowed = enums.get(field.name)
        if allowed and value not in allowed:
            return f"invalid value for '{path}': '{_shown(value)}' (expected {', '.join(allowed)})"
    return None


def _ordinary(value: Any) -> bool:
    """Whether every number in ``value`` is one Spark's JSON reader surely takes as it is."""
    kind = type(value)
    if kind is int:
        return INT64[0] <= value < INT64[1]
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(_ordinary(item) for item in value.values())
    if kind is list:
        return all(_ordinary(item) for item in value)
    return True


def _number(value: Any) -> float:
    kind = type(value)
    if kind is float and math.isfinite(value):
        return value
    if kind is int and INT64[0] <= value < INT64[1]:
        return float(value)
    raise Unsure


def _integer(value: Any) -> int:
    if type(value) is not int or not INT64[0] <= value < INT64[1]:
        raise Unsure
    return value


def _timestamp(value: Any) -> int:
    if type(value) is not str:
        raise Unsure
    return timestamp_micros(value)


Converter = Callable[[Any], Any] | None


def _converter(kind: ddl.Type, allowed: tuple[str, ...] | None) -> Converter:
    if isinstance(kind, ddl.Struct):
        fields = _fields(kind.fields, {})

        def struct(value: Any) -> dict:
            if type(value) is not dict:
                raise Unsure
            return dict(zip((name for name, _, _ in fields), _values(value, fields)))
        return struct
    if allowed:
        def member(value: Any) -> str:
            if value not in allowed or type(value) is not str:
                raise Unsure
            return value
        return member
    return {"string": None, "double": _number, "bigint": _integer, "timestamp": _timestamp}[kind]  # None: a string


def _fields(fields: tuple[ddl.Field, ...], enums: dict[str, tuple[str, ...]]) -> list[tuple[str, bool, Converter]]:
    return [(field.name, field.nullable, _converter(field.type, enums.get(field.name))) for field in fields]


def _values(line: dict, fields: list[tuple[str, bool, Converter]]) -> list:
    """The typed values of a JSON object's fields, in declaration order (absent or null: None)."""
    values = []
    append = values.append
    for name, nullable, convert in fields:
        value = line.get(name)
        if value is None:
            if not nullable:
                raise Unsure
            append(None)
        elif convert is None:  # a string: most fields, checked inline
            if type(value) is not str:
                raise Unsure
            append(value)
        else:
            append(convert(value))
    return values


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise Unsure  # the shared parser reads the CDC envelope whole, and rejects repeated keys
    return found


def _reject_constant(_: str) -> None:
    raise Unsure  # NaN, Infinity: not JSON


class TopicParser:
    """Parses one topic's lines; see the module's docstring."""

    def __init__(self, topic: str, max_line_bytes: int) -> None:
        self.topic, self.max_line_bytes = topic, max_line_bytes
        declared = ddl.parse(TOPICS[topic].fields)
        self.fields = _fields(declared, {field: values for (name, field), values in ENUMS.items() if name == topic})
        self.image_fields = ddl.parse(CUSTOMER_ROW_FIELDS)
        self.declared = declared
        self.enums = {field: values for (name, field), values in ENUMS.items() if name == topic}
        self.names = [field.name for field in declared]
        self.lowered = {name.lower() for name in self.names}
        self.record_type = pa.struct(ddl.arrow_schema(ddl.nullable(TOPICS[topic].fields)))
        self.envelope = topic == "customers_cdc"
        time_field = "ts_ms" if self.envelope else "event_time"
        self.time_at = self.names.index(time_field)

    def _load(self, value: bytes) -> dict:
        if len(value) > self.max_line_bytes:
            raise Unsure
        try:
            line = orjson.loads(value)
            if self.envelope:  # its rules read the line whole: a repeated key anywhere is invalid JSON
                json.loads(value, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except (orjson.JSONDecodeError, ValueError):
            raise Unsure from None
        if type(line) is not dict:
            raise Unsure
        for key in line:  # a key only a case-insensitive match would take: left to the parser
            if key not in self.names and key.lower() in self.lowered:
                raise Unsure
        return line

    def event(self, value: bytes) -> tuple[list, int, str]:
        """A line's typed values (declaration order), event time in microseconds and event id;
        :class:`Unsure` unless vouched for."""
        line = self._load(value)
        values = _values(line, self.fields)
        if self.envelope:
            op, ts_ms, before, after = values
            for image, ops in CDC_IMAGES.items():
                if op in ops and (after if image == "after" else before) is None:
                    raise Unsure
            if not CDC_TS_MS_RANGE[0] <= ts_ms <= CDC_TS_MS_RANGE[1]:
                raise Unsure
            customer = (after or before)["customer_id"]
            return values, ts_ms * 1000, f"{customer}|{ts_ms}"
        micros = values[self.time_at]
        if self.topic == "sensors":
            try:
                at = EPOCH + timedelta(microseconds=micros)
            except OverflowError:  # a UTC year 0 or 10000
                raise Unsure from None
            return values, micros, (f"{values[0]}|{at.year:04d}-{at.month:02d}-{at.day:02d}T{at.hour:02d}:"
                                    f"{at.minute:02d}:{at.second:02d}.{at.microsecond // 1000:03d}Z")
        return values, micros, values[self.names.index(TOPICS[self.topic].id_fields[0])]

    def rejection(self, value: bytes) -> tuple[str, int | None]:
        """The reason the shared parser rejects a line for, and the line's Bronze date (days since
        the epoch, or None: :func:`include.parsing.bronze_event_date`); :class:`Unsure` unless
        sure, or if the line has no problem."""
        if len(value) > self.max_line_bytes or not value.isascii():
            raise Unsure
        try:
            line = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            # An object cut short: every reader fails at its end, whatever it tolerates before.
            if value.startswith(b"{") and error.msg.startswith(_CUT_SHORT) and error.pos == len(value):
                return "invalid JSON", None
            raise Unsure from None
        try:  # repeated keys: Spark's whole-line reader rejects them, its field reader takes one
            json.loads(value, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
        except ValueError:
            raise Unsure from None
        if type(line) is not dict or not _ordinary(line):
            raise Unsure
        for key in line:
            if key not in self.names and key.lower() in self.lowered:
                raise Unsure
        reason = self._problem(line)
        if reason is None:
            raise Unsure
        return reason, self._bronze_day(line)

    def _problem(self, line: dict) -> str | None:
        """:func:`include.parsing.precise_reason`'s checks after the JSON ones, in its order."""
        problem = _first_problem(line, self.declared, self.enums)
        if problem or not self.envelope:
            return problem
        ts_ms = line["ts_ms"]
        if not CDC_TS_MS_RANGE[0] <= ts_ms <= CDC_TS_MS_RANGE[1]:
            return f"ts_ms out of range: {ts_ms} (years 1 to 9999)"
        for image, ops in CDC_IMAGES.items():
            row = line.get(image)
            if row is None:
                if line["op"] in ops:
                    return f"missing field '{image}' for op '{line['op']}'"
                continue
            problem = _first_problem(row, self.image_fields, {}, prefix=f"{image}.")
            if problem:
                return problem
        return None

    def _bronze_day(self, line: dict) -> int | None:
        """Bronze's date of a rejected line: its time field read alone as text, if it parses."""
        if self.envelope:
            ts_ms = line.get("ts_ms")
            if type(ts_ms) is int:
                return ts_ms // MILLIS_PER_DAY if CDC_TS_MS_RANGE[0] <= ts_ms <= CDC_TS_MS_RANGE[1] else None
            if type(ts_ms) is float or (type(ts_ms) is str and any(c.isdigit() for c in ts_ms)):
                raise Unsure  # Spark's cast of such text to bigint decides
            return None  # null, true, an object, text without a digit: no number
        stamp = line.get("event_time")
        if type(stamp) is not str or timestamp_is_bad(stamp):
            return None  # a number or an object is read as its JSON text, no timestamp
        return timestamp_micros(stamp) // MICROS_PER_DAY

    def parse(self, lines: pa.Array) -> Parsed:
        """The lines it vouches for, accepted or rejected."""
        collecting = gc.isenabled()
        gc.disable()  # the events kept here are many small containers: each collection would scan them all
        try:
            return self._parse(lines)
        finally:
            if collecting:
                gc.enable()

    def _parse(self, lines: pa.Array) -> Parsed:
        accepted, rejected, events, rejections = [], [], [], []
        event, rejection = self.event, self.rejection
        for value in lines.to_pylist():
            try:
                events.append(event(value))
            except Unsure:
                accepted.append(False)
                try:
                    rejections.append(rejection(value))
                except Unsure:
                    rejected.append(False)
                else:
                    rejected.append(True)
            else:
                accepted.append(True)
                rejected.append(False)
        typed, times, ids = zip(*events) if events else ((), (), ())
        columns = zip(*typed) if typed else [() for _ in self.names]
        record = pa.StructArray.from_arrays(
            [pa.array(column, field.type) for column, field in zip(columns, self.record_type)],
            fields=list(self.record_type))
        event_time = pa.array(times, pa.timestamp("us", tz="UTC"))
        day = pa.array([t // MICROS_PER_DAY for t in times], pa.int32()).cast(pa.date32())
        reasons, days = zip(*rejections) if rejections else ((), ())
        return Parsed(
            pa.array(accepted, pa.bool_()),
            pa.table({"event_id": pa.array(ids, pa.string()), "event_time": event_time, "event_date": day,
                      "record": record}),
            pa.array(rejected, pa.bool_()),
            pa.table({"reason": pa.array(reasons, pa.string()),
                      "bronze_date": pa.array(days, pa.int32()).cast(pa.date32())}),
        )


@dataclass(frozen=True)
class Parsed:
    """:meth:`TopicParser.parse`'s verdicts: a line neither accepted nor rejected is Spark's to decide."""

    accepted: pa.Array  # per line, whether it vouches the shared parser accepts it
    events: pa.Table  # of the accepted lines: event_id, event_time, event_date and the typed record
    rejected: pa.Array  # per line, whether it vouches the shared parser rejects it
    rejections: pa.Table  # of the rejected lines: reason, bronze_date


@cache
def topic_parser(topic: str, max_line_bytes: int) -> TopicParser:
    return TopicParser(topic, max_line_bytes)


__all__ = ["Parsed", "TopicParser", "Unsure", "timestamp_micros", "topic_parser"]
