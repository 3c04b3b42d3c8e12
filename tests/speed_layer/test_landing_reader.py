"""The driver's landing-zone reader: the same lines, sources and arrivals as Spark's text source,
Spark's checkpoint layout (which the backlog, doctor and maintenance read), replays of a planned
micro-batch, and a bounded log. Real files, real Spark."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone

import pyarrow as pa
from pyspark.sql import functions as F

from include.backlog import landed_files, landing_backlog, taken_through, total
from include.checkpoints import batch_time, committed_batch, file_source_entries
from speed_layer.landing_reader import COMPACT_INTERVAL, LandingLog, read_lines
from speed_layer.sources import RAW_COLUMNS

AT = datetime(2026, 11, 28, 12, tzinfo=timezone.utc)


def write(path, data: bytes, mtime: float | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_lines_are_those_spark_reads(spark, tmp_path):
    folder = tmp_path / "landing" / "orders"
    contents = {
        "lf.jsonl": b'{"a": 1}\n{"a": 2}\n',
        "no final newline.jsonl": b'{"a": 3}\n{"a": 4}',
        "crlf%and#.jsonl": b'{"a": 5}\r\n\r\n{"a": 6}\r\n',
        "cr.jsonl": b'{"a": 7}\r{"a": 8}\r',
        "empty.jsonl": b"",
        "blank lines.jsonl": b"\n\n\n",
        "bad-utf8.jsonl": b'{"a": "\xff\xfe"}\n\xc3\x28\n',
        "unicodé.jsonl": '{"a": "é"}\n'.encode(),
    }
    for number, (name, data) in enumerate(contents.items()):
        write(folder / name, data, 1_795_000_000.123 + number)
    ours = read_lines(landed_files(folder, "orders"))
    theirs = spark.read.format("text").load(str(folder)).select(
        F.lit("orders").alias("topic"), F.col("value").cast("binary").alias("value"),
        F.col("_metadata.file_path").alias("source"), F.col("_metadata.file_modification_time").alias("arrived_at"),
    ).toArrow()

    def rows(table: pa.Table) -> list[tuple]:
        return sorted(tuple(row.values()) for row in table.select(list(RAW_COLUMNS)).to_pylist())

    assert rows(ours) == rows(theirs)
    assert ours.num_rows == 15  # blank lines are lines too


def test_files_are_planned_committed_and_replayed_in_sparks_layout(settings, land):
    checkpoint = settings.checkpoints_dir / "speed_ingest"
    first = land("orders", "0001", ["{}"])
    os.utime(first, (1_795_000_000, 1_795_000_000))
    land("clicks", "0001", ["{}"])
    log = LandingLog(checkpoint, settings)
    files = [*log.new_files("orders"), *log.new_files("clicks")]
    assert [file.path for file in log.new_files("orders")] == [first]
    log.plan(0, files, AT)
    assert log.new_files("orders") == []  # taken once planned
    # A run killed before the commit: the restart replays the same files at the same time.
    again = LandingLog(checkpoint, settings)
    replay = again.replay()
    assert replay.batch_id == 0 and replay.at == AT and {f.path for f in replay.files} == {f.path for f in files}
    assert batch_time(checkpoint, 0) == AT
    again.commit(0)
    assert committed_batch(checkpoint) == 0 and LandingLog(checkpoint, settings).replay() is None
    # What reads Spark's checkpoints reads this one.
    assert {path: batch for path, (batch, _) in file_source_entries(checkpoint).items()} == {
        file.path: 0 for file in files}
    assert taken_through(settings)["orders"] == datetime.fromtimestamp(1_795_000_000, timezone.utc)
    second = land("orders", "0002", ["{}"])
    backlog = landing_backlog(settings)
    assert backlog["orders"].files == 1 and total(backlog).files == 1
    # Killed after its files' entry and before its offsets: planned again, with the same files.
    log = LandingLog(checkpoint, settings)
    log.plan(1, log.new_files("orders"), datetime.now(timezone.utc))
    (checkpoint / "offsets" / "1").unlink()
    replay = LandingLog(checkpoint, settings).replay()
    assert [file.path for file in replay.files] == [second] and batch_time(checkpoint, 1) == replay.at


def test_the_log_keeps_only_files_still_landed_and_not_too_old(settings, land):
    checkpoint = settings.checkpoints_dir / "speed_ingest"
    settings = settings.model_copy(update={"landing_max_file_age": timedelta(hours=1)})
    log = LandingLog(checkpoint, settings)
    start = 1_795_000_000
    for batch in range(2 * COMPACT_INTERVAL):
        path = land("orders", f"{batch:04d}", ["{}"])
        os.utime(path, (start + batch, start + batch))
        log.plan(batch, log.new_files("orders"), AT)
        log.commit(batch)
        if batch == 3:
            path.unlink()  # deleted after it was read: it can never be read again, and is forgotten
    sources = sorted(path.name for path in (checkpoint / "sources" / "1").iterdir())  # orders' log
    assert sources == [f"{2 * COMPACT_INTERVAL - 1}.compact"]  # the compaction holds every earlier entry
    entries = file_source_entries(checkpoint)
    assert len(entries) == 2 * COMPACT_INTERVAL - 1 and all(path.exists() for path in entries)
    # A file older than the newest by more than the age is ignored, and forgotten.
    old = land("orders", "old", ["{}"])
    os.utime(old, (start - 7200, start - 7200))
    assert LandingLog(checkpoint, settings).new_files("orders") == []
    last = json.loads((checkpoint / "offsets" / str(2 * COMPACT_INTERVAL - 1)).read_text().splitlines()[2])
    assert last == {"logOffset": 2 * COMPACT_INTERVAL - 1}
