"""Parsing landed lines into typed events, shared by the speed and the batch layer.

Pure Column logic, no I/O. Every line is either a typed ``record`` or ``rejected``, and a rejected
line gets a precise ``reason`` (the first check it fails) from :func:`with_reason`: nothing is
dropped silently. Validation is derived from the schema constants: non-nullable fields are
required, and the JSON type each Spark type needs (``string``, ``number``, ``integer``,
``object``, an ISO-8601 ``timestamp``) is checked on the parsed VARIANT, so ``"12.50"`` for
``amount`` is a wrong type rather than silently cast.

Naming the reason is kept apart because its expressions are most of the parser's size, and a
query's size is paid again in every micro-batch (planning, generated code) and every task
(deserializing the plan) whether or not a line is bad.
"""

from __future__ import annotations

from functools import lru_cache, reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType, StringType, StructField, StructType, TimestampType

from include.schemas import CDC_IMAGES, CDC_TS_MS_RANGE, CUSTOMER_ROW_SCHEMA, ENUMS, TOPICS

DEFAULT_MAX_LINE_BYTES = 1024 * 1024
JSON = "_json"  # the whole line as a VARIANT, parsed only where a reason must be named
# ISO-8601 with seconds and a mandatory zone ('Z' or an offset); ranges are checked by the cast.
TIMESTAMP_PATTERN = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$"
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


def _has_type(variant: str, json_type: str) -> Column:
    """Whether the VARIANT SQL expression ``variant`` holds a value of ``json_type``."""
    kind = F.expr(f"schema_of_variant({variant})")
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
    return F.when(text.rlike(TIMESTAMP_PATTERN),
                  F.expr(f"try_cast(variant_get({JSON}, '$.{path}', 'string') AS TIMESTAMP)"))


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
        problems.append((present & ~_has_type(f"variant_get({JSON}, '$.{path}')", json_type),
                         F.lit(f"wrong type for '{path}': expected {json_type}")))
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
    millis = F.expr(f"try_variant_get({JSON}, '$.ts_ms', 'bigint')")
    low, high = CDC_TS_MS_RANGE
    problems.append(((millis < low) | (millis > high),
                     F.format_string("ts_ms out of range: %d (years 1 to 9999)", millis)))
    op = _string("op")
    for image, ops in CDC_IMAGES.items():
        needed = op.isin(*ops)
        missing = _field(image).isNull() | F.expr(f"is_variant_null(variant_get({JSON}, '$.{image}'))")
        problems.append((needed & missing, F.format_string(f"missing field '{image}' for op '%s'", op)))
        for condition, text in _field_problems("customers_cdc", CUSTOMER_ROW_SCHEMA, prefix=f"{image}."):
            problems.append((~missing & condition, text))
    return problems


def _json_problems(topic: str) -> list[tuple[Column, Column]]:
    """The checks of a UTF-8 line within the size limit, on ``_json`` (the line as a VARIANT)."""
    checks = [
        (F.col(JSON).isNull(), F.lit("invalid JSON")),
        (~F.expr(f"schema_of_variant({JSON})").startswith("OBJECT"), F.lit("not a JSON object")),
    ]
    return checks + (_cdc_problems() if topic == "customers_cdc" else _field_problems(topic, TOPICS[topic].schema))


