"""Schemas declared once, without Spark, as ``"name type, name type NOT NULL, …"``.

Every event and table schema is such a declaration (the fields of a Spark DDL struct); its
Spark :class:`~pyspark.sql.types.StructType` (:func:`spark_schema`) and its Arrow schema
(:func:`arrow_schema`) are derived from it when first asked for. A module that only declares
schemas imports neither pyspark nor pyarrow, so ``lambdalake serve`` and ``status`` run
without Spark (tests/serving/test_imports.py).

Types: ``string``, ``double``, ``bigint``, ``int``, ``boolean``, ``date``, ``timestamp`` (UTC in
Arrow), ``binary``, ``decimal(p,s)``, ``array<type>`` and ``struct<name type, …>``, whose fields are declared the
same way (so one declaration nests in another: ``f"before struct<{CUSTOMER_ROW_FIELDS}>"``).
A field is nullable unless declared ``NOT NULL``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import DataType, StructType

SIMPLE_TYPES = ("string", "double", "bigint", "int", "boolean", "date", "timestamp", "binary")


@dataclass(frozen=True)
class Array:
    element: Type


@dataclass(frozen=True)
class Struct:
    fields: tuple[Field, ...]


Type = str | Array | Struct  # a str is one of SIMPLE_TYPES or "decimal(p,s)"
_DECIMAL = re.compile(r"decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)")


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    nullable: bool = True


_FIELD = re.compile(r"(\w+)\s+(.+?)(\s+NOT\s+NULL)?", re.IGNORECASE | re.DOTALL)


@cache
def parse(fields: str) -> tuple[Field, ...]:
    """The fields of a declaration, in order."""
    parsed = []
    for declared in _top_level(fields):
        match = _FIELD.fullmatch(declared.strip())
        if not match:
            raise ValueError(f"cannot read the field '{declared.strip()}': expected 'name type [NOT NULL]'")
        name, kind, not_null = match.groups()
        parsed.append(Field(name, _type(kind), nullable=not_null is None))
    names = [field.name for field in parsed]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"fields {duplicated} are declared more than once in '{fields}'")
    return tuple(parsed)


def _top_level(fields: str) -> list[str]:
    """``fields`` split at its commas outside ``<…>`` and ``(…)``."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(fields):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(fields[start:i])
            start = i + 1
        if depth < 0:
            break
    if depth != 0:
        raise ValueError(f"unbalanced brackets in '{fields}'")
    return [*parts, fields[start:]]


def _type(text: str) -> Type:
    text = text.strip()
    lowered = text.lower()
    if lowered in SIMPLE_TYPES:
        return lowered
    decimal = _DECIMAL.fullmatch(lowered)
    if decimal:
        return f"decimal({decimal[1]},{decimal[2]})"
    if lowered.startswith("array<") and lowered.endswith(">"):
        return Array(_type(text[len("array<"):-1]))
    if lowered.startswith("struct<") and lowered.endswith(">"):
        return Struct(parse(text[len("struct<"):-1]))
    raise ValueError(f"unknown type '{text}' (expected one of {', '.join(SIMPLE_TYPES)}, decimal(p,s), array<…>, "
                     "struct<…>)")


def names(fields: str) -> list[str]:
    """The names of a declaration's fields (top level)."""
    return [field.name for field in parse(fields)]


def render(fields: tuple[Field, ...]) -> str:
    """Parsed fields as a declaration again."""
    return ", ".join(f"{field.name} {_render_type(field.type)}{'' if field.nullable else ' NOT NULL'}"
                     for field in fields)


def _render_type(kind: Type) -> str:
    if isinstance(kind, Array):
        return f"array<{_render_type(kind.element)}>"
    if isinstance(kind, Struct):
        return f"struct<{render(kind.fields)}>"
    return kind


def nullable(fields: str) -> str:
    """The same declaration with every field, those of nested structs too, nullable."""
    def loosened(field: Field) -> Field:
        kind = Struct(tuple(map(loosened, field.type.fields))) if isinstance(field.type, Struct) else field.type
        return Field(field.name, kind, nullable=True)

    return render(tuple(map(loosened, parse(fields))))


@cache
def spark_schema(fields: str) -> StructType:
    """The declaration as a Spark schema (one instance per declaration)."""
    from pyspark.sql import types as T

    simple = {
        "string": T.StringType(), "double": T.DoubleType(), "bigint": T.LongType(), "int": T.IntegerType(),
        "boolean": T.BooleanType(), "date": T.DateType(), "timestamp": T.TimestampType(), "binary": T.BinaryType(),
    }

    def spark_type(kind: Type) -> DataType:
        if isinstance(kind, Array):
            return T.ArrayType(spark_type(kind.element))
        if isinstance(kind, Struct):
            return struct(kind.fields)
        decimal = _DECIMAL.fullmatch(kind)
        return T.DecimalType(int(decimal[1]), int(decimal[2])) if decimal else simple[kind]

    def struct(parsed: tuple[Field, ...]) -> StructType:
        return T.StructType([T.StructField(field.name, spark_type(field.type), field.nullable) for field in parsed])

    return struct(parse(fields))


@cache
def arrow_schema(fields: str) -> pa.Schema:
    """The declaration as an Arrow schema, timestamps in microseconds and UTC: what Spark's
    ``to_arrow_schema(spark_schema(fields), timezone="UTC")`` gives, without Spark."""
    import pyarrow as pa

    simple = {
        "string": pa.string(), "double": pa.float64(), "bigint": pa.int64(), "int": pa.int32(),
        "boolean": pa.bool_(), "date": pa.date32(), "timestamp": pa.timestamp("us", tz="UTC"), "binary": pa.binary(),
    }

    def arrow_type(kind: Type) -> pa.DataType:
        if isinstance(kind, Array):
            return pa.list_(pa.field("element", arrow_type(kind.element), nullable=True))
        if isinstance(kind, Struct):
            return pa.struct(arrow_fields(kind.fields))
        decimal = _DECIMAL.fullmatch(kind)
        return pa.decimal128(int(decimal[1]), int(decimal[2])) if decimal else simple[kind]

    def arrow_fields(parsed: tuple[Field, ...]) -> list[pa.Field]:
        return [pa.field(field.name, arrow_type(field.type), nullable=field.nullable) for field in parsed]

    return pa.schema(arrow_fields(parse(fields)))


def spark_schemas(namespace: dict[str, Any], module: str) -> Callable[[str], StructType]:
    """A module ``__getattr__`` that gives ``X_SCHEMA``, the Spark schema of the module's
    declaration ``X_FIELDS``, the first time it is asked for."""

    def __getattr__(name: str) -> StructType:
        declared = namespace.get(f"{name.removesuffix('_SCHEMA')}_FIELDS") if name.endswith("_SCHEMA") else None
        if not isinstance(declared, str):
            raise AttributeError(f"module '{module}' has no attribute '{name}'")
        return spark_schema(declared)

    return __getattr__
