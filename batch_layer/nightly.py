"""The nightly batch for one event-time day: recompute, reconcile, check, mark covered.

``run_batch`` does it all in one process (``lambdalake batch``); the Airflow DAG runs the same
steps as separate tasks, using the other functions here.
"""

from __future__ import annotations

import logging
from datetime import date, datetime, timedelta, timezone
from typing import Any

from include.coverage import bronze_fingerprint, coverage_runs, covered_days, mark_covered, mark_rerun_started
from batch_layer.reconcile import reconcile_day
from batch_layer.recompute import recompute_day
from include import tables
from include.accounting import bronze_rows_accounted, ingest_totals, ingested_and_landed
from include.config import Settings
from include.progress import Progress
from include.lakehouse import LakehouseError, LakehouseStore, open_reader, open_store
from include.lineage import Lineage
from include.registry import input_topics
from include.schemas import TOPICS
from include.views import CONSISTENT_METRICS, VIEWS
from include.day_complete import complete_at, stream_watermark
from include.heartbeat import read_heartbeat

log = logging.getLogger(__name__)


class DataQualityError(RuntimeError):
    """A nightly data-quality check failed; the message lists every failure."""


def require_bronze(store: LakehouseStore, settings: Settings) -> None:
    if not any(store.exists(tables.bronze(topic)) for topic in input_topics(VIEWS)):
        raise LakehouseError(f"no Bronze data in {settings.lakehouse_dir}: run `lambdalake stream` first")


def run_batch(settings: Settings, day: date, store: LakehouseStore | None = None,
              show_progress: bool = False, run_id: str | None = None) -> list[dict]:
    """Rebuild ``day``'s batch views from Bronze, reconcile them with the speed views and mark
    the day batch-covered, publishing the run (``run_id``) as a whole: until then serving keeps a
    covered day at its previous run. Idempotent. Returns the reconciliation rows.
    ``show_progress``: each step on stderr as it starts."""
    steps = Progress(f"batch {day}", 4, "steps") if show_progress else None

    def starting(number: int, what: str) -> None:
        if steps:
            steps.update(number, what, force=True)

    store = store or open_store(settings)
    require_bronze(store, settings)
    starting(0, "recomputing the views from Bronze")
    fingerprint = bronze_fingerprint(store, settings, day)  # before reading: later arrivals make it stale
    mark_rerun_started(open_reader(settings), day)
    written = recompute_day(store, settings, day)
    log.info("batch %s: views rebuilt %s", day, written)
    starting(1, "reconciling with the speed views")
    reconciliation = reconcile_day(store, settings, day)
    starting(2, "checking data quality")
    check_data_quality(settings, day, store)
    starting(3, "marking the day batch-covered")
    mark_covered(open_reader(settings), day, fingerprint, run_id)
    log.info("batch %s: covered", day)
    if steps:
        steps.update(4, "done")
        steps.close()
    return reconciliation


def day_for_run(logical_date: datetime, conf: dict[str, Any] | None, announced: list[str] = ()) -> str:
    """The event-time day a run processes: ``conf["date"]`` if given, else the newest day the
    stream announced complete (a run triggered by its asset events), else the day before the
    run's logical date (the day that just ended)."""
    if conf and conf.get("date"):
        return date.fromisoformat(conf["date"]).isoformat()
    if announced:
        return max(date.fromisoformat(day) for day in announced).isoformat()
    return (logical_date.astimezone(timezone.utc).date() - timedelta(days=1)).isoformat()


def batch_needed(settings: Settings, day: str, conf: dict[str, Any] | None = None) -> bool:
    """False when ``day`` is covered and its Bronze input has not changed since (another run, a
    scheduled or an asset-triggered one, has done it) and no rerun of it was left unpublished; a
    run asked for a date in its conf always runs."""
    if conf and conf.get("date"):
        return True
    store = open_reader(settings)
    if any(row["date"].isoformat() == day and row["rerun_started_at"] for row in coverage_runs(store)):
        log.info("a rerun of day %s began and never published: running it again", day)
        return True
    built_from = covered_days(store).get(date.fromisoformat(day))
    if built_from is not None and bronze_fingerprint(store, settings, date.fromisoformat(day)) == built_from:
        log.info("day %s is covered and its Bronze input is unchanged: nothing to do", day)
        return False
    return True


