"""The speed layer's accounting, read back: what every landed line became, per topic. Shared by
``lambdalake stream``, the demo and the nightly data-quality checks."""

from __future__ import annotations

import pyarrow.compute as pc

from include import tables
from include.lakehouse import LakehouseStore


def ingest_totals(store: LakehouseStore) -> list[dict]:
    """Per topic, everything the speed layer has accounted for so far; duplicates are the Bronze
    lines in neither Silver nor the DLQ (exact once both queries have caught up)."""
    columns = ["bronze_rows", "silver_rows", "dlq_rows", "late_rows"]
    if not store.exists(tables.INGEST_BATCHES):  # the stream has not run on this home
        return []
    rows = store.select_arrow(tables.INGEST_BATCHES, ["topic", *columns])
    if rows.num_rows == 0:
        return []
    totals = rows.group_by("topic").aggregate([(column, "sum") for column in columns])
    totals = totals.take(pc.sort_indices(totals, [("topic", "ascending")]))
    result = []
    for row in totals.to_pylist():
        counts = {key.removesuffix("_rows_sum"): value or 0 for key, value in row.items() if key != "topic"}
        counts["duplicate"] = counts["bronze"] - counts["silver"] - counts["dlq"]
        result.append({"topic": row["topic"],
                       **{k: counts[k] for k in ("bronze", "silver", "dlq", "duplicate", "late")}})
    return result
