"""``lambdalake history TABLE``: a Delta table's versions, read from its log (no Spark)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from include.config import Settings
from include.lakehouse import all_tables


def table_history(settings: Settings, table: str, limit: int = 20) -> list[dict[str, Any]]:
    """The newest ``limit`` versions: when, which operation, rows the table held after it."""
    path = settings.lakehouse_dir / table
    if not DeltaTable.is_deltatable(str(path)):
        known = ", ".join(all_tables(settings.lakehouse_dir)) or "none yet"
        raise ValueError(f"no Delta table '{table}' in {settings.lakehouse_dir} (tables: {known})")
    rows = []
    for commit in DeltaTable(str(path)).history(limit):
        version = DeltaTable(str(path), version=commit["version"])
        records = pa.table(version.get_add_actions(flatten=True)).column("num_records")
        counted = records.null_count == 0  # files written without statistics leave it unknown
        rows.append({
            "version": commit["version"],
            "committed_at": datetime.fromtimestamp(commit["timestamp"] / 1000, timezone.utc),
            "operation": commit.get("operation", ""),
            "rows": (pc.sum(records).as_py() or 0) if counted else None,
            "files": len(records),
        })
    return rows
