"""When an event-time day is complete: the stream's watermark (on every topic a view reads) has
passed the day's end plus the allowed lateness (watermark delay and join window), so no more
on-time events for it can come. Read by the nightly batch's sensor and by the stream, which tells
Airflow (an asset event) when a new day is complete."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta, timezone

from include import tables
from include.config import Settings
from include.lakehouse import LakehouseStore
from include.registry import input_topics
from include.views import VIEWS


def complete_at(settings: Settings, day: date) -> datetime:
    """The watermark (or, for a quiet stream, the clock) past which ``day`` is complete."""
    day_end = datetime.combine(day + timedelta(days=1), time.min, timezone.utc)
    return day_end + settings.watermark_delay + settings.join_window


def stream_watermark(store: LakehouseStore, settings: Settings) -> datetime | None:
    """The stream's watermark over every topic a view reads: the oldest topic's newest ingested
    event time minus the watermark delay. None until every such topic has had an event."""
    if not store.exists(tables.INGEST_BATCHES):
        return None
    rows = store.select_arrow(tables.INGEST_BATCHES, ["topic", "max_event_time"], "max_event_time IS NOT NULL")
    latest = {row["topic"]: row["max_event_time_max"]
              for row in rows.group_by("topic").aggregate([("max_event_time", "max")]).to_pylist()}
    topics = input_topics(VIEWS)
    if not all(topic in latest for topic in topics):
        return None
    return min(latest[topic] for topic in topics) - settings.watermark_delay


def newest_complete_day(settings: Settings, watermark: datetime | None) -> date | None:
    """The latest day whose :func:`complete_at` the watermark has reached."""
    if watermark is None:
        return None
    return (watermark - settings.watermark_delay - settings.join_window).astimezone(timezone.utc).date() \
        - timedelta(days=1)
