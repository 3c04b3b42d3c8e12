"""Schema declarations (include/ddl.py): Spark and Arrow read each one as Spark itself would."""

from __future__ import annotations

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from include import ddl, schemas, tables
from include.views import VIEWS


def declarations() -> dict[str, str]:
    """Every declared schema: topics, tables, Silver per topic, views and their differences."""
    declared = {f"schemas.{name}": value for name, value in vars(schemas).items() if name.endswith("_FIELDS")}
    declared |= {f"tables.{name}": value for name, value in vars(tables).items() if name.endswith("_FIELDS")}
    declared |= {f"silver/{topic}": tables.silver_fields(topic) for topic in schemas.TOPICS}
    declared |= {f"view {view.name}": view.fields for view in VIEWS}
    declared |= {f"differences {view.name}": view.differences_fields for view in VIEWS if view.differences}
    return declared


def test_spark_reads_every_declaration_as_derived(spark):
    for name, fields in declarations().items():
        assert ddl.spark_schema(fields) == StructType.fromDDL(fields), name


def test_arrow_schema_is_sparks_own_conversion():
    for name, fields in declarations().items():
        assert ddl.arrow_schema(fields) == to_arrow_schema(ddl.spark_schema(fields), timezone="UTC"), name
        assert tables.arrow_schema(fields) == tables.arrow_schema(ddl.spark_schema(fields)), name


def test_views_derive_the_registry_schemas():
    for view in VIEWS:
        assert ddl.spark_schema(view.fields) == view.schema, view.name
        if view.differences:
            assert ddl.spark_schema(view.differences_fields) == view.differences_schema, view.name


def test_nested_and_required_fields():
    fields = "id string NOT NULL, tags array<string>, row struct<key bigint not null, note string> NOT NULL"
    assert ddl.spark_schema(fields) == StructType([
        StructField("id", StringType(), False),
        StructField("tags", ArrayType(StringType()), True),
        StructField("row", StructType([StructField("key", LongType(), False), StructField("note", StringType())]),
                    False),
    ])
    assert ddl.names(fields) == ["id", "tags", "row"]
    assert ddl.nullable(fields) == "id string, tags array<string>, row struct<key bigint, note string>"
    assert ddl.spark_schema(ddl.nullable(fields)) == tables.nullable(ddl.spark_schema(fields))
    assert ddl.render(ddl.parse(fields)) == (
        "id string NOT NULL, tags array<string>, row struct<key bigint NOT NULL, note string> NOT NULL")


@pytest.mark.parametrize(("fields", "message"), [
    ("id uuid", "unknown type 'uuid'"),
    ("id string, id bigint", "declared more than once"),
    ("row struct<id string", "unbalanced"),
    ("id", "expected 'name type"),
])
def test_bad_declarations(fields, message):
    with pytest.raises(ValueError, match=message):
        ddl.parse(fields)


def test_schema_constants_are_derived_on_first_use():
    assert tables.DLQ_SCHEMA == ddl.spark_schema(tables.DLQ_FIELDS)
    assert schemas.CUSTOMERS_CDC_SCHEMA == schemas.TOPICS["customers_cdc"].schema
    assert schemas.TOPICS["customers_cdc"].schema["before"].dataType == schemas.CUSTOMER_ROW_SCHEMA
    with pytest.raises(AttributeError):
        _ = tables.NOT_DECLARED_SCHEMA
