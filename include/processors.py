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
run on the executors, one call per key and micro-batch. The batch layer computes the same rules
with plain DataFrame operators (:mod:`include.views`).
"""

from __future__ import annotations

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


SESSION_STATE = "start long, end long, events long, pages array<string>, converted boolean"
SESSION_OUTPUT = "user_id string, start_us long, end_us long, events long, pages long, converted boolean"


class OpenSessions(StatefulProcessor):
    """Per user (key ``user_id``; rows ``event_us, page_url, action``): the sessions not yet
    closed by the watermark, emitted whenever they change."""

    def __init__(self, gap_us: int) -> None:
        self.gap_us = gap_us

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.sessions = handle.getListState("sessions", SESSION_STATE)

    def _stored(self) -> list[Session]:
        if not self.sessions.exists():
            return []
        return [Session(s[0], s[1], s[2], frozenset(s[3]), s[4]) for s in self.sessions.get()]

    def handleInputRows(self, key: tuple, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        (user_id,) = key
        before = self._stored()
        clicks = [Session(r.event_us, r.event_us, 1, frozenset([r.page_url]), r.action == "add_to_cart") for r in rows]
        after = merge_sessions(before + clicks, self.gap_us)
        unchanged = set(before) & set(after)
        starts = {session.start for session in after}
        for gone in before:
            if gone.start not in starts:
                yield Row(user_id=user_id, start_us=gone.start, end_us=gone.start, events=0, pages=0, converted=False)
        for session in after:
            if session not in unchanged:
                yield Row(user_id=user_id, start_us=session.start, end_us=session.end, events=session.events,
                          pages=len(session.pages), converted=session.converted)
        self._keep(after, timerValues.getCurrentWatermarkInMs())

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Row]:
        self._keep(self._stored(), timerValues.getCurrentWatermarkInMs())
        return iter([])

    def _keep(self, sessions: list[Session], watermark_ms: int) -> None:
        """Store the sessions a future on-time click (after the watermark) could still extend,
        and a timer for when the first of them closes."""
        watermark_us = watermark_ms * 1000
        open_ = [s for s in sessions if s.end + self.gap_us > watermark_us]
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)
        if not open_:
            self.sessions.clear()
            return
        self.sessions.put([(s.start, s.end, s.events, sorted(s.pages), s.converted) for s in open_])
        self.handle.registerTimer(min(s.end for s in open_) // 1000 + self.gap_us // 1000)

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
READING_STATE = "event_us long, centi long"
WINDOW_STATE = "orders long, detected_us long"


class AlertDetector(StatefulProcessor):
    """Per entity (key ``topic, entity_id``; rows ``event_us, temperature``): sensor readings
    raise ``high_temperature`` and ``temperature_anomaly``, orders ``order_velocity``. Each alert
    is emitted when raised; an order-velocity alert again when its window's count grows."""

    def __init__(self, rules: AlertRules) -> None:
        self.rules = rules

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.readings = handle.getListState("readings", READING_STATE)
        self.windows = handle.getMapState("windows", "window_us long", WINDOW_STATE)

    def handleInputRows(self, key: tuple, rows: Iterator[Row], timerValues: TimerValues) -> Iterator[Row]:
        topic, entity_id = key
        now_us = timerValues.getCurrentProcessingTimeInMs() * 1000  # the micro-batch's time: a replay sees the same
        horizon_us = timerValues.getCurrentWatermarkInMs() * 1000
        events = sorted(rows, key=lambda r: r.event_us)
        if topic == "sensors":
            alerts = self._readings(entity_id, events, now_us, horizon_us)
        else:
            alerts = self._orders(entity_id, events, now_us, horizon_us)
        return iter(alerts)

    def _readings(self, device_id: str, readings: list[Row], now_us: int, horizon_us: int) -> list[Row]:
        rules = self.rules
        recent = sorted(tuple(r) for r in self.readings.get()) if self.readings.exists() else []
        alerts = []
        for reading in readings:
            centi = round(reading.temperature * 100)
            if reading.temperature > rules.temperature_limit:
                alerts.append(self._alert("high_temperature", device_id, reading.event_us, reading.temperature,
                                          rules.temperature_limit, now_us))
            before = [c for t, c in recent if reading.event_us - rules.anomaly_lookback_us <= t < reading.event_us]
            z = z_score(before, centi, rules)
            if z is not None:
                alerts.append(self._alert("temperature_anomaly", device_id, reading.event_us, z, rules.anomaly_sigmas, now_us))
            recent.append((reading.event_us, centi))
        # A reading after the watermark looks back at most the lookback: older ones can go.
        keep_after = horizon_us - rules.anomaly_lookback_us
        recent = [(t, c) for t, c in sorted(recent) if t > keep_after]
        self._clear_timers()
        if recent:
            self.readings.put(recent)
            self.handle.registerTimer((recent[-1][0] + rules.anomaly_lookback_us) // 1000)
        else:
            self.readings.clear()
        return alerts

    def _orders(self, user_id: str, orders: list[Row], now_us: int, horizon_us: int) -> list[Row]:
        rules, width = self.rules, self.rules.velocity_window_us
        counts: dict[int, list[int]] = {}
        for order in orders:
            start = order.event_us - order.event_us % width
            if start not in counts:
                stored = self.windows.getValue((start,))
                counts[start] = [stored[0], stored[1]] if stored else [0, -1]
            counts[start][0] += 1
        alerts = []
        for start, (orders_in_window, detected_us) in sorted(counts.items()):
            if orders_in_window > rules.velocity_limit:
                detected_us = now_us if detected_us < 0 else detected_us
                alerts.append(self._alert("order_velocity", user_id, start, orders_in_window, rules.velocity_limit, detected_us))
            self.windows.updateValue((start,), (orders_in_window, detected_us))
        # A window the watermark has passed gets no more on-time orders.
        starts = [start for (start,) in self.windows.keys()] if self.windows.exists() else []
        for start in starts:
            if start + width <= horizon_us:
                self.windows.removeKey((start,))
        self._clear_timers()
        open_ = [start for start in starts if start + width > horizon_us]
        if open_:
            self.handle.registerTimer((max(open_) + width) // 1000)
        return alerts

    def handleExpiredTimer(self, key: tuple, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo) -> Iterator[Row]:
        horizon_us = timerValues.getCurrentWatermarkInMs() * 1000
        forget = self._readings if key[0] == "sensors" else self._orders
        return iter(forget(key[1], [], 0, horizon_us))

    def _clear_timers(self) -> None:
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)

    @staticmethod
    def _alert(kind: str, entity_id: str, event_us: int, value: float, threshold: float, detected_us: int) -> Row:
        return Row(kind=kind, entity_id=entity_id, event_us=event_us, value=float(value), threshold=float(threshold),
                   detected_us=detected_us)

    def close(self) -> None:
        pass


__all__ = ["AlertDetector", "AlertRules", "OpenSessions", "Session", "merge_sessions", "z_score"]
