"""Stateful processors (Spark 4's ``transformWithState``) for the speed side of two views.

Why not Spark's built-in operators:

- ``user_sessions``: ``session_window`` in a stream emits a session only once the watermark has
  closed it (it has no update mode), so a session in progress would be invisible for at least the
  gap plus the watermark delay. :class:`OpenSessions` keeps each user's open sessions as state and
  emits a session as soon as it changes; when an out-of-order click merges two sessions or moves
  a start earlier, the key that went away gets a tombstone row (``events = 0``).
- ``alerts``: a z-score over each reading's previous 15 minutes is a per-reading sliding frame,
  which no streaming aggregation offers; and an alert must be raised the moment its condition
  holds (a window's sixth order), once. :class:`AlertDetector` keeps each device's recent readings
  and each user's open 5-minute order counts, raises each alert once, and frees state with
  event-time timers once the watermark has passed it.

Both receive event times as microseconds since the epoch (no time-zone conversion in Python) and
run on the executors, one call per key and micro-batch. Every call to a key's state is a round
trip to the JVM, so each key keeps one value (a device's up to 900 recent readings packed into
bytes, not a list state of 900 rows to read and rewrite each second) and one timer, registered
once rather than moved with every micro-batch. The batch layer computes the same rules with plain
DataFrame operators (:mod:`include.views`).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pyspark.sql import Row
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)

MINUTE_US = 60_000_000


# ---- user sessions ---------------------------------------------------------------------------
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


def keep_with_timer(handle: StatefulProcessorHandle, state, value: object | None, timer_ms: int | None,  # noqa: ANN001
                    due_ms: int) -> None:
    """Store a key's ``value`` (None: clear its state) with its one timer: ``timer_ms`` when it has
    one registered, else a new one at ``due_ms``."""
    if value is None:
        state.clear()
        return
    if timer_ms is None:
        timer_ms = due_ms
        handle.registerTimer(timer_ms)
    state.update((value, timer_ms))


SESSION_STATE = (
    "sessions array<struct<start: long, end: long, events: long, pages: array<string>, converted: boolean>>, "
    "timer_ms long"
)
SESSION_OUTPUT = ("user_id string, start_us long, end_us long, events long, pages long, converted boolean, "
                  "page_urls array<string>")


class OpenSessions(StatefulProcessor):
    """Per user (key ``user_id``; rows ``event_us, page_url, action``): the sessions not yet
    closed by the watermark, emitted whenever they change. The state is one value per user (its
    open sessions and the time of its timer); the timer is registered when the user first keeps
    state, for when the first session could close, and the next one when it fires (as in
    :class:`AlertDetector`)."""

    def __init__(self, gap_us: int) -> None:
        self.gap_us = gap_us

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("open_sessions", SESSION_STATE)

    def _stored(self) -> tuple[list[Session], int | None]:
        """The user's open sessions and the time of its timer."""
        stored = self.state.get()
        if not stored:
            return [], None
        return [Session(s[0], s[1], s[2], frozenset(s[3]), s[4]) for s in stored[0]], stored[1]

    def handleInputRows(self, key: tuple, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        (user_id,) = key
        before, timer_ms = self._stored()
        clicks = [Session(r.event_us, r.event_us, 1, frozenset([r.page_url]), r.action == "add_to_cart") for r in rows]
        after = merge_sessions(before + clicks, self.gap_us)
        unchanged = set(before) & set(after)
        starts = {session.start for session in after}
        for gone in before:
            if gone.start not in starts:
                yield Row(user_id=user_id, start_us=gone.start, end_us=gone.start, events=0, pages=0, converted=False,
                          page_urls=[])
        for session in after:
            if session not in unchanged:
                yield Row(user_id=user_id, start_us=session.start, end_us=session.end, events=session.events,
                          pages=len(session.pages), converted=session.converted, page_urls=sorted(session.pages))
        self._keep(after, timerValues.getCurrentWatermarkInMs(), timer_ms)

    def handleExpiredTimer(
        self, key: tuple, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        self._keep(self._stored()[0], timerValues.getCurrentWatermarkInMs(), None)  # the timer fired
        return iter([])

    def _keep(self, sessions: list[Session], watermark_ms: int, timer_ms: int | None) -> None:
        """Store the sessions a future on-time click (after the watermark) could still extend,
        with a timer (``timer_ms``, the one registered, or a new one) for when they may close."""
        watermark_us = watermark_ms * 1000
        open_ = [s for s in sessions if s.end + self.gap_us > watermark_us]
        value = [(s.start, s.end, s.events, sorted(s.pages), s.converted) for s in open_] or None
        due_ms = min((s.end for s in open_), default=0) // 1000 + self.gap_us // 1000
        keep_with_timer(self.handle, self.state, value, timer_ms, due_ms)

    def close(self) -> None:
        pass


# ---- alerts ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class AlertRules:
    temperature_limit: float
    velocity_limit: int
    anomaly_lookback_us: int = 15 * MINUTE_US
    anomaly_min_readings: int = 5
    anomaly_sigmas: int = 3
    velocity_window_us: int = 5 * MINUTE_US


def z_score(centis: list[int], value: int, rules: AlertRules) -> float | None:
    """The z-score of ``value`` against ``centis`` (hundredths of a degree) when it is an anomaly:
    at least the minimum readings, a non-zero deviation, and more than the limit of sample
    standard deviations from their mean. Decided in exact integers, so every layer agrees."""
    n = len(centis)
    if n < rules.anomaly_min_readings:
        return None
    total, squares = sum(centis), sum(c * c for c in centis)
    spread = n * squares - total * total  # n²·variance·(n−1)/n: zero when every reading is equal
    distance = n * value - total
    if spread <= 0 or distance * distance * (n - 1) <= rules.anomaly_sigmas ** 2 * n * spread:
        return None
    return float(distance) / (float(n * spread) / (n - 1)) ** 0.5


ALERT_OUTPUT = "kind string, entity_id string, event_us long, value double, threshold double, detected_us long"
# A key's state is one value: its numbers packed as 64-bit integers (a device's recent readings,
# up to 900 at one a second, cross to the JVM as one field, not as 900 rows), and the time of
# the timer it has registered.
HISTORY_STATE = "readings binary, timer_ms long"  # (event_us, centi) pairs, by event time
WINDOWS_STATE = "windows binary, timer_ms long"  # (start_us, orders, detected_us) triples, by start


def pack(numbers: Iterable[int]) -> bytes:
    return array("q", numbers).tobytes()


def unpack(blob: bytes | None, width: int) -> list[tuple[int, ...]]:
    """Tuples of ``width`` integers from :func:`pack`'s bytes."""
    numbers = array("q")
    numbers.frombytes(blob or b"")
    return list(zip(*(numbers[i::width] for i in range(width))))


class AlertDetector(StatefulProcessor):
    """Per entity (key ``topic, entity_id``; rows ``event_us, temperature``): sensor readings
    raise ``high_temperature`` and ``temperature_anomaly``, orders ``order_velocity``. Each alert
    is emitted when raised; an order-velocity alert again when its window's count grows.

    A key registers one timer, when it first keeps state, for when that state could first be
    dropped; when it fires, what the watermark has passed is dropped and, if anything is left, the
    next timer is registered. (Moving the timer with every micro-batch cost two more round trips
    to the JVM per key and micro-batch.)"""

    def __init__(self, rules: AlertRules) -> None:
        self.rules = rules

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.history = handle.getValueState("history", HISTORY_STATE)
        self.windows = handle.getValueState("order_windows", WINDOWS_STATE)

    def handleInputRows(self, key: tuple, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        topic, entity_id = key
        now_us = timerValues.getCurrentProcessingTimeInMs() * 1000  # the micro-batch's time: a replay sees the same
        horizon_us = timerValues.getCurrentWatermarkInMs() * 1000
        events = sorted(rows, key=lambda r: r.event_us)
        if topic == "sensors":
            alerts = self._readings(entity_id, events, now_us, horizon_us, timer_fired=False)
        else:
            alerts = self._orders(entity_id, events, now_us, horizon_us, timer_fired=False)
        return iter(alerts)

    def _readings(
        self, device_id: str, readings: list[Row], now_us: int, horizon_us: int, timer_fired: bool
    ) -> list[Row]:
        rules = self.rules
        stored = self.history.get()
        recent = unpack(stored[0] if stored else None, 2)
        times, centis = [t for t, _ in recent], [c for _, c in recent]
        alerts = []
        for reading in readings:
            centi = round(reading.temperature * 100)
            if reading.temperature > rules.temperature_limit:
                alerts.append(self._alert("high_temperature", device_id, reading.event_us, reading.temperature,
                                          rules.temperature_limit, now_us))
            first, last = (bisect_left(times, reading.event_us - rules.anomaly_lookback_us),
                           bisect_left(times, reading.event_us))
            z = z_score(centis[first:last], centi, rules)
            if z is not None:
                alerts.append(self._alert("temperature_anomaly", device_id, reading.event_us, z, rules.anomaly_sigmas,
                                          now_us))
            at = bisect_right(times, reading.event_us)
            times.insert(at, reading.event_us)
            centis.insert(at, centi)
        # A reading after the watermark looks back at most the lookback: older ones can go.
        keep = bisect_right(times, horizon_us - rules.anomaly_lookback_us)
        times, centis = times[keep:], centis[keep:]
        value = pack(n for pair in zip(times, centis) for n in pair) if times else None
        due_ms = (times[-1] + rules.anomaly_lookback_us) // 1000 if times else 0
        keep_with_timer(self.handle, self.history, value, None if timer_fired or not stored else stored[1], due_ms)
        return alerts

    def _orders(self, user_id: str, orders: list[Row], now_us: int, horizon_us: int, timer_fired: bool) -> list[Row]:
        rules, width = self.rules, self.rules.velocity_window_us
        stored = self.windows.get()
        windows = {start: [count, detected] for start, count, detected in unpack(stored[0] if stored else None, 3)}
        changed = set()
        for order in orders:
            start = order.event_us - order.event_us % width
            windows.setdefault(start, [0, -1])[0] += 1
            changed.add(start)
        alerts = []
        for start in sorted(changed):
            if windows[start][0] > rules.velocity_limit:
                windows[start][1] = now_us if windows[start][1] < 0 else windows[start][1]
                alerts.append(self._alert("order_velocity", user_id, start, windows[start][0], rules.velocity_limit,
                                          windows[start][1]))
        # A window the watermark has passed gets no more on-time orders.
        open_ = sorted(start for start in windows if start + width > horizon_us)
        value = pack(n for start in open_ for n in (start, *windows[start])) if open_ else None
        due_ms = (open_[-1] + width) // 1000 if open_ else 0
        keep_with_timer(self.handle, self.windows, value, None if timer_fired or not stored else stored[1], due_ms)
        return alerts

    def handleExpiredTimer(
        self, key: tuple, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[Row]:
        horizon_us = timerValues.getCurrentWatermarkInMs() * 1000
        forget = self._readings if key[0] == "sensors" else self._orders
        return iter(forget(key[1], [], 0, horizon_us, timer_fired=True))

    @staticmethod
    def _alert(kind: str, entity_id: str, event_us: int, value: float, threshold: float, detected_us: int) -> Row:
        return Row(kind=kind, entity_id=entity_id, event_us=event_us, value=float(value), threshold=float(threshold),
                   detected_us=detected_us)

    def close(self) -> None:
        pass


__all__ = [
    "AlertDetector", "AlertRules", "OpenSessions", "Session", "keep_with_timer", "merge_sessions", "pack", "unpack",
    "z_score",
]