def precise_reason(topic: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> Column:
    """The first check a line of ``topic`` fails, or NULL. Needs ``value`` and ``_json`` (the
    whole line as a VARIANT)."""
    size = F.length(F.col("value"))
    checks: list[tuple[Column, Column]] = [
        (size > max_line_bytes,
         F.format_string(f"line too long: %d bytes (limit {max_line_bytes})", size)),
        (~F.expr("is_valid_utf8(cast(value AS STRING))"), F.lit("invalid UTF-8")),
        *_json_problems(topic),
    ]
    result = None
    for condition, text in checks:
        result = F.when(condition, text) if result is None else result.when(condition, text)
    return result.otherwise(F.lit(None).cast("string"))


def with_reason(lines: DataFrame, topic: str | None = None, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """``lines`` (from :func:`parse_topic`) with ``reason``: for a rejected line the first check
    it fails, else NULL. The topic is ``topic``, or each line's ``topic`` column. Meant for the
    rejected lines only (the DLQ's writer): its expressions are large."""
    reason = _reason(topic, max_line_bytes, lines.sparkSession.sparkContext.applicationId)
    within_limit = F.col("rejected") & (F.length("value") <= max_line_bytes)
    parsed = F.when(within_limit, F.expr("try_parse_json(cast(value AS STRING))"))
    return lines.withColumn(JSON, parsed).withColumn("reason", F.when(F.col("rejected"), reason)).drop(JSON)


@lru_cache(maxsize=64)
def _reason(topic: str | None, max_line_bytes: int, application: str) -> Column:
    """:func:`with_reason`'s expression, built once per Spark application: it has thousands of
    nodes, each a call into the JVM (1.5–2 s per micro-batch with rejected lines, DECISIONS.md)."""
    if topic is not None:
        return precise_reason(topic, max_line_bytes)
    reason = None
    for name in TOPICS:
        named = precise_reason(name, max_line_bytes)
        reason = F.when(F.col("topic") == name, named) if reason is None else reason.when(F.col("topic") == name, named)
    return reason


FIELDS = "_fields"  # the line's top-level fields, each a VARIANT: their JSON types
VALUES = "_values"  # the same fields typed (timestamps as text), from a second, typed read
TIME = "_time"  # the typed event_time


def fields_struct(topic: str) -> str:
    return "struct<" + ", ".join(f"`{f.name}`: variant" for f in TOPICS[topic].schema.fields) + ">"


def values_struct(topic: str) -> str:
    """The topic's fields as Spark types; a timestamp stays text (checked against the strict
    pattern before it is cast)."""
    def spark_type(field: StructField) -> str:
        return "string" if isinstance(field.dataType, TimestampType) else field.dataType.simpleString()
    return "struct<" + ", ".join(f"`{f.name}`: {spark_type(f)}" for f in TOPICS[topic].schema.fields) + ">"


def _top(name: str) -> str:
    return f"{FIELDS}.`{name}`"


def looks_valid(topic: str) -> Column:
    """One-shot validity of a flat topic's line from its top-level fields: required ones present
    and not null, every present one of its JSON type, timestamps and enum values well-formed.
    Lines failing it get :func:`precise_reason`."""
    ok = F.col(FIELDS).isNotNull()
    for field in TOPICS[topic].schema.fields:
        value = F.col(FIELDS)[field.name]
        present = value.isNotNull() & ~F.expr(f"is_variant_null({_top(field.name)})")
        json_type = _json_type(field.dataType)
        if not field.nullable:
            ok = ok & present
        ok = ok & (~present | _has_type(_top(field.name), json_type))
        if json_type == "timestamp":
            ok = ok & (~present | F.col(TIME).isNotNull())
        allowed = ENUMS.get((topic, field.name))
        if allowed:
            ok = ok & (~present | F.col(VALUES)[field.name].isin(*allowed))
    return ok


def _typed(field: StructField) -> Column:
    return F.col(TIME) if isinstance(field.dataType, TimestampType) else F.col(VALUES)[field.name]


def event_time(topic: str) -> Column:
    if topic == "customers_cdc":
        return F.timestamp_millis(F.col("record.ts_ms"))
    return F.col("record.event_time")


def event_id(topic: str) -> Column:
    """The event's own id (docs/views.md, late_events)."""
    record = F.col("record")
    if topic == "sensors":
        utc = F.date_format(record["event_time"], "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'")
        return F.concat_ws("|", record["device_id"], utc)
    if topic == "customers_cdc":
        customer = F.coalesce(record["after"]["customer_id"], record["before"]["customer_id"])
        return F.concat_ws("|", customer, record["ts_ms"].cast("string"))
    return record[TOPICS[topic].id_fields[0]]


def parse_topic(raw: DataFrame, topic: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> DataFrame:
    """``raw`` (``value`` binary plus any metadata) with ``rejected``, ``event_id``,
    ``event_time``, ``event_date`` and the typed ``record``; all but ``rejected`` are NULL for a
    rejected line (:func:`with_reason` names its problem).

    Every line is read twice: once into its top-level fields as VARIANTs, which keep each
    value's JSON type for the one-shot checks (a typed read alone takes the number 17 for the
    string ``"17"``), and once into the typed values, which costs less than casting each
    VARIANT. The CDC envelope (a small topic with nested rules) is checked field by field on
    the whole line as a VARIANT.
    """
    if topic not in TOPICS:
        raise ValueError(f"unknown topic '{topic}' (expected one of {', '.join(TOPICS)})")
    for step in _parse_steps(topic, max_line_bytes, raw.sparkSession.sparkContext.applicationId):
        raw = raw.withColumns(step)
    return raw.drop(FIELDS, VALUES, TIME, JSON)


@lru_cache(maxsize=64)
def _parse_steps(topic: str, max_line_bytes: int, application: str) -> list[dict[str, Column]]:
    """:func:`parse_topic`'s columns, step by step, built once per Spark application: each is a
    call into the JVM, made again for every micro-batch's plan otherwise)."""
    text = F.col("value").cast("string")
    usable = (F.length("value") <= max_line_bytes) & F.expr("is_valid_utf8(cast(value AS STRING))")
    schema = TOPICS[topic].schema
    values = F.when(usable, F.from_json(text, values_struct(topic)))
    if topic == "customers_cdc":
        read = [{VALUES: values, JSON: F.when(usable, F.expr("try_parse_json(cast(value AS STRING))"))}]
        # No check holds, "invalid JSON" included (a check on a missing part is NULL: it does not hold).
        problems = [F.coalesce(condition, F.lit(False)) for condition, _ in _json_problems(topic)]
        ok = ~reduce(lambda a, b: a | b, problems)
    else:
        stamp = F.col(VALUES)["event_time"]
        read = [{VALUES: values, FIELDS: F.when(usable, F.from_json(text, fields_struct(topic)))},
                {TIME: F.when(stamp.rlike(TIMESTAMP_PATTERN), stamp.try_cast("timestamp"))}]
        ok = looks_valid(topic)
    valid = F.col("record").isNotNull()
    return [*read,
            {"record": F.when(ok, F.struct(*[_typed(f).alias(f.name) for f in schema.fields]))},
            {"rejected": ~valid, "event_time": F.when(valid, event_time(topic)),
             "event_id": F.when(valid, event_id(topic))},
            {"event_date": F.to_date("event_time")}]


def bronze_event_date(topic: str) -> Column:
    """The event date of a raw line, read cheaply (one field, no validation) to partition Bronze.
    For a valid line it equals :func:`parse_topic`'s ``event_date`` (the same JSON reader, so a
    duplicated key resolves the same way); a rejected line may get one too. About twice as fast
    as ``get_json_object``."""
    text = F.col("value").cast("string")
    if topic == "customers_cdc":
        millis = F.from_json(text, "ts_ms STRING")["ts_ms"].try_cast("bigint")
        return F.to_date(F.timestamp_millis(F.when(millis.between(*CDC_TS_MS_RANGE), millis)))
    stamp = F.from_json(text, "event_time STRING")["event_time"]
    return F.to_date(F.when(stamp.rlike(TIMESTAMP_PATTERN), stamp.try_cast("timestamp")))
