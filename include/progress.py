"""Progress for long commands: a bar on a terminal, plain lines otherwise (logs, CI, pipes)."""

from __future__ import annotations

import sys
import time
from typing import IO

from tqdm import tqdm

PLAIN_LINE_SECONDS = 5.0  # without a terminal, at most one line per this many seconds


class Progress:
    """``done`` of ``total`` (unknown: None) ``unit``, with a note (e.g. events/s)."""

    def __init__(self, what: str, total: int | None, unit: str, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.what, self.total, self.unit = what, total, unit
        self.done, self.note, self._printed_at = 0, "", 0.0
        self.bar = tqdm(total=total, desc=what, unit=unit, file=self.stream, dynamic_ncols=True,
                        leave=True) if self.stream.isatty() else None

    def update(self, done: int, note: str = "", force: bool = False) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
            if note != self.note:
                self.bar.set_postfix_str(note, refresh=True)
        elif force or (done != self.done and time.monotonic() - self._printed_at >= PLAIN_LINE_SECONDS):
            of = f"/{self.total}" if self.total is not None else ""
            print(f"{self.what}: {done}{of} {self.unit}" + (f", {note}" if note else ""), file=self.stream, flush=True)
            self._printed_at = time.monotonic()
        self.done, self.note = done, note

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            self.update(self.done, self.note, force=True)  # the final count, always
