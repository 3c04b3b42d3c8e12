"""The clicks family: traffic per page in sliding 10-minute windows, and user sessions."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from include.registry import Partials, PassStep, Speed, ViewContext, sql_time, view
from include.views.rules import (
    DASHBOARD_REFRESH, distinct_count_sql, merged_distinct_count, sketch_of, window_start_sql,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TRAFFIC_WINDOW, TRAFFIC_SLIDE_SECONDS = "10 minutes", 300
SESSION_GAP = timedelta(minutes=30)


@view(
    inputs=("clicks",),
    fields="window_start timestamp, window_end timestamp, page_url string, views bigint, clicks bigint, "
    "add_to_cart bigint, unique_users bigint, date date",
    keys=("window_start", "page_url"),
    key_time="window_start",
    lookahead={"clicks": lambda settings: timedelta(minutes=10)},  # a window opening at 23:55 ends after midnight
    metrics={
        "rows": "count(*)",
        "views": "sum(views)",
        "clicks": "sum(clicks)",
        "add_to_cart": "sum(add_to_cart)",
        "unique_users": "sum(unique_users)",
    },
    drift_metrics=("rows", "views", "clicks"),
    speed=Speed(freshness_time="window_start", partials=Partials(
        merge={**{name: f"CAST(sum({name}) AS BIGINT)" for name in ("views", "clicks", "add_to_cart")},
               **merged_distinct_count("unique_users")},
    ), state=f"{sketch_of('unique_users')} binary"),
    declared_in_sql=True,
)
def traffic_by_page_10m(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Sliding 10-minute windows every 5 minutes on click time (each click counts in two
    windows): events per action and distinct users per page."""
    counts = ", ".join(f"count_if(action = '{action}') AS {name}"
                       for action, name in (("view", "views"), ("click", "clicks"), ("add_to_cart", "add_to_cart")))
    return f"""
        SELECT window_start, window_start + INTERVAL {TRAFFIC_WINDOW} AS window_end, page_url, {counts},
               {distinct_count_sql("user_id", "unique_users", context)}, to_date(window_start) AS date
        FROM (SELECT *, {window_start_sql("event_time", TRAFFIC_SLIDE_SECONDS, minus="back")} AS window_start
              FROM {{clicks}} CROSS JOIN (SELECT explode(array(0, {TRAFFIC_SLIDE_SECONDS})) AS back))
        GROUP BY window_start, page_url"""


@view(
    inputs=("clicks",),
    fields="user_id string, session_start timestamp, session_end timestamp, events bigint, pages bigint, "
    "duration_seconds double, converted boolean, date date",
    keys=("user_id", "session_start"),
    key_time="session_start",
    # A session starting on the day may have begun before midnight's clicks, or run past it.
    lookbehind={"clicks": lambda settings: SESSION_GAP},
    lookahead={"clicks": lambda settings: SESSION_GAP},
    metrics={
        "rows": "count(*)",
        "events": "sum(events)",
        "converted": "count_if(converted)",
    },
    drift_metrics=("events",),
    speed=Speed(freshness_time="session_end", tombstone="s.events = 0", refresh=DASHBOARD_REFRESH,
                state="page_urls array<string>", incremental=lambda step: user_sessions_step(step)),
    declared_in_sql=True,
)
def user_sessions(inputs: Mapping[str, DataFrame], context: ViewContext) -> str:
    """Sessions per user with a 30-minute inactivity gap (Spark's ``session_window`` rule: a
    click exactly the gap after the last continues the session): first and last click, clicks,
    distinct pages, whether an item was added to the cart. Gaps and islands: a click more than
    the gap after its user's previous one opens a session. The stream shows sessions while they
    are open (:func:`user_sessions_step`), with their pages."""
    gap_us = SESSION_GAP // timedelta(microseconds=1)
    pages = "" if context.exact else ", array_sort(collect_set(page_url)) AS page_urls"
    return f"""
        WITH clicks AS (
            SELECT *, unix_micros(event_time) AS at_us,
                   lag(unix_micros(event_time)) OVER (PARTITION BY user_id ORDER BY event_time) AS previous_us
            FROM {{clicks}}),
        numbered AS (
            SELECT *, sum(CASE WHEN previous_us IS NULL OR at_us - previous_us > {gap_us} THEN 1 ELSE 0 END)
                          OVER (PARTITION BY user_id ORDER BY at_us ROWS UNBOUNDED PRECEDING) AS session
            FROM clicks)
        SELECT user_id, timestamp_micros(min(at_us)) AS session_start, timestamp_micros(max(at_us)) AS session_end,
               count(1) AS events, count(DISTINCT page_url) AS pages,
               (max(at_us) - min(at_us)) / 1e6 AS duration_seconds,
               max(action = 'add_to_cart') AS converted, to_date(timestamp_micros(min(at_us))) AS date{pages}
        FROM numbered GROUP BY user_id, session"""


