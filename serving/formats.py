"""The answers of ``POST /api/query``, each encoded and sent in slices of rows, so that no whole
document of a large result is built in memory:

- ``json`` (the default): a list of row objects, what ``lambdalake query --format json`` prints;
  with ``envelope=1``: ``{"columns": [{"name", "type"}], "rows": [[...]], "row_count", "truncated"}``,
  the column names and DuckDB types, rows as arrays in column order;
- ``csv``: a header line, then one line per row (timestamps as in JSON, NULL as an empty field);
- ``arrow``: an Arrow IPC stream, with ``lambdalake.truncated`` in the schema's metadata.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator

import pyarrow as pa

from include.output import json_rows, jsonable
from serving.engine import Result

MEDIA_TYPES = {
    "json": "application/json",
    "csv": "text/csv; charset=utf-8",
    "arrow": "application/vnd.apache.arrow.stream",
}
SLICE_ROWS = 2000  # rows encoded at a time: small enough to stay cheap, large enough to send few chunks


def encode(result: Result, fmt: str, envelope: bool = False) -> Iterator[bytes]:
    if fmt == "arrow":
        return _arrow(result)
    if fmt == "csv":
        return _csv(result)
    return _envelope(result) if envelope else _json_rows(result)


def _slices(result: Result) -> Iterator[tuple[int, int]]:
    for start in range(0, result.row_count, SLICE_ROWS):
        yield start, start + SLICE_ROWS


def _json_rows(result: Result) -> Iterator[bytes]:
    yield b"["
    separator = ""
    for start, end in _slices(result):
        rows = [dict(zip(result.columns, row)) for row in result.rows[start:end]]
        yield (separator + json_rows(rows)[1:-1]).encode()
        separator = ","
    yield b"]"


def _envelope(result: Result) -> Iterator[bytes]:
    columns = [{"name": name, "type": kind} for name, kind in zip(result.columns, result.types)]
    yield f'{{"columns":{json.dumps(columns, separators=(",", ":"))},"rows":['.encode()
    separator = ""
    for start, end in _slices(result):
        rows = [[jsonable(value) for value in row] for row in result.rows[start:end]]
        yield (separator + json.dumps(rows, default=str, separators=(",", ":"))[1:-1]).encode()
        separator = ","
    yield f'],"row_count":{result.row_count},"truncated":{json.dumps(result.truncated)}}}'.encode()


def _csv(result: Result) -> Iterator[bytes]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(result.columns)
    for start, end in [(0, 0), *_slices(result)]:
        writer.writerows([jsonable(value) for value in row] for row in result.rows[start:end])
        yield buffer.getvalue().encode()
        buffer.seek(0)
        buffer.truncate()


def _arrow(result: Result) -> Iterator[bytes]:
    table = result.rows  # asked for as Arrow
    schema = table.schema.with_metadata({"lambdalake.truncated": json.dumps(result.truncated)})
    sink = _Chunks()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in table.to_batches(max_chunksize=SLICE_ROWS):
            writer.write_batch(batch)
            yield sink.take()
    yield sink.take()


class _Chunks(io.RawIOBase):
    """A write-only file that hands over what was written since the last :meth:`take`."""

    def __init__(self) -> None:
        super().__init__()
        self._written = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self._written += data
        return len(data)

    def take(self) -> bytes:
        taken, self._written = bytes(self._written), bytearray()
        return taken
