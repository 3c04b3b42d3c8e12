"""The stream's listener, fed Spark's own (JVM) listener events."""

from __future__ import annotations

import json
from datetime import datetime

from pyspark.sql import functions as F

from include import tables
from include.lakehouse import open_store
from speed_layer.metrics import StreamMetrics, _EventsAsJson


def test_each_kind_of_jvm_event_reaches_the_metrics(spark, settings, tmp_path):
    jvm = spark._jvm
    events = jvm.org.apache.spark.sql.streaming.StreamingQueryListener
    metrics = StreamMetrics(open_store(settings, spark), settings.run_dir)
    assert metrics._jlistener is metrics._jlistener  # one JVM wrapper, so removeListener finds it
    bridge = _EventsAsJson(metrics)

    # A real progress from Spark: one micro-batch of a query with streaming state.
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"key": "a", "t": "2026-11-25T09:00:00Z"}\n'
                                            '{"key": "a", "t": "2026-11-25T09:59:58.5Z"}\n'
                                            '{"key": "b", "t": "2026-11-25T09:30:00Z"}\n')
    # A watermarked stream, as ingest's dedup is: its progress has the newest event time.
    read = spark.readStream.schema("key string, t timestamp").json(str(tmp_path / "in")).withWatermark("t", "1 hour")
    counts = read.groupBy("key").agg(F.count("*"))
    query = (counts.writeStream.format("memory").queryName("metrics_probe").outputMode("complete")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    progress = query._jsq.lastProgress()

    query_id, run_id = progress.id(), progress.runId()
    bridge.onQueryStarted(events.QueryStartedEvent(query_id, run_id, "metrics_probe", "2026-11-25T10:00:00.000Z"))
    bridge.onQueryProgress(events.QueryProgressEvent(progress))
    bridge.onQueryIdle(events.QueryIdleEvent(query_id, run_id, "2026-11-25T10:00:01.000Z"))
    assert metrics.queries["metrics_probe"]["status"] == "running"
    assert "last_idle_at" in metrics.queries["metrics_probe"]
    bridge.onQueryTerminated(events.QueryTerminatedEvent(query_id, run_id, jvm.scala.Option.apply("disk full")))
    entry = metrics.queries["metrics_probe"]
    assert (entry["status"], entry["exception"], entry["batch_id"], entry["input_rows"]) == (
        "failed", "disk full", 0, 3)
    assert {"started_at", "last_progress_at", "last_input_at", "last_idle_at"} <= set(entry)

    assert metrics.flush() == 1
    row = metrics.store.read(tables.STREAM_METRICS).collect()[0]
    assert (row["query"], row["batch_id"], row["input_rows"], row["state_rows"], row["output_rows"]) == (
        "metrics_probe", 0, 3, 2, 2)
    assert row["max_event_time"] == datetime(2026, 11, 25, 9, 59, 58, 500000)
    assert json.loads(row["duration_ms"])["triggerExecution"] > 0 and row["timestamp"] is not None
    spark.sql("DROP VIEW IF EXISTS metrics_probe")