def day_is_complete(settings: Settings, day: str, now: datetime | None = None) -> bool:
    """True once no more on-time events for ``day`` can come: the stream's watermark (every topic a
    view reads) has passed the day's end plus the allowed lateness (watermark delay and join
    window), or the wall clock has and the stream has consumed everything landed so far."""
    now = now or datetime.now(timezone.utc)
    ready_at = complete_at(settings, date.fromisoformat(day))
    watermark = stream_watermark(open_reader(settings), settings)
    if watermark is not None and watermark >= ready_at:
        log.info("day %s complete: watermark %s passed %s", day, watermark, ready_at)
        return True
    if now >= ready_at and stream_caught_up(settings):
        log.info("day %s complete: %s has passed and the stream has consumed everything landed", day, ready_at)
        return True
    log.info("day %s not complete yet (needs watermark or clock past %s)", day, ready_at)
    return False


def stream_caught_up(settings: Settings) -> bool:
    """The stream has processed every landed file: its last ingest progress came after the newest
    landing file and read nothing new (or it stopped after consuming everything)."""
    beat = read_heartbeat(settings.run_dir)
    if beat is None:
        return False
    ingest = beat.get("queries", {}).get("speed_ingest", {})
    progress_at = ingest.get("last_progress_at")
    if progress_at is None:
        return False
    files = [path.stat().st_mtime for path in settings.landing_dir.glob("*/*.jsonl")]
    newest = datetime.fromtimestamp(max(files), timezone.utc) if files else None
    idle = ingest.get("input_rows") == 0 or beat.get("state") == "stopped"
    return idle and (newest is None or newest <= datetime.fromisoformat(progress_at))


def data_quality_lineage(day: date) -> Lineage:
    """What :func:`check_data_quality` reads."""
    return Lineage(reads={tables.INGEST_BATCHES: [], tables.DLQ: [],
                          **{name: [] for topic in TOPICS for name in (tables.bronze(topic), tables.silver(topic))},
                          tables.RECONCILIATION: [{"date": day.isoformat()}]})


def check_data_quality(settings: Settings, day: date, store: LakehouseStore | None = None) -> list[str]:
    """Fail loudly unless the day's numbers add up. Returns the checks that passed."""
    store = store or open_reader(settings)
    passed, failures = [], []

    def check(ok: bool, name: str, detail: str = "") -> None:
        (passed if ok else failures).append(name if ok else f"{name} fails{': ' + detail if detail else ''}")

    for row in ingest_totals(store):
        topic, bronze = row["topic"], row["bronze"]
        in_bronze = bronze_rows_accounted(store, topic)
        check(in_bronze == bronze, f"{topic}: every landed line is in Bronze",
              f"{in_bronze} in Bronze, {bronze} ingested")
        # The rest of Bronze are duplicates, removed by event id; a line in neither would be lost.
        ingested, landed = ingested_and_landed(store, topic)
        check(ingested <= landed, f"{topic}: Silver + DLQ <= Bronze",
              f"{ingested} > {landed} in the landed files both queries have taken")
    where = f"date = CAST('{day.isoformat()}' AS DATE)"
    metrics = {
        (r["view"], r["metric"]): r
        for r in store.select_arrow(
            tables.RECONCILIATION, ["view", "metric", "speed_value", "batch_value"], where
        ).to_pylist()
    }
    check(bool(metrics), f"reconciliation rows exist for {day}")
    if metrics:
        for (view, metric), (other_view, other_metric) in CONSISTENT_METRICS:
            ours, theirs = metrics[(view, metric)]["batch_value"], metrics[(other_view, other_metric)]["batch_value"]
            check(ours == theirs, f"{view}.{metric} = {other_view}.{other_metric}", f"{ours} vs {theirs}")
        limit = settings.max_reconciliation_drift
        for view in VIEWS:
            # A backfill: the stream never saw the day.
            if metrics.get((view.name, "rows"), {}).get("speed_value", 0) == 0:
                continue
            for metric in view.drift_metrics:
                row = metrics.get((view.name, metric))
                if row and row["batch_value"]:
                    drift = abs(row["batch_value"] - row["speed_value"]) / row["batch_value"]
                    check(drift <= limit, f"{view.name}.{metric}: speed within {limit:.0%} of batch",
                          f"drift {drift:.1%}")
    if failures:
        raise DataQualityError(f"data quality failed for {day}: " + "; ".join(failures))
    return passed
