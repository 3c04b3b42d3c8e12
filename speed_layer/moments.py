"""Running moments over a look-back: for each new event, the count, sum and sum of squares of an
integer value over the same entity's events in ``[time - span, time - 1 µs]``, what the window
``PARTITION BY entity ORDER BY micros RANGE BETWEEN span PRECEDING AND 1 PRECEDING`` gives, in
O(log n) per event instead of a window over the whole look-back every micro-batch.

The kept events are arrays sorted by (entity, time). An event's statistics are differences of
prefix sums between two binary searches. Sums are exact: int64 while no window can overflow it
(prefix sums wrap, their differences do not), Python integers beyond that.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT64_SAFE = 1 << 62
# Entities remembered beyond those with kept events before their codes are renumbered.
SPARE_CODES = 1024


class Moments:
    """The kept events of one look-back, and the statistics of new ones over them."""

    def __init__(self, span_us: int) -> None:
        self.span_us = span_us
        self._codes: dict[str, int] = {}  # entity -> code; codes sort the kept arrays
        self.code = np.empty(0, np.int64)
        self.micros = np.empty(0, np.int64)
        self.value = np.empty(0, np.int64)  # object (Python ints) once a value exceeds int64

    def __len__(self) -> int:
        return len(self.code)

    def add(self, entities: pa.Array, micros: np.ndarray, values: pa.Array) -> None:
        """Keep events: ``entities`` (strings), ``micros`` (event times) and exact integer ``values``."""
        code, values = self._encode(entities), _integers(values)
        if values.dtype == object and self.value.dtype != object:
            self.value = self.value.astype(object)
        elif self.value.dtype == object:
            values = values.astype(object)
        keys, (new,) = self._keys((code, micros))
        order = np.argsort(new, kind="stable")
        at = np.searchsorted(keys, new[order], side="right")
        self.code = np.insert(self.code, at, code[order])
        self.micros = np.insert(self.micros, at, micros[order])
        self.value = np.insert(self.value, at, values[order])

    def window(self, entities: pa.Array, micros: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Count, sum and sum of squares of the kept values of each (entity, time) in
        ``[time - span, time - 1]``."""
        code = self._encode(entities)
        if not len(code):  # no fresh event: no prefix sums over the kept ones
            return (np.empty(0, np.int64),) * 3
        keys, (low, high) = self._keys((code, micros - self.span_us), (code, micros))
        low_end, high_end = np.searchsorted(keys, low, "left"), np.searchsorted(keys, high, "left")
        value = self.value
        if value.dtype != object and len(value) and int(np.abs(value).max()) ** 2 * len(value) >= INT64_SAFE:
            value = value.astype(object)
        sums = [np.concatenate([np.zeros(1, part.dtype), part]).cumsum()
                for part in (np.ones(len(value), np.int64), value, value * value)]
        count, total, squares = (prefix[high_end] - prefix[low_end] for prefix in sums)
        return count, total, squares

    def forget(self, before_micros: int) -> None:
        """Drop the kept events at or before ``before_micros`` (no later event looks back at them)."""
        keep = self.micros > before_micros
        if keep.all():
            return
        self.code, self.micros, self.value = self.code[keep], self.micros[keep], self.value[keep]
        live = np.flatnonzero(np.bincount(self.code, minlength=len(self._codes)))
        if len(self._codes) > len(live) + SPARE_CODES:  # entities come and go: renumber the live ones
            names = {code: name for name, code in self._codes.items()}
            self._codes = {names[code]: new for new, code in enumerate(live.tolist())}
            self.code = np.searchsorted(live, self.code).astype(np.int64)

    def _encode(self, entities: pa.Array) -> np.ndarray:
        # New entities get codes after the existing ones, so the kept order stays sorted.
        codes = self._codes
        return np.fromiter((codes.setdefault(name, len(codes)) for name in entities.to_pylist()), np.int64,
                           len(entities))

    def _keys(self, *pairs: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Int64 keys in (entity, time) order of the kept events and of each (codes, micros) pair."""
        times = [self.micros, *(micros for _, micros in pairs)]
        low = min((int(part.min()) for part in times if len(part)), default=0)
        high = max((int(part.max()) for part in times if len(part)), default=0)
        factor, rank = high - low + 1, lambda micros: micros - low
        if max(len(self._codes), 1) * factor >= INT64_SAFE:  # times far apart (a clock years off): rank them
            distinct = np.unique(np.concatenate(times))
            factor, rank = len(distinct), lambda micros: np.searchsorted(distinct, micros)
        return self.code * factor + rank(self.micros), [code * factor + rank(micros) for code, micros in pairs]


def _integers(values: pa.Array) -> np.ndarray:
    """Exact integers (a DECIMAL(38,0) or integer column) as int64, or Python ints beyond int64."""
    try:
        return pc.cast(values, pa.int64()).to_numpy(zero_copy_only=False)
    except pa.ArrowInvalid:
        return np.array([int(value) for value in values.to_pylist()], dtype=object)


__all__ = ["Moments"]
