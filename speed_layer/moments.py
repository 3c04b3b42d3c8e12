"""Running moments over a look-back: for each new event, the count, sum and sum of squares of an
integer value over the same entity's events in ``[time - span, time - 1 µs]``, what the window
``PARTITION BY entity ORDER BY micros RANGE BETWEEN span PRECEDING AND 1 PRECEDING`` gives, in
O(log n) per event instead of a window over the whole look-back every micro-batch.

The kept events are a few sorted runs (by entity, then time), each with prefix sums of its values
and their squares: an event's statistics are, per run, differences of prefix sums between two
binary searches. A micro-batch's events make a run of their own, and a run is merged with the one
before it once it is at least half its size (a binary counter), so a micro-batch costs its events
times the log of the kept ones, not a pass over all of them. Sums are exact: int64 while no window
can overflow it (prefix sums wrap, their differences do not), Python integers beyond that.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT64_SAFE = 1 << 62
# Entities remembered beyond those with kept events before their codes are renumbered.
SPARE_CODES = 1024
# Forget calls between passes that drop forgotten events from runs still holding newer ones.
SWEEP_EVERY = 64


class _Run:
    """Events sorted by (code, time), keyed for binary search, with prefix sums of value and square."""

    def __init__(self, code: np.ndarray, micros: np.ndarray, value: np.ndarray) -> None:
        order = np.lexsort((micros, code))
        self.code, self.micros, self.value = code[order], micros[order], value[order]
        self.low, self.high = int(self.micros.min()), int(self.micros.max())
        self.max_code = int(self.code.max())
        self.factor, self.distinct = self.high - self.low + 2, None
        if (self.max_code + 2) * self.factor >= INT64_SAFE:  # times far apart (a clock years off): rank them
            self.distinct = np.unique(self.micros)
            self.factor = len(self.distinct) + 1
        self.keys = self._keys(self.code, self.micros)
        value = self.value
        self.big = value.dtype == object or (len(value) and int(np.abs(value).max()) ** 2 * len(value) >= INT64_SAFE)
        if self.big:
            value = value.astype(object)
        self.sums = [np.concatenate([np.zeros(1, value.dtype), part.cumsum()]) for part in (value, value * value)]
        self.bound = int(np.abs(self.value).max()) if len(self.value) else 0

    def __len__(self) -> int:
        return len(self.code)

    def _keys(self, code: np.ndarray, micros: np.ndarray) -> np.ndarray:
        # A query's codes beyond the run's and times outside it land after or before its entity's events.
        code = np.minimum(code, self.max_code + 1)
        if self.distinct is None:
            return code * self.factor + (np.clip(micros, self.low, self.high + 1) - self.low)
        return code * self.factor + np.searchsorted(self.distinct, micros, "left")

    def window(self, code: np.ndarray, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, ...]:
        """Count, sum and sum of squares of the run's events of each code in ``[low, high)``."""
        low_end = np.searchsorted(self.keys, self._keys(code, low), "left")
        high_end = np.searchsorted(self.keys, self._keys(code, high), "left")
        total, squares = (prefix[high_end] - prefix[low_end] for prefix in self.sums)
        return high_end - low_end, total, squares

    def after(self, before_micros: int) -> _Run | None:
        """The run without its events at or before ``before_micros`` (None if none is left)."""
        keep = self.micros > before_micros
        return None if not keep.any() else self if keep.all() else _Run(
            self.code[keep], self.micros[keep], self.value[keep])


class Moments:
    """The kept events of one look-back, and the statistics of new ones over them."""

    def __init__(self, span_us: int) -> None:
        self.span_us = span_us
        self._codes: dict[str, int] = {}  # entity -> code; codes sort the kept events
        self._live_codes = 0  # codes with kept events when last counted
        self._runs: list[_Run] = []  # the oldest (largest) first
        self._forgotten: int | None = None  # events at or before it are forgotten
        self._forgets = 0

    def __len__(self) -> int:
        """The kept events not forgotten."""
        cut = self._forgotten
        return sum(len(run) if cut is None else int(np.count_nonzero(run.micros > cut)) for run in self._runs)

    def add(self, entities: pa.Array, micros: np.ndarray, values: pa.Array) -> None:
        """Keep events: ``entities`` (strings), ``micros`` (event times) and exact integer ``values``."""
        code, values = self._encode(entities), _integers(values)
        if not len(code):
            return
        self._runs.append(_Run(code, np.asarray(micros, np.int64), values))
        while len(self._runs) > 1 and 2 * len(self._runs[-1]) >= len(self._runs[-2]):
            newer, older = self._runs.pop(), self._runs.pop()
            merged = _Run(*(np.concatenate([getattr(older, name), getattr(newer, name)])
                            for name in ("code", "micros", "value")))
            merged = merged.after(self._forgotten) if self._forgotten is not None else merged
            if merged is not None:
                self._runs.append(merged)

    def window(self, entities: pa.Array, micros: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Count, sum and sum of squares of the kept values of each (entity, time) in
        ``[time - span, time - 1]``: each time later than the last forgetting's plus the span
        (forgotten events not swept yet are still in the runs)."""
        code = self._encode(entities)
        micros = np.asarray(micros, np.int64)
        count = np.zeros(len(code), np.int64)
        kept = sum(len(run) for run in self._runs)
        big = any(run.big for run in self._runs) or (
            self._runs and max(run.bound for run in self._runs) ** 2 * kept >= INT64_SAFE)
        total, squares = (np.zeros(len(code), object if big else np.int64) for _ in range(2))
        for run in self._runs:
            n, s, q = run.window(code, micros - self.span_us, micros)
            count += n
            total += s.astype(object) if big else s
            squares += q.astype(object) if big else q
        return count, total, squares

    def forget(self, before_micros: int) -> None:
        """Forget the kept events at or before ``before_micros`` (no later event looks back at
        them): runs of them only go at once; the others now and then."""
        self._forgotten = max(before_micros, self._forgotten or before_micros)
        self._runs = [run for run in self._runs if run.high > before_micros]
        self._forgets += 1
        if self._forgets % SWEEP_EVERY and len(self._codes) <= self._live_codes + SPARE_CODES:
            return
        self._runs = [kept for run in self._runs if (kept := run.after(before_micros)) is not None]
        live = np.unique(np.concatenate([run.code for run in self._runs])) if self._runs else np.empty(0, np.int64)
        self._live_codes = len(live)
        if len(self._codes) > len(live) + SPARE_CODES:  # entities come and go: renumber the live ones (same order)
            names = {code: name for name, code in self._codes.items()}
            self._codes = {names[code]: new for new, code in enumerate(live.tolist())}
            self._runs = [_Run(np.searchsorted(live, run.code).astype(np.int64), run.micros, run.value)
                          for run in self._runs]

    def _encode(self, entities: pa.Array) -> np.ndarray:
        # New entities get codes after the existing ones, so the kept order stays sorted.
        codes = self._codes
        return np.fromiter((codes.setdefault(name, len(codes)) for name in entities.to_pylist()), np.int64,
                           len(entities))


def _integers(values: pa.Array) -> np.ndarray:
    """Exact integers (a DECIMAL(38,0) or integer column) as int64, or Python ints beyond int64."""
    try:
        return pc.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return np.array([int(value) for value in values.to_pylist()], dtype=object)


__all__ = ["Moments"]
