"""Event schemas: one StructType per landing topic (the typed Silver shape), as constants.

The landing contract is in docs/architecture.md; the parser validates raw JSON against these.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

CLICK_ACTIONS = ("view", "click", "add_to_cart")
CDC_OPS = ("c", "u", "d", "r")

CLICKS_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("user_id", StringType(), False),
        StructField("session_id", StringType(), False),
        StructField("page_url", StringType(), False),
        StructField("action", StringType(), False),
        StructField("device_type", StringType(), False),
        StructField("product_id", StringType(), True),
        StructField("event_time", TimestampType(), False),
    ]
)

ORDERS_SCHEMA = StructType(
    [
        StructField("order_id", StringType(), False),
        StructField("user_id", StringType(), False),
        StructField("product_id", StringType(), False),
        StructField("category", StringType(), False),
        StructField("amount", DoubleType(), False),
        StructField("event_time", TimestampType(), False),
    ]
)

PAYMENTS_SCHEMA = StructType(
    [
        StructField("payment_id", StringType(), False),
        StructField("order_id", StringType(), False),
        StructField("amount", DoubleType(), False),
        StructField("method", StringType(), False),
        StructField("event_time", TimestampType(), False),
    ]
)

CUSTOMER_ROW_SCHEMA = StructType(
    [
        StructField("customer_id", StringType(), False),
        StructField("name", StringType(), True),
        StructField("email", StringType(), True),
        StructField("segment", StringType(), True),
        StructField("country", StringType(), True),
    ]
)

CUSTOMERS_CDC_SCHEMA = StructType(
    [
        StructField("op", StringType(), False),
        StructField("ts_ms", LongType(), False),
        StructField("before", CUSTOMER_ROW_SCHEMA, True),
        StructField("after", CUSTOMER_ROW_SCHEMA, True),
    ]
)

SENSORS_SCHEMA = StructType(
    [
        StructField("device_id", StringType(), False),
        StructField("temperature", DoubleType(), False),
        StructField("humidity", DoubleType(), False),
        StructField("event_time", TimestampType(), False),
    ]
)


@dataclass(frozen=True)
class Topic:
    """A landing topic: its schema and how its events are identified."""

    name: str
    schema: StructType
    # Fields whose values, joined by '|', form the event id used in late_events and dedup.
    id_fields: tuple[str, ...]
    # The entity whose events must stay in order: the Kafka record key (one partition per key).
    entity_field: str


TOPICS: dict[str, Topic] = {
    topic.name: topic
    for topic in (
        Topic("clicks", CLICKS_SCHEMA, ("event_id",), "user_id"),
        Topic("orders", ORDERS_SCHEMA, ("order_id",), "order_id"),
        Topic("payments", PAYMENTS_SCHEMA, ("payment_id",), "order_id"),  # with its order's key
        Topic("customers_cdc", CUSTOMERS_CDC_SCHEMA, ("customer_id", "ts_ms"), "customer_id"),
        Topic("sensors", SENSORS_SCHEMA, ("device_id", "event_time"), "device_id"),
    )
}
TOPIC_NAMES = tuple(TOPICS)
