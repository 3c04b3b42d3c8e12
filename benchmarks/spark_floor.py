"""Spark's own floor for the speed layer on this machine: the landed files read as text and
written as Parquet by one Structured Streaming query (no parsing, no dedup, no Delta, no views),
with the platform's SparkSession settings. Any speed layer built on Structured Streaming does at
least this much work, so its throughput bounds what the speed layer can reach here.

    .venv/bin/python benchmarks/spark_floor.py LANDING OUT FILES_PER_TRIGGER

Prints JSON: ``processing`` (seconds from the first micro-batch's start to the last one's end) and
``micro_batches``.
``speed_layer_throughput.py`` runs it in a fresh process and times the process too.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(landing: Path, out: Path, files_per_trigger: int) -> None:
    from include.config import load_settings
    from include.spark import get_spark

    spark = get_spark(load_settings(home=out / "home"), app_name="spark-floor")
    lines = (spark.readStream.format("text").option("maxFilesPerTrigger", files_per_trigger)
             .option("pathGlobFilter", "*.jsonl").option("recursiveFileLookup", "true").load(str(landing)))
    query = (lines.writeStream.format("parquet").option("path", str(out / "parquet"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    progress = query.recentProgress
    starts = [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in progress]
    ends = [start + p["batchDuration"] / 1000 for start, p in zip(starts, progress)]
    print(json.dumps({"processing": max(ends) - min(starts), "micro_batches": len(progress)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
