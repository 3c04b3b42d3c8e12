"""Stream metrics and heartbeat.

A StreamingQueryListener turns every query progress into a ``stream_metrics`` row (input rows,
rates, where the batch time went, watermark, state rows, rows dropped by watermark, output
rows). Rows are buffered and committed by :meth:`StreamMetrics.flush`, which the runner
calls every few seconds along with writing the heartbeat file the supervisor reads.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark import SparkContext
from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import QueryIdleEvent, QueryProgressEvent, QueryStartedEvent, QueryTerminatedEvent

from include import tables
from include.heartbeat import HEARTBEAT_FILE
from include.lakehouse import LakehouseStore

log = logging.getLogger(__name__)


def _instant(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


class _EventsAsJson:
    """The JVM's side of :class:`StreamMetrics`: each event crosses to Python as one JSON string.

    PySpark's own bridge reads an event field by field, one Py4J round trip each (a progress with
    its state operators' metrics takes well over a hundred, and every Java map it copies ends in a
    JVM exception that Py4J resolves through class look-ups), a cost paid for every progress of
    every query."""

    def __init__(self, listener: StreamingQueryListener) -> None:
        self.listener = listener

    def onQueryStarted(self, jevent: Any) -> None:  # noqa: N802 - Spark's interface
        self.listener.onQueryStarted(QueryStartedEvent.fromJson(json.loads(jevent.json())))

    def onQueryProgress(self, jevent: Any) -> None:  # noqa: N802
        self.listener.onQueryProgress(QueryProgressEvent.fromJson(json.loads(jevent.json())))

    def onQueryIdle(self, jevent: Any) -> None:  # noqa: N802
        self.listener.onQueryIdle(QueryIdleEvent.fromJson(json.loads(jevent.json())))

    def onQueryTerminated(self, jevent: Any) -> None:  # noqa: N802
        self.listener.onQueryTerminated(QueryTerminatedEvent.fromJson(json.loads(jevent.json())))

    class Java:
        implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]


class StreamMetrics(StreamingQueryListener):
    def __init__(self, store: LakehouseStore, run_dir: Path) -> None:
        self.store = store
        self.heartbeat_path = run_dir / HEARTBEAT_FILE
        self.started_at = datetime.now(timezone.utc)
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self.queries: dict[str, dict[str, Any]] = {}
        self._names: dict[str, str] = {}
        self._input_rows: dict[str, int] = {}  # per query, since this runner started
        # Each speed view's micro-batch interval in seconds (continuous runs), for ``status``.
        self.view_refresh_seconds: dict[str, float] = {}
        store.ensure_table(tables.STREAM_METRICS, tables.STREAM_METRICS_SCHEMA, (), tables.STREAM_TABLE_PROPERTIES)

    @property
    def _jlistener(self) -> Any:
        """What ``spark.streams.addListener`` registers in the JVM: events as JSON (see
        :class:`_EventsAsJson`) instead of PySpark's field-by-field bridge."""
        if not hasattr(self, "_jlistenerobj"):
            wrapper = SparkContext._jvm.org.apache.spark.sql.streaming.PythonStreamingQueryListenerWrapper
            self._jlistenerobj = wrapper(_EventsAsJson(self))
        return self._jlistenerobj

    # ---- listener callbacks (Spark's listener thread) --------------------------------------
    def onQueryStarted(self, event: Any) -> None:
        self.started(event.name, str(event.id))

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        operators = progress.stateOperators or []
        behind = [int(source.metrics["maxOffsetsBehindLatest"]) for source in progress.sources or []
                  if "maxOffsetsBehindLatest" in (source.metrics or {})]
        self.progressed(
            {
                "query": progress.name,
                "run_id": str(progress.runId),
                "batch_id": progress.batchId,
                "timestamp": _instant(progress.timestamp),
                "input_rows": progress.numInputRows,
                "input_rows_per_second": float(progress.inputRowsPerSecond or 0.0),
                "processed_rows_per_second": float(progress.processedRowsPerSecond or 0.0),
                "batch_duration_ms": progress.batchDuration,
                "duration_ms": json.dumps(progress.durationMs),
                "watermark": _instant((progress.eventTime or {}).get("watermark")),
                "state_rows": sum(op.numRowsTotal for op in operators),
                "rows_dropped_by_watermark": sum(op.numRowsDroppedByWatermark for op in operators),
                "output_rows": progress.sink.numOutputRows if progress.sink else None,
                # The newest event time the micro-batch read (a query with a watermark says).
                "max_event_time": _instant((progress.eventTime or {}).get("max")),
            },
            # Kafka sources: the records waiting in each topic's furthest-behind partition.
            records_behind=sum(behind) if behind else None,
        )

    def onQueryIdle(self, event: Any) -> None:
        with self._lock:
            name = self._names.get(str(event.id), str(event.id))
            self.queries.setdefault(name, {})["last_idle_at"] = datetime.now(timezone.utc).isoformat()

    def onQueryTerminated(self, event: Any) -> None:
        self.terminated(str(event.id), event.exception)

    # ---- what a query reports, through the callbacks above ----
    def started(self, name: str, query_id: str) -> None:
        with self._lock:
            self._names[query_id] = name
            self.queries[name] = {"status": "running", "started_at": datetime.now(timezone.utc).isoformat()}

    def progressed(self, row: dict[str, Any], records_behind: int | None = None) -> None:
        """A micro-batch done: ``row`` is its ``stream_metrics`` row."""
        now = datetime.now(timezone.utc)
        name, batch_id, input_rows = row["query"], row["batch_id"], row["input_rows"]
        with self._lock:
            self._rows.append(row)
            entry = self.queries.setdefault(name, {"status": "running"})
            entry.update(batch_id=batch_id, last_progress_at=now.isoformat(), input_rows=input_rows)
            self._input_rows[name] = self._input_rows.get(name, 0) + input_rows
            if input_rows:
                entry["last_input_at"] = now.isoformat()
            if records_behind is not None:
                entry["records_behind"] = records_behind

    def terminated(self, query_id: str, exception: str | None) -> None:
        with self._lock:
            entry = self.queries.setdefault(self._names.get(query_id, query_id), {})
            entry.update(status="failed" if exception else "stopped", exception=exception)

    # ---- runner side ----------------------------------------------------------------------
    def input_rows(self, query: str) -> int:
        """Rows the query has read since this runner started."""
        with self._lock:
            return self._input_rows.get(query, 0)

    def flush(self) -> int:
        """Commit buffered metric rows; returns how many."""
        with self._lock:
            rows, self._rows = self._rows, []
        if rows:
            table = pa.Table.from_pylist(rows, schema=tables.arrow_schema(tables.STREAM_METRICS_FIELDS))
            self.store.append(tables.STREAM_METRICS, table)
        return len(rows)

    def write_heartbeat(self, state: str) -> None:
        """Atomically replace the heartbeat file: pid, state, and per-query progress times."""
        with self._lock:
            body = {
                "pid": os.getpid(),
                "state": state,
                "started_at": self.started_at.isoformat(),
                "heartbeat_at": datetime.now(timezone.utc).isoformat(),
                "queries": dict(self.queries),
                "view_refresh_seconds": dict(self.view_refresh_seconds),
            }
        self.heartbeat_path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.heartbeat_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(body, indent=1, default=str), encoding="utf-8")
        os.replace(temporary, self.heartbeat_path)

