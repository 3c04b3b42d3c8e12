"""Printing rows for people and programs: an aligned table, JSON (a list of row objects,
timestamps as ISO-8601 UTC, dates as YYYY-MM-DD) or CSV."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date, datetime, timedelta, timezone
from typing import Any

FORMATS = ("table", "json", "csv")


def jsonable(value: Any) -> Any:
    """A value as JSON shows it: timestamps ISO-8601 in UTC, dates YYYY-MM-DD, durations in seconds."""
    if isinstance(value, datetime):
        utc = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return utc.isoformat().replace("+00:00", "Z")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value


def json_rows(rows: Sequence[dict[str, Any]], indent: int | None = None) -> str:
    """Rows as a JSON list of objects; compact unless ``indent`` (the C encoder only runs without)."""
    rows = [{key: jsonable(value) for key, value in row.items()} for row in rows]
    return json.dumps(rows, indent=indent, default=str, separators=(",", ": ") if indent else (",", ":"))


def format_rows(rows: Sequence[dict[str, Any]], fmt: str) -> str:
    """Rows as an aligned table, a JSON list of objects, or CSV."""
    if fmt == "json":
        return json_rows(rows, indent=1)
    rows = [{key: jsonable(value) for key, value in row.items()} for row in rows]
    columns = list(rows[0]) if rows else []
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return buffer.getvalue().rstrip("\n")
    if not rows:
        return "(no rows)"
    cells = [[("" if row[col] is None else str(row[col])) for col in columns] for row in rows]
    widths = [max(len(col), *(len(cell[i]) for cell in cells)) for i, col in enumerate(columns)]
    line = "  ".join(col.ljust(width) for col, width in zip(columns, widths))
    rule = "  ".join("-" * width for width in widths)
    body = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) for row in cells]
    return "\n".join([line, rule, *body])
