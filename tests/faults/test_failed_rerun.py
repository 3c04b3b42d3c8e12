"""A rerun of a covered day killed part-way is never served; once a rerun completes, all of the
day's views switch to it together.

Every step is the ``lambdalake`` command a user or Airflow runs, in a process group of its own;
the kill is SIGKILL of that group (the batch's Python driver and its Spark JVM) once some batch
views' partitions of the day are replaced. Serving is the real engine over the real tables: one
engine opened before the rerun and refreshed all along, and fresh ones.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import date
from pathlib import Path

from deltalake import DeltaTable

from batch_layer.nightly import run_batch
from include.coverage import coverage_runs
from include.doctor import RERUN_UNFINISHED_AFTER_SECONDS, examine
from include.lakehouse import open_reader, open_store
from include.views import VIEWS
from serving.engine import ServingEngine, batch_relation

DAY = date(2026, 11, 20)
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
BATCH_TABLES = [view.batch_table for view in VIEWS]
# What a reader sees of the day's batch side: every view's batch rows, and the day's
# reconciliation, which compares the stream against exactly those rows.
SERVED = {view.name: f"SELECT * EXCLUDE (source) FROM {view.name} WHERE source = 'batch' ORDER BY ALL"
          for view in VIEWS} | {
    "reconciliation": f"SELECT view, metric, batch_value FROM reconciliation WHERE date = DATE '{DAY}' ORDER BY ALL",
}


def run(env: dict, *args: str) -> None:
    subprocess.run([LAMBDALAKE, *args], env=env, check=True, capture_output=True, text=True, timeout=900)


def status(env: dict) -> dict:
    """What `lambdalake status --format json` says of the batch runs (the same for every view)."""
    result = subprocess.run([LAMBDALAKE, "status", "--format", "json"], env=env, check=True, capture_output=True,
                            text=True, timeout=300)
    row = json.loads(result.stdout)[0]
    return {key: row[key] for key in ("batch_runs", "batch_reruns_unpublished")}


def served(engine: ServingEngine) -> dict[str, list[dict]]:
    return {name: engine.rows(sql) for name, sql in SERVED.items()}


def latest_versions(lakehouse: Path) -> dict[str, int]:
    return {table: DeltaTable(str(lakehouse / table)).version() for table in BATCH_TABLES}


def kill_once_some_views_are_replaced(env: dict, lakehouse: Path, before: dict[str, int]) -> list[str]:
    """Start ``lambdalake batch`` for the day; SIGKILL its process group as soon as a batch view
    has a commit after ``before``. Returns the views replaced when it died."""
    batch = subprocess.Popen([LAMBDALAKE, "batch", "--date", DAY.isoformat()], start_new_session=True,
                             env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = {table: lakehouse / table / "_delta_log" for table in BATCH_TABLES}
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and batch.poll() is None:
            if any((logs[table] / f"{before[table] + 1:020d}.json").exists() for table in BATCH_TABLES):
                os.killpg(batch.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
    finally:
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
        batch.wait()
    assert batch.returncode == -signal.SIGKILL, f"the batch ended by itself ({batch.returncode}) before the kill"
    return [table for table, version in latest_versions(lakehouse).items() if version > before[table]]


def test_a_killed_rerun_is_never_served_and_a_completed_one_is_served_whole(spark, streamed_lake, tmp_path):
    settings = streamed_lake.copy_to(tmp_path / "home")
    home = settings.home
    # The views commit seconds apart, so that the kill falls between them.
    env = {**os.environ, "LAMBDALAKE_HOME": str(home), "LAMBDALAKE_SPARK_MASTER": "local[2]",
           "LAMBDALAKE_SHUFFLE_PARTITIONS": "2"}

    # The first run: the streamed day, batched.
    run_batch(settings, DAY, open_store(settings, spark))
    engine = ServingEngine(settings)
    first = served(engine)
    assert all(first[name] for name in ("revenue_by_category_5m", "order_payments", "reconciliation"))
    first_run = coverage_runs(open_reader(settings))[0]["run_id"]

    # More of the day lands and is streamed (hour-long micro-batches: the point is the batch's
    # runs), so a rerun's views differ from the first run's.
    run(env, "generate", "--orders-per-hour", "60", "--start", "2026-11-20T03:00:00Z", "--hours", "2", "--seed", "2")
    run(env, "stream", "--available-now", "--views", settings.speed_views, "--max-files-per-trigger", "12")

    replaced = kill_once_some_views_are_replaced(env, settings.lakehouse_dir, latest_versions(settings.lakehouse_dir))
    assert replaced, "no view was replaced before the kill"
    print(f"killed with {len(replaced)} of {len(BATCH_TABLES)} views replaced")
    engine.refresh()
    assert served(engine) == first  # the engine that was open all along
    assert served(ServingEngine(settings)) == first  # and one opened now
    runs = coverage_runs(open_reader(settings))
    assert [(row["run_id"], row["rerun_started_at"] is not None) for row in runs] == [(first_run, True)]
    told = status(env)
    assert told["batch_runs"] == f"{DAY}: {first_run}" and told["batch_reruns_unpublished"].startswith(f"{DAY} (since")
    # Left so for hours, the doctor (and so the maintenance DAG) tells a person what to run.
    coverage = settings.lakehouse_dir / "ops" / "batch_coverage"
    assert not [finding for finding in examine(settings).findings if finding.path == coverage]
    later = time.time() + RERUN_UNFINISHED_AFTER_SECONDS + 60
    (unpublished,) = [finding for finding in examine(settings, now=later).findings if finding.path == coverage]
    assert unpublished.repair is None and unpublished.command == f"lambdalake batch --home {home} --date {DAY}"
    assert f"served from its previous run ({first_run})" in unpublished.line()

    # The rerun to completion, watched by the open engine: each look sees one run, never a mix.
    looks: list[int] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            engine.refresh()
            looks.append(hash(repr(served(engine))))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        run(env, "batch", "--date", DAY.isoformat())
    finally:
        done.set()
        watcher.join()
    engine.refresh()
    second = served(engine)
    assert second["revenue_by_category_5m"] != first["revenue_by_category_5m"]
    assert served(ServingEngine(settings)) == second
    old, new = hash(repr(first)), hash(repr(second))
    switched = looks.index(new) if new in looks else len(looks)
    assert looks and set(looks[:switched]) <= {old} and set(looks[switched:]) <= {new}, "a look saw a mix"

    # The new run is what is served: every published table at its latest version, the run's own.
    runs = coverage_runs(open_reader(settings))
    assert len(runs) == 1 and runs[0]["run_id"] != first_run and runs[0]["rerun_started_at"] is None
    assert status(env) == {"batch_runs": f"{DAY}: {runs[0]['run_id']}", "batch_reruns_unpublished": ""}
    fresh = ServingEngine(settings)
    assert {view.name: fresh.version(batch_relation(view)) for view in VIEWS} == {
        view.name: version for view, version in zip(VIEWS, latest_versions(settings.lakehouse_dir).values())}
