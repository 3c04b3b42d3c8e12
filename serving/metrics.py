"""``GET /metrics`` of ``lambdalake serve``, in Prometheus' text format (``prometheus_client``).

Counted as they happen: HTTP requests and their durations by route and status, queries by
protocol and outcome, rows answered, queries refused by reason, results cut at the row cap.
Read from the lake at each scrape: each served table's Delta version and how long ago the
server last found its copy current, each view's speed freshness (the newest event time its
speed query counted, as ``lambdalake status`` shows it), the stream's state and heartbeat age,
and the late-event and DLQ totals by topic.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from include.config import Settings
from serving.engine import SOURCES, QueryCancelled, QueryRefused, QueryTimeout, Result, ServingEngine
from serving.limits import ServerBusy
from serving.status import view_status

log = logging.getLogger("lambdalake.serve")
# Serving queries take milliseconds to the time limit (30 s by default).
QUERY_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STREAM_STATES = ("never started", "starting", "running", "stopped", "dead")


class ServingMetrics:
    """The server's own registry (not the process-wide default, so that each app counts alone)."""

    def __init__(self, settings: Settings, engine: ServingEngine) -> None:
        self.registry = CollectorRegistry()
        self.requests = Histogram("lambdalake_http_request_duration_seconds", "HTTP requests by route and status",
                                  ["route", "status"], buckets=QUERY_BUCKETS, registry=self.registry)
        self.queries = Histogram("lambdalake_query_duration_seconds",
                                 "serving queries by protocol (http, pgwire) and outcome "
                                 "(ok, refused, timeout, cancelled, busy)",
                                 ["protocol", "outcome"], buckets=QUERY_BUCKETS, registry=self.registry)
        self.rows = Counter("lambdalake_rows_returned", "rows answered to serving queries", ["protocol"],
                            registry=self.registry)
        self.refused = Counter("lambdalake_queries_refused",
                               "queries refused, by reason: not_read_only, file_access, invalid (SQL DuckDB "
                               "rejected), timeout, cancelled, busy (no query slot), too_large (body), bad_request",
                               ["protocol", "reason"], registry=self.registry)
        self.truncated = Counter("lambdalake_results_truncated", "results cut at LAMBDALAKE_MAX_RESULT_ROWS",
                                 ["protocol"], registry=self.registry)
        self.registry.register(LakeCollector(settings, engine))

    def observe(self, protocol: str, run: Callable[[], Result]) -> Result:
        """Run a user query, counting its duration, outcome, rows and refusal reason."""
        started = time.perf_counter()
        try:
            result = run()
        except QueryRefused as exc:
            self._refused(protocol, "refused", exc.reason, started)
            raise
        except QueryTimeout:
            self._refused(protocol, "timeout", "timeout", started)
            raise
        except QueryCancelled:
            self._refused(protocol, "cancelled", "cancelled", started)
            raise
        except ServerBusy:
            self._refused(protocol, "busy", "busy", started)
            raise
        self.queries.labels(protocol, "ok").observe(time.perf_counter() - started)
        self.rows.labels(protocol).inc(result.row_count)
        if result.truncated:
            self.truncated.labels(protocol).inc()
        return result

    def _refused(self, protocol: str, outcome: str, reason: str, started: float) -> None:
        self.refused.labels(protocol, reason).inc()
        self.queries.labels(protocol, outcome).observe(time.perf_counter() - started)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class LakeCollector(Collector):
    """What the lake and the stream look like now, read at each scrape."""

    def __init__(self, settings: Settings, engine: ServingEngine) -> None:
        self.settings = settings
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        now = datetime.now(timezone.utc)
        version = GaugeMetricFamily("lambdalake_table_version", "Delta version served, per lakehouse table",
                                    labels=["table"])
        lag = GaugeMetricFamily("lambdalake_table_refresh_lag_seconds",
                                "seconds since the server last found its copy of the table current "
                                "(grows while refreshing fails)", labels=["table"])
        for relation, (table, _) in sorted(SOURCES.items()):
            served = self.engine.version(relation)
            if served is not None:
                version.add_metric([table], served)
                lag.add_metric([table], (now - self.engine.current_at).total_seconds())
        yield version
        yield lag

        rows = view_status(self.settings, self.engine)
        freshness = GaugeMetricFamily("lambdalake_view_speed_freshness_seconds",
                                      "age of the newest event a view's speed side has counted", labels=["view"])
        updated = GaugeMetricFamily("lambdalake_view_speed_refreshed_seconds",
                                    "seconds since a view's speed query last read new input", labels=["view"])
        for row in rows:
            if row["speed_max_event_time"] is not None:
                freshness.add_metric([row["view"]], (now - row["speed_max_event_time"]).total_seconds())
            if row["speed_refreshed_at"] is not None:
                updated.add_metric([row["view"]], (now - row["speed_refreshed_at"]).total_seconds())
        yield freshness
        yield updated
        stream = GaugeMetricFamily("lambdalake_stream_state", "the stream's state from its heartbeat (1: this one)",
                                   labels=["state"])
        state = rows[0]["stream_state"] if rows else "never started"
        for name in STREAM_STATES:
            stream.add_metric([name], 1.0 if name == state else 0.0)
        yield stream
        if rows and rows[0]["heartbeat_at"] is not None:
            yield GaugeMetricFamily("lambdalake_stream_heartbeat_age_seconds", "seconds since the stream's heartbeat",
                                    value=(now - rows[0]["heartbeat_at"]).total_seconds())

        for name, view, about in (("lambdalake_late_events", "late_events", "events behind their watermark"),
                                  ("lambdalake_dlq_events", "dlq", "landed lines that went to the DLQ")):
            family = CounterMetricFamily(name, f"{about}, per topic (totals in the lake)", labels=["topic"])
            for row in self.engine.rows(f"SELECT topic, count(*) AS n FROM {view} GROUP BY topic ORDER BY topic"):
                family.add_metric([row["topic"]], row["n"])
            yield family
        yield GaugeMetricFamily("lambdalake_metrics_scrape_seconds", "time this scrape spent reading the lake",
                                value=time.monotonic() - started)
