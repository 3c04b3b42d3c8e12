"""The shared parser's verdict on well-formed lines, in Python, for lines already on the driver.

:func:`include.parsing.parse_topic` is the parser: its rules decide what is valid, both layers
run it. It is a Spark plan, though, and a micro-batch of a few thousand lines paid a Spark job,
its planning and its generated code for it. This module *vouches* for the lines it can: a line it
vouches for is one the shared parser accepts, typed to the same record, event id, time and date
(tests/include/test_line_parser.py checks that on every bad-input case and on mutations of valid
lines). Every other line (a rejected one, or any it is not sure of: a number beyond int64, a
timestamp with nanoseconds, a zone offset past ±17:59, a key differing from a field's only in
case, …) goes to the shared parser, which decides it and names the reason of a rejected one.
Vouching only for what it is sure of keeps it a fast path, never a second set of rules.
"""

from __future__ import annotations

import gc
import json
import math
import re
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from functools import cache, lru_cache
from typing import Any

import orjson
import pyarrow as pa

from include import ddl
from include.schemas import CDC_IMAGES, CDC_TS_MS_RANGE, ENUMS, TOPICS

INT64 = (-(2**63), 2**63)
# The shared parser's timestamp pattern with its parts captured, ASCII digits only, anchored at
# the very end (Java's '$' also matches before a final line break, which this leaves to Spark).
_TIMESTAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,9}))?(?:(Z)|([+-])([0-9]{2}):([0-9]{2}))",
    re.ASCII)
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MICROS_PER_DAY = 86_400_000_000


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

    def parse(self, lines: pa.Array) -> tuple[pa.Array, pa.Table]:
        """Which lines it vouches for, and those lines' ``event_id``, ``event_time``,
        ``event_date`` and ``record`` as the shared parser types them."""
        collecting = gc.isenabled()
        gc.disable()  # the events kept here are many small containers: each collection would scan them all
        try:
            return self._parse(lines)
        finally:
            if collecting:
                gc.enable()

    def _parse(self, lines: pa.Array) -> tuple[pa.Array, pa.Table]:
        vouched, events = [], []
        event = self.event
        for value in lines.to_pylist():
            try:
                events.append(event(value))
            except Unsure:
                vouched.append(False)
            else:
                vouched.append(True)
        typed, times, ids = zip(*events) if events else ((), (), ())
        columns = zip(*typed) if typed else [() for _ in self.names]
        record = pa.StructArray.from_arrays(
            [pa.array(column, field.type) for column, field in zip(columns, self.record_type)],
            fields=list(self.record_type))
        event_time = pa.array(times, pa.timestamp("us", tz="UTC"))
        day = pa.array([t // MICROS_PER_DAY for t in times], pa.int32()).cast(pa.date32())
        return pa.array(vouched, pa.bool_()), pa.table({
            "event_id": pa.array(ids, pa.string()), "event_time": event_time, "event_date": day, "record": record})


@cache
def topic_parser(topic: str, max_line_bytes: int) -> TopicParser:
    return TopicParser(topic, max_line_bytes)


__all__ = ["TopicParser", "Unsure", "timestamp_micros", "topic_parser"]
