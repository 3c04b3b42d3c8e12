"""Parsing landed lines into typed events, shared by the speed and the batch layer.

Pure Column logic, no I/O. Every line gets either a typed ``record`` or a precise ``reason``
(the first check it fails), never neither: nothing is dropped silently. Validation is derived from
the schema constants: non-nullable fields are required, and the JSON type each Spark type needs
(``string``, ``number``, ``integer``, ``object``, an ISO-8601 ``timestamp``) is checked on the
parsed VARIANT, so ``"12.50"`` for ``amount`` is a wrong type rather than silently cast.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, StringType, StructType, TimestampType

from include.schemas import CDC_OPS, CLICK_ACTIONS, CUSTOMER_ROW_SCHEMA, TOPICS

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
JSON = "_json"  # the parsed VARIANT column, computed once per line
# ISO-8601 with seconds and a mandatory zone ('Z' or an offset); ranges are checked by the cast.
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
ENUMS = {("clicks", "action"): CLICK_ACTIONS, ("customers_cdc", "op"): CDC_OPS}
NUMBER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT", "FLOAT", "DOUBLE")
INTEGER_TYPES = ("TINYINT", "SMALLINT", "INT", "BIGINT")


def _json_type(spark_type: DataType) -> str:
    if isinstance(spark_type, StringType):
        return "string"
    if isinstance(spark_type, DoubleType):
        return "number"
    if isinstance(spark_type, LongType):
        return "integer"
    if isinstance(spark_type, TimestampType):
        return "timestamp"
    if isinstance(spark_type, StructType):
        return "object"
    raise ValueError(f"no JSON type for {spark_type}")


def _field(path: str) -> Column:
    return F.expr(f"variant_get({JSON}, '$.{path}')")


def _variant_type(path: str) -> Column:
    return F.expr(f"schema_of_variant(variant_get({JSON}, '$.{path}'))")


def _has_type(path: str, json_type: str) -> Column:
    kind = _variant_type(path)
    if json_type in ("string", "timestamp"):
        return kind == "STRING"
    if json_type == "integer":
        return kind.isin(*INTEGER_TYPES)
    if json_type == "number":
        return kind.isin(*NUMBER_TYPES) | kind.startswith("DECIMAL")
    return kind.startswith("OBJECT")


def _string(path: str) -> Column:
    return F.expr(f"variant_get({JSON}, '$.{path}', 'string')")


def _timestamp(path: str) -> Column:
    text = _string(path)
    return F.when(text.rlike(TIMESTAMP_PATTERN), F.expr(f"try_cast(variant_get({JSON}, '$.{path}', 'string') AS TIMESTAMP)"))


def _field_problems(topic: str, schema: StructType, prefix: str = "") -> list[tuple[Column, Column]]:
    """(is-bad condition, reason) pairs for every field of ``schema``, in schema order."""
    problems: list[tuple[Column, Column]] = []
    for field in schema.fields:
        path = prefix + field.name
        json_type = _json_type(field.dataType)
        value = _field(path)
        null = F.expr(f"is_variant_null(variant_get({JSON}, '$.{path}'))")
        if not field.nullable:
            problems.append((value.isNull(), F.lit(f"missing field '{path}'")))
            problems.append((null, F.lit(f"null value for required field '{path}'")))
        present = value.isNotNull() & ~null
        problems.append((present & ~_has_type(path, json_type), F.lit(f"wrong type for '{path}': expected {json_type}")))
        if json_type == "timestamp":
            problems.append(
                (present & _timestamp(path).isNull(),
                 F.format_string("bad timestamp '%s'", F.substring(_string(path), 1, 64)))
            )
        allowed = ENUMS.get((topic, field.name))
        if allowed:
            problems.append(
                (present & ~_string(path).isin(*allowed),
                 F.format_string(f"invalid value for '{path}': '%s' (expected {', '.join(allowed)})",
                                 F.substring(_string(path), 1, 64)))
            )
    return problems


def _cdc_problems() -> list[tuple[Column, Column]]:
    """Debezium rules: c/r/u carry the new row in ``after``, d the old row in ``before``."""
    problems = _field_problems("customers_cdc", TOPICS["customers_cdc"].schema)
    op = _string("op")
    for image, ops in (("after", ("c", "r", "u")), ("before", ("d",))):
        needed = op.isin(*ops)
        missing = _field(image).isNull() | F.expr(f"is_variant_null(variant_get({JSON}, '$.{image}'))")
        problems.append((needed & missing, F.format_string(f"missing field '{image}' for op '%s'", op)))
        for condition, text in _field_problems("customers_cdc", CUSTOMER_ROW_SCHEMA, prefix=f"{image}."):
            problems.append((~missing & condition, text))
    return problems


def reason(topic: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Column:
    """Why a line of ``topic`` is rejected, or NULL when it is a valid event.

    Needs ``value`` (the line's bytes) and the columns :class:`Parser` adds before it. Lines that
    pass the one-shot :func:`looks_valid` check skip the field-by-field checks, which exist to
    name the first problem precisely.
    """
    size = F.length(F.col("value"))
    checks: list[tuple[Column, Column]] = [
        (size > max_line_bytes,
         F.format_string(f"line too long: %d bytes (limit {max_line_bytes})", size)),
        (~F.expr("is_valid_utf8(cast(value AS STRING))"), F.lit("invalid UTF-8")),
        (F.col(JSON).isNull(), F.lit("invalid JSON")),
        (~F.col(SHAPE).startswith("OBJECT"), F.lit("not a JSON object")),
    ]
    if topic != "customers_cdc":  # tiny topic with nested rules: always checked field by field
        checks.append((looks_valid(topic), F.lit(None).cast("string")))
    checks += _cdc_problems() if topic == "customers_cdc" else _field_problems(topic, TOPICS[topic].schema)
    result = None
    for condition, text in checks:
        result = F.when(condition, text) if result is None else result.when(condition, text)
    return result.otherwise(F.lit(None).cast("string"))


SHAPE = "_shape"  # schema_of_variant of the whole line, e.g. OBJECT<amount: DECIMAL(4,2), ...>
TYPE_PATTERNS = {
    "string": "STRING",
    "timestamp": "STRING",
    "integer": "(?:TINYINT|SMALLINT|INT|BIGINT)",
    "number": r"(?:TINYINT|SMALLINT|INT|BIGINT|FLOAT|DOUBLE|DECIMAL\(\d+,\d+\))",
}


def raw_struct(topic: str) -> str:
    """DDL of the topic's fields as they appear in JSON (timestamps still strings)."""
    fields = []
    for field in TOPICS[topic].schema.fields:
        kind = "string" if isinstance(field.dataType, TimestampType) else field.dataType.simpleString()
        fields.append(f"`{field.name}` {kind}")
    return f"struct<{', '.join(fields)}>"


def raw_column(topic: str) -> str:
    return f"_raw_{topic}"


def time_column(topic: str) -> str:
    return f"_time_{topic}"


def shape_pattern(topic: str) -> str:
    """A regex the line's shape matches when every field has its JSON type (extra fields allowed;
    schema_of_variant lists fields sorted by name)."""
    required = sorted((f for f in TOPICS[topic].schema.fields if not f.nullable), key=lambda f: f.name)
    optional = [f for f in TOPICS[topic].schema.fields if f.nullable]
    guards = "".join(
        f"(?!.*(?:<|, ){f.name}: (?!{TYPE_PATTERNS[_json_type(f.dataType)]}|VOID)[A-Z])" for f in optional
    )
    body = ".*?".join(
        f"(?:<|, ){f.name}: {TYPE_PATTERNS[_json_type(f.dataType)]}(?=, |>)" for f in required
    )
    return f"^{guards}OBJECT.*?{body}.*>$"


def looks_valid(topic: str) -> Column:
    """One-shot validity: field types from the line's shape, values from the struct cast."""
    raw = F.col(raw_column(topic))
    ok = F.col(SHAPE).rlike(shape_pattern(topic))
    for field in TOPICS[topic].schema.fields:
        if not field.nullable:
            ok = ok & raw[field.name].isNotNull()  # guards against a same-named nested field
        if isinstance(field.dataType, TimestampType):
            ok = ok & F.col(time_column(topic)).isNotNull()
        allowed = ENUMS.get((topic, field.name))
        if allowed:
            ok = ok & raw[field.name].isin(*allowed)
    return ok


def event_time(topic: str) -> Column:
    if topic == "customers_cdc":
        return F.timestamp_millis(F.col(raw_column(topic))["ts_ms"])
    return F.col(time_column(topic))


def event_id(topic: str) -> Column:
    """The event's own id (ARCHITECTURE.md, late_events)."""
    raw = F.col(raw_column(topic))
    if topic == "sensors":
        utc = F.date_format(event_time(topic), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
        return F.concat_ws("|", raw["device_id"], utc)
    if topic == "customers_cdc":
        customer = F.coalesce(raw["after"]["customer_id"], raw["before"]["customer_id"])
        return F.concat_ws("|", customer, raw["ts_ms"].cast("string"))
    return raw[TOPICS[topic].id_fields[0]]


def record(topic: str) -> Column:
    """The typed event as a struct with the topic's schema."""
    raw = F.col(raw_column(topic))
    fields = []
    for field in TOPICS[topic].schema.fields:
        column = F.col(time_column(topic)) if isinstance(field.dataType, TimestampType) else raw[field.name]
        fields.append(column.alias(field.name))
    return F.struct(*fields)


def with_json(raw: DataFrame, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """Add the parsed VARIANT (NULL for invalid JSON, invalid UTF-8 or oversized lines)."""
    usable = (F.length("value") <= max_line_bytes) & F.expr("is_valid_utf8(cast(value AS STRING))")
    return raw.withColumn(JSON, F.when(usable, F.expr("try_parse_json(cast(value AS STRING))")))


class Parser:
    """Parses lines of one or more topics.

    With one topic the typed event is in ``record``; with several, a ``topic`` column says which
    topic a line belongs to and each topic's event is in ``record_<topic>``. The Column
    expressions are built once (building them costs hundreds of JVM round trips), so reuse a
    parser across micro-batches.
    """

    def __init__(self, topics: Iterable[str], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self.topics = list(topics)
        unknown = [topic for topic in self.topics if topic not in TOPICS]
        if unknown or not self.topics:
            raise ValueError(f"unknown topics {unknown} (expected some of {', '.join(TOPICS)})")
        self.max_line_bytes = max_line_bytes
        self._stages: list[dict[str, Column]] | None = None

    def record_column(self, topic: str) -> str:
        """The column holding ``topic``'s typed events."""
        return "record" if len(self.topics) == 1 else f"record_{topic}"

    def _per_topic(self, build) -> Column:  # noqa: ANN001 - a Column factory taking a topic
        if len(self.topics) == 1:
            return build(self.topics[0])
        result = None
        for topic in self.topics:
            condition = F.col("topic") == topic
            result = F.when(condition, build(topic)) if result is None else result.when(condition, build(topic))
        return result

    def stages(self) -> list[dict[str, Column]]:
        """Columns to add, in stages (each stage uses the ones before)."""
        if self._stages is None:
            valid = F.col("reason").isNull()

            def mine(topic: str) -> Column:
                return F.lit(True) if len(self.topics) == 1 else F.col("topic") == topic

            raw = {
                raw_column(t): F.when(mine(t), F.expr(f"try_variant_get({JSON}, '$', '{raw_struct(t)}')"))
                for t in self.topics
            }
            times = {}
            for t in self.topics:
                if t != "customers_cdc":
                    text = F.col(raw_column(t))["event_time"]
                    times[time_column(t)] = F.when(text.rlike(TIMESTAMP_PATTERN), F.expr(f"try_cast({raw_column(t)}.event_time AS TIMESTAMP)"))
            typed = {
                "event_time": F.when(valid, self._per_topic(event_time)),
                "event_id": F.when(valid, self._per_topic(event_id)),
            }
            for topic in self.topics:
                typed[self.record_column(topic)] = F.when(valid & mine(topic), record(topic))
            self._stages = [
                {SHAPE: F.expr(f"schema_of_variant({JSON})"), **raw},
                times,
                {"reason": self._per_topic(lambda t: reason(t, self.max_line_bytes))},
                typed,
                {"event_date": F.to_date("event_time")},
            ]
        return self._stages

    def parse(self, raw: DataFrame) -> DataFrame:
        """``raw`` (``value`` binary plus any metadata) with ``reason``, ``event_id``,
        ``event_time``, ``event_date`` and the typed record(s); all but ``reason`` are NULL for
        a rejected line."""
        df = with_json(raw, self.max_line_bytes)
        for stage in self.stages():
            if stage:
                df = df.withColumns(stage)
        helpers = [JSON, SHAPE, *map(raw_column, self.topics), *(time_column(t) for t in self.topics if t != "customers_cdc")]
        return df.drop(*helpers)


def parse_topic(raw: DataFrame, topic: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """Lines of one topic, parsed (see :class:`Parser`)."""
    return Parser([topic], max_line_bytes).parse(raw)
