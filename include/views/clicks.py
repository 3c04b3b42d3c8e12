"""The clicks family: traffic per page in sliding 10-minute windows, and user sessions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from include import ddl
from include.registry import Partials, PassStep, Speed, ViewContext, sql_time, view
from include.views.rules import (
    DASHBOARD_REFRESH, distinct_count_sql, merged_distinct_count, sketch_of, window_start_sql,
)

if TYPE_CHECKING:
    import pyarrow as pa
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
    speed=Speed(mode="update", freshness_time="window_start", partials=Partials(
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
    speed=Speed(mode="update", freshness_time="session_end", tombstone="s.events = 0", refresh=DASHBOARD_REFRESH,
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


@dataclass(frozen=True)
class Session:
    start: int  # first click, µs
    end: int  # last click, µs
    events: int
    pages: frozenset[str]
    converted: bool


def merge_sessions(sessions: Iterable[Session], gap_us: int) -> list[Session]:
    """Sessions (single clicks included) merged where the next starts at most ``gap_us`` after the
    previous ends: Spark's ``session_window`` rule (a click exactly the gap later continues)."""
    merged: list[Session] = []
    for session in sorted(sessions, key=lambda s: (s.start, s.end)):
        last = merged[-1] if merged else None
        if last is not None and session.start - last.end <= gap_us:
            merged[-1] = Session(last.start, max(last.end, session.end), last.events + session.events,
                                 last.pages | session.pages, last.converted or session.converted)
        else:
            merged.append(session)
    return merged


def user_sessions_step(step: PassStep) -> pa.Table:
    """``user_sessions`` kept by the ingest pass: per user, the micro-batch's clicks merged with the
    stored sessions they may extend or join (ending at most the gap before its first click,
    starting at most the gap after its last) by the stream's rule (:func:`merge_sessions`). The
    rows are the sessions that changed, and a tombstone (``events = 0``) for a stored session that
    merged into another. The speed table keeps each session's pages for the next merge."""
    import pyarrow as pa
    import pyarrow.compute as pc

    gap, fields = SESSION_GAP, user_sessions.speed_fields
    clicks = step.events("clicks")
    if clicks.num_rows == 0:
        return ddl.arrow_schema(fields).empty_table()
    first, last = pc.min_max(clicks["event_time"]).values()
    users = pc.unique(clicks["user_id"]).to_pylist()
    stored = step.stored(user_sessions.speed_table, fields, f"session_end >= {sql_time(first.as_py() - gap)} "
                         f"AND session_start <= {sql_time(last.as_py() + gap)}", "user_id", users)
    before: dict[str, list[Session]] = {}
    for user, start, end, events, pages, converted in zip(*(micros(stored[name]) for name in (
            "user_id", "session_start", "session_end", "events", "page_urls", "converted"))):
        before.setdefault(user, []).append(Session(start, end, events, frozenset(pages or ()), converted))
    sessions = {user: list(kept) for user, kept in before.items()}
    for user, at, page, action in zip(*(micros(clicks[name]) for name in ("user_id", "event_time", "page_url",
                                                                            "action"))):
        sessions.setdefault(user, []).append(Session(at, at, 1, frozenset([page]), action == "add_to_cart"))
    rows = []
    for user in users:
        stored_sessions = set(before.get(user, ()))
        merged = merge_sessions(sessions[user], int(gap / timedelta(microseconds=1)))
        starts = {session.start for session in merged}
        rows += [(user, Session(gone.start, gone.start, 0, frozenset(), False)) for gone in stored_sessions
                 if gone.start not in starts]
        rows += [(user, session) for session in merged if session not in stored_sessions]
    start = pa.array([session.start for _, session in rows], pa.timestamp("us", "UTC"))
    table = pa.table({
        "user_id": pa.array([user for user, _ in rows], pa.string()),
        "session_start": start,
        "session_end": pa.array([session.end for _, session in rows], pa.timestamp("us", "UTC")),
        "events": pa.array([session.events for _, session in rows], pa.int64()),
        "pages": pa.array([len(session.pages) for _, session in rows], pa.int64()),
        "duration_seconds": pa.array([(session.end - session.start) / 1e6 for _, session in rows], pa.float64()),
        "converted": pa.array([session.converted for _, session in rows], pa.bool_()),
        "date": pc.cast(start, pa.date32()),
        "page_urls": pa.array([sorted(session.pages) for _, session in rows], pa.list_(pa.string())),
    })
    return table


def micros(column):  # noqa: ANN001, ANN201 - pyarrow
    """A column's Python values, timestamps as microseconds since the epoch."""
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return column.to_pylist()
