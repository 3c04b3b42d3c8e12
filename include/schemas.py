"""Event schemas: one declaration per landing topic (the typed Silver shape).

The landing contract is in docs/architecture.md; the parser validates raw JSON against these:
a ``NOT NULL`` field is required. Each schema is declared once as ``X_FIELDS`` (``"name type, …"``,
:mod:`include.ddl`), without Spark; ``X_SCHEMA`` (and :attr:`Topic.schema`) is its Spark
StructType, built the first time it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from include import ddl

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

CLICK_ACTIONS = ("view", "click", "add_to_cart")
CDC_OPS = ("c", "u", "d", "r")
# The parser's rules beyond the schemas: a field's allowed values, and which ops of the CDC
# envelope need which image (Debezium: c/r/u carry the new row in `after`, d the old in `before`).
ENUMS = {("clicks", "action"): CLICK_ACTIONS, ("customers_cdc", "op"): CDC_OPS}
CDC_IMAGES = {"after": ("c", "r", "u"), "before": ("d",)}
# The change's time: epoch milliseconds within years 1 to 9999 (Spark's timestamps; beyond, its
# conversion overflows and would fail the whole micro-batch).
CDC_TS_MS_RANGE = (-62_135_596_800_000, 253_402_300_799_999)

CLICKS_FIELDS = (
    "event_id string NOT NULL, user_id string NOT NULL, session_id string NOT NULL, page_url string NOT NULL, "
    "action string NOT NULL, device_type string NOT NULL, product_id string, event_time timestamp NOT NULL"
)

ORDERS_FIELDS = (
    "order_id string NOT NULL, user_id string NOT NULL, product_id string NOT NULL, category string NOT NULL, "
    "amount double NOT NULL, event_time timestamp NOT NULL"
)

PAYMENTS_FIELDS = (
    "payment_id string NOT NULL, order_id string NOT NULL, amount double NOT NULL, method string NOT NULL, "
    "event_time timestamp NOT NULL"
)

CUSTOMER_ROW_FIELDS = "customer_id string NOT NULL, name string, email string, segment string, country string"

CUSTOMERS_CDC_FIELDS = (
    "op string NOT NULL, ts_ms bigint NOT NULL, "
    f"before struct<{CUSTOMER_ROW_FIELDS}>, after struct<{CUSTOMER_ROW_FIELDS}>"
)

SENSORS_FIELDS = (
    "device_id string NOT NULL, temperature double NOT NULL, humidity double NOT NULL, event_time timestamp NOT NULL"
)

__getattr__ = ddl.spark_schemas(globals(), __name__)  # CLICKS_SCHEMA, …: built on first use


@dataclass(frozen=True)
class Topic:
    """A landing topic: its schema and how its events are identified."""

    name: str
    fields: str  # the typed event, declared (include.ddl)
    # Fields whose values, joined by '|', form the event id used in late_events and dedup.
    id_fields: tuple[str, ...]
    # The entity whose events must stay in order: the Kafka record key (one partition per key).
    entity_field: str

    @property
    def schema(self) -> StructType:
        """The typed event as a Spark schema."""
        return ddl.spark_schema(self.fields)


TOPICS: dict[str, Topic] = {
    topic.name: topic
    for topic in (
        Topic("clicks", CLICKS_FIELDS, ("event_id",), "user_id"),
        Topic("orders", ORDERS_FIELDS, ("order_id",), "order_id"),
        Topic("payments", PAYMENTS_FIELDS, ("payment_id",), "order_id"),  # with its order's key
        Topic("customers_cdc", CUSTOMERS_CDC_FIELDS, ("customer_id", "ts_ms"), "customer_id"),
        Topic("sensors", SENSORS_FIELDS, ("device_id", "event_time"), "device_id"),
    )
}
TOPIC_NAMES = tuple(TOPICS)
