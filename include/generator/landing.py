"""Writing JSON Lines files into the landing zone, atomically and in arrival order."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path


class LandingZone:
    """``<landing>/<topic>/*.jsonl``; a file appears whole (write, then rename) or not at all.

    Spark's file source orders files by modification time, so each file gets an mtime strictly
    after the previous one's: files are read in the order they were written.
    """

    def __init__(self, landing_dir: Path) -> None:
        self.landing_dir = landing_dir
        self._last_mtime_ns = 0

    def path(self, topic: str, name: str) -> Path:
        return self.landing_dir / topic / f"{name}.jsonl"

    def write(self, topic: str, name: str, lines: Iterable[str]) -> Path:
        final = self.path(topic, name)
        if final.exists():
            raise FileExistsError(f"landing file {final} already exists; refusing to overwrite landed data")
        final.parent.mkdir(parents=True, exist_ok=True)
        # A leading dot and no .jsonl suffix: Spark ignores the file until it is renamed.
        temporary = final.with_name(f".{name}.tmp")
        with temporary.open("w", encoding="utf-8", newline="\n") as handle:
            for line in lines:
                handle.write(line)
                handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        mtime_ns = max(time.time_ns(), self._last_mtime_ns + 1_000_000)
        self._last_mtime_ns = mtime_ns
        os.utime(temporary, ns=(mtime_ns, mtime_ns))
        os.replace(temporary, final)
        return final

    def flush(self) -> None:
        """Nothing to wait for: each file is on disk once ``write`` returns."""
