"""What one client may cost ``lambdalake serve``: at most N user queries run at once, over HTTP
and the PostgreSQL wire protocol together.

A query holds a slot while DuckDB computes it, not while its answer is sent: the rows are fetched
first (at most the row cap), so a slow reader never keeps a slot. Queries past the limit wait for
one, first come first served, up to the query time limit, then fail with :class:`ServerBusy`.
The server's own reads (``/api/status``, ``/metrics``, the dashboard's status) take no slot, so
they keep answering while runaway queries fill every slot.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ServerBusy(RuntimeError):
    """Every query slot stayed taken for as long as a query may run."""


class QuerySlots:
    def __init__(self, limit: int, wait_seconds: float | None) -> None:
        if limit < 1:
            raise ValueError(f"the number of concurrent queries must be at least 1, got {limit}")
        self.limit = limit
        self.wait_seconds = wait_seconds
        self._free = threading.BoundedSemaphore(limit)  # waiters wake in the order they came
        self._lock = threading.Lock()
        self.running = 0

    @contextmanager
    def hold(self) -> Iterator[None]:
        """A slot for the duration of the block; raises :class:`ServerBusy` when none frees up in time."""
        if not self._free.acquire(timeout=self.wait_seconds):
            raise ServerBusy(f"the server is busy: {self.limit} queries are running "
                             "(LAMBDALAKE_MAX_CONCURRENT_QUERIES); try again later")
        with self._lock:
            self.running += 1
        try:
            yield
        finally:
            with self._lock:
                self.running -= 1
            self._free.release()
