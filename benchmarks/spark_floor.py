"""Spark's own floor for the speed layer on this machine: the landed files read as text and
written as Parquet by one Structured Streaming query (no parsing, no dedup, no Delta, no views),
with the platform's SparkSession settings. Any speed layer built on Structured Streaming does at
least this much work, so its throughput bounds what the speed layer can reach here.

    .venv/bin/python benchmarks/spark_floor.py LANDING OUT FILES_PER_TRIGGER
    .venv/bin/python benchmarks/spark_floor.py --continuous SECONDS LANDING OUT FILES_PER_TRIGGER

Once through the files landed (``availableNow``), it prints JSON: ``processing`` (seconds from the
first micro-batch's start to the last one's end) and ``micro_batches``;
``speed_layer_throughput.py`` runs it in a fresh process and times the process too.
``--continuous SECONDS``: a processing-time trigger of SECONDS, running until SIGTERM, so that
``freshness.py --designs floor`` can time a landed file to its Parquet output being committed
(:func:`committed_files`).
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def committed_files(out: Path) -> set[str]:
    """The landed files (paths) whose rows a reader of ``out``'s Parquet sees: those of the
    micro-batches the sink has committed (its ``_spark_metadata`` log), as the source's log lists them."""
    def batches(log: Path) -> list[tuple[int, Path]]:
        return [(int(entry.name.split(".")[0]), entry) for entry in log.glob("*") if entry.name.split(".")[0].isdigit()]

    committed = max((number for number, _ in batches(out / "parquet" / "_spark_metadata")), default=-1)
    files = set()
    for number, entry in batches(out / "checkpoint" / "sources" / "0"):
        if number <= committed:
            try:
                lines = entry.read_text().splitlines()[1:]  # after the version line
            except FileNotFoundError:  # compacted away meanwhile: the compact file has its entries
                continue
            files.update(json.loads(line)["path"].removeprefix("file:") for line in lines
                         if json.loads(line)["batchId"] <= committed)
    return files


def main(landing: Path, out: Path, files_per_trigger: int, continuous: float | None = None) -> None:
    from include.config import load_settings
    from include.spark import get_spark

    spark = get_spark(load_settings(home=out / "home"), app_name="spark-floor")
    limit = {"maxFilesPerTrigger": files_per_trigger} if files_per_trigger else {}  # 0: all new files, as the stream
    lines = (spark.readStream.format("text").options(**limit)
             .option("pathGlobFilter", "*.jsonl").option("recursiveFileLookup", "true").load(str(landing)))
    trigger = {"processingTime": f"{continuous} seconds"} if continuous else {"availableNow": True}
    query = (lines.writeStream.format("parquet").option("path", str(out / "parquet"))
             .option("checkpointLocation", str(out / "checkpoint")).trigger(**trigger).start())
    if continuous:  # until SIGTERM; the query is stopped here, not inside the handler (a py4j call)
        stopping = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        print("running", flush=True)
        while not stopping.wait(0.5) and query.isActive:
            pass
        query.stop()
        return
    query.awaitTermination()
    progress = query.recentProgress
    starts = [datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() for p in progress]
    ends = [start + p["batchDuration"] / 1000 for start, p in zip(starts, progress)]
    print(json.dumps({"processing": max(ends) - min(starts), "micro_batches": len(progress)}))


if __name__ == "__main__":
    if sys.argv[1] == "--continuous":
        main(Path(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), continuous=float(sys.argv[2]))
    else:
        main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
