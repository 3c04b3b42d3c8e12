"""Spark's streaming checkpoints read without Spark: the newest batch a query committed, and the
files its file sources planned, by batch (what a replay of an uncommitted batch reads again)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import unquote, urlparse


def committed_batch(query: Path) -> int:
    """The newest batch ``commits/`` records, -1 before the first."""
    return max((int(path.name) for path in (query / "commits").glob("*") if path.name.isdigit()), default=-1)


def batch_time(query: Path, batch_id: int) -> datetime:
    """The time Spark gave micro-batch ``batch_id`` (its ``current_timestamp()``), from the batch's
    entry in the offset log (``offsets/N``: a version line, then its metadata): a replay reads the same."""
    lines = (query / "offsets" / str(batch_id)).read_text(encoding="utf-8").splitlines()
    return datetime.fromtimestamp(json.loads(lines[1])["batchTimestampMs"] / 1000, timezone.utc)


def file_source_reads(query: Path) -> dict[Path, int]:
    """Every file the query's file sources planned, with the batch that reads it."""
    return {path: batch for path, (batch, _) in file_source_entries(query).items()}


def file_source_entries(query: Path) -> dict[Path, tuple[int, int]]:
    """Every file the query's file sources planned: the batch that reads it and the file's
    modification time (ms) when it was listed. The source logs (``sources/*/N``, compacted into
    ``N.compact`` every few batches) hold a version line, then one ``{"path", "timestamp",
    "batchId"}`` per line."""
    reads: dict[Path, tuple[int, int]] = {}
    for log in sorted((query / "sources").glob("*/*")):
        if not log.name.removesuffix(".compact").isdigit():
            continue
        for line in log.read_text(encoding="utf-8").splitlines()[1:]:
            try:
                entry = json.loads(line)
            except ValueError:  # a torn log: lambdalake doctor's finding, not this reader's
                continue
            if isinstance(entry, dict) and "path" in entry:
                reads[Path(unquote(urlparse(entry["path"]).path))] = (entry["batchId"], entry["timestamp"])
    return reads


__all__ = ["batch_time", "committed_batch", "file_source_entries", "file_source_reads"]
