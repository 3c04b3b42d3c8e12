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


def bronze_rows_accounted(store: LakehouseStore, topic: str) -> int:
    """The topic's Bronze rows of the micro-batches whose accounting row is written: a stream
    killed mid-batch may have committed its Bronze rows and not yet that row, which its replay
    writes (skipping the Bronze it holds)."""
    accounted = store.select_arrow(tables.INGEST_BATCHES, ["batch_id"],
                                   f"topic = '{topic}' AND bronze_rows IS NOT NULL")
    if not store.exists(tables.bronze(topic)) or accounted.num_rows == 0:
        return 0
    batches = store.select_arrow(tables.bronze(topic), ["batch_id"])["batch_id"]
    return pc.sum(pc.is_in(batches, pc.unique(accounted["batch_id"]))).as_py() or 0


def ingested_and_landed(store: LakehouseStore, topic: str) -> tuple[int, int]:
    """Silver + DLQ rows and Bronze rows of the topic's landed files both queries have accounted.

    Bronze and ingest are separate queries, each reading the landing zone on its own trigger, so
    their totals differ while one is a micro-batch behind the other. A file is read whole in one
    micro-batch, so the files both have taken compare like with like."""
    def by_source(name: str, accounted: str, where: str = "") -> dict[str, int]:
        batches = store.select_arrow(tables.INGEST_BATCHES, ["batch_id"],
                                     f"topic = '{topic}' AND {accounted} IS NOT NULL")
        if not store.exists(name) or batches.num_rows == 0:
            return {}
        rows = store.select_arrow(name, ["source", "batch_id"], where or None)
        rows = rows.filter(pc.is_in(rows["batch_id"], pc.unique(batches["batch_id"])))
        counted = rows.group_by("source").aggregate([("source", "count")]).to_pylist()
        return {row["source"]: row["source_count"] for row in counted}

    bronze = by_source(tables.bronze(topic), "bronze_rows")
    silver = by_source(tables.silver(topic), "silver_rows")
    dlq = by_source(tables.DLQ, "dlq_rows", f"topic = '{topic}'")
    both = set(bronze) & (set(silver) | set(dlq))
    return sum(silver.get(s, 0) + dlq.get(s, 0) for s in both), sum(bronze[s] for s in both)