def sessions_merge_sql(gap: timedelta) -> str:
    """Spark SQL over ``{stored}`` (stored sessions with their ``page_urls``) and ``{clicks}``:
    every unit (a stored session, or a click as a session of its own) merged per user where the
    next starts at most ``gap`` after the furthest end so far (Spark's ``session_window`` rule: a
    click exactly the gap later continues), then the sessions that differ from the stored ones,
    and a tombstone (``events = 0``) for each stored session that another swallowed."""
    gap_us = gap // timedelta(microseconds=1)
    return f"""
        WITH units AS (
            SELECT user_id, unix_micros(session_start) AS start_us, unix_micros(session_end) AS end_us, events,
                   coalesce(page_urls, CAST(array() AS ARRAY<STRING>)) AS page_urls, converted
            FROM {{stored}}
            UNION ALL
            SELECT user_id, unix_micros(event_time), unix_micros(event_time), 1, array(page_url),
                   action = 'add_to_cart'
            FROM {{clicks}}),
        reached AS (
            SELECT *, max(end_us) OVER (PARTITION BY user_id ORDER BY start_us, end_us
                                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach_us
            FROM units),
        numbered AS (
            SELECT *, sum(CASE WHEN reach_us IS NULL OR start_us - reach_us > {gap_us} THEN 1 ELSE 0 END)
                          OVER (PARTITION BY user_id ORDER BY start_us, end_us ROWS UNBOUNDED PRECEDING) AS session
            FROM reached),
        merged AS (
            SELECT user_id, min(start_us) AS start_us, max(end_us) AS end_us, CAST(sum(events) AS BIGINT) AS events,
                   array_sort(array_distinct(flatten(collect_list(page_urls)))) AS page_urls,
                   bool_or(converted) AS converted
            FROM numbered GROUP BY user_id, session),
        before AS (
            SELECT user_id, unix_micros(session_start) AS start_us, unix_micros(session_end) AS end_us, events,
                   page_urls, converted
            FROM {{stored}}),
        changed AS (
            SELECT m.* FROM merged m LEFT JOIN before b
              ON b.user_id = m.user_id AND b.start_us = m.start_us AND b.end_us = m.end_us AND b.events = m.events
             AND b.page_urls = m.page_urls AND b.converted = m.converted
            WHERE b.user_id IS NULL
            UNION ALL
            SELECT b.user_id, b.start_us, b.start_us, CAST(0 AS BIGINT), CAST(array() AS ARRAY<STRING>), false
            FROM before b LEFT JOIN merged m ON m.user_id = b.user_id AND m.start_us = b.start_us
            WHERE m.user_id IS NULL)
        SELECT user_id, timestamp_micros(start_us) AS session_start, timestamp_micros(end_us) AS session_end, events,
               CAST(size(page_urls) AS BIGINT) AS pages, (end_us - start_us) / 1e6 AS duration_seconds, converted,
               to_date(timestamp_micros(start_us)) AS date, page_urls
        FROM changed"""


def user_sessions_step(step: PassStep) -> DataFrame | None:
    """``user_sessions`` kept by the ingest pass: per user, the micro-batch's clicks merged with the
    stored sessions they may extend or join (ending at most the gap before its first click,
    starting at most the gap after its last) by the stream's rule (:func:`sessions_merge_sql`).
    The rows are the sessions that changed, and a tombstone for a stored session that merged into
    another. The speed table keeps each session's pages for the next merge."""
    from pyspark.sql import functions as F

    clicks = step.events("clicks").select("user_id", "event_time", "page_url", "action")
    first, last = clicks.agg(F.min("event_time"), F.max("event_time")).first()
    if first is None:
        return None
    gap = SESSION_GAP  # Spark gives the bounds as naive UTC instants (the session's time zone)
    stored = step.stored(user_sessions.speed_table).where(
        f"session_end >= {sql_time(first - gap)} "
        f"AND session_start <= {sql_time(last + gap)}")
    stored = stored.join(clicks.select("user_id").distinct(), "user_id", "left_semi")
    return step.query(sessions_merge_sql(gap), {"stored": stored, "clicks": clicks})
