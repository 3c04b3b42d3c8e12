"""kill -9 under concurrency: the stream's process group killed again and again (past a committed
micro-batch, inside a planned one, in its start-up, in turn, after seeded random delays) while
``lambdalake batch`` (an earlier day) and ``lambdalake maintain`` (compaction with z-order,
vacuum) work on the same lake, some of them killed too; then everything restarted.

Shared by ``tests/faults/test_kill_under_concurrency.py`` (a few kills, in CI) and
``benchmarks/faults.py`` (20 kills, the report). Every process is the ``lambdalake`` command a
user runs, in a process group of its own, as Airflow or a shell would start it.

The traffic: twelve hours from 20:00 of day one, generated into a staging home. Everything that
arrives by 04:00 of day two (every line of day one, its late ones included, and the clicks of
sessions running past midnight) is streamed and batched before the first kill, so day one's
batch input is final: each later batch of day one must give the same rows. The rest lands in
steps, one before each restart of the stream.
"""

from __future__ import annotations

import csv
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from pathlib import Path

from deltalake import DeltaTable

from include import tables
from include.config import Settings, load_settings
from include.generator import GenerationResult, TrafficOptions, generate
from batch_layer.maintenance import checkpoint_hygiene
from include.lakehouse import all_tables, open_store
from include.views import VIEWS
from include.doctor import examine
from include.lakehouse.base import LakehouseStore

from exactly_once import assert_every_line_once, assert_speed_views_once

DAY_ONE, DAY_TWO = date(2026, 11, 20), date(2026, 11, 21)
START = datetime(2026, 11, 20, 20, tzinfo=timezone.utc)
HOURS = 12
SETTLED = datetime(2026, 11, 21, 4, tzinfo=timezone.utc)  # day one's batch input has all arrived
SESSION_GAP = timedelta(minutes=30)
OPTIONS = TrafficOptions(orders_per_hour=120, devices=6, customers=1000, late_fraction=0.03,
                         duplicate_fraction=0.02, corrupt_fraction=0.01)
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
# Where the stream's kills land, in turn: once it has committed a micro-batch more; while a query
# has planned a micro-batch (its offsets written) and not committed it; somewhere in its start-up.
KILL_POINTS = ("micro-batches", "planned", "start-up")
PLANNED_QUERY = "speed_revenue_by_segment_1h"


@dataclass
class Chaos:
    home: Path
    kills: int
    seed: int
    log: list[str] = field(default_factory=list)
    side_runs: list[dict] = field(default_factory=list)
    unreferenced_before_vacuum: int = 0
    vacuumed: int = 0
    feeds_removed: int = 0

    def __post_init__(self) -> None:
        self.settings: Settings = load_settings(home=self.home)
        self.staging = load_settings(home=self.home.parent / f"{self.home.name}-staging")
        self.env = {**os.environ, "LAMBDALAKE_HOME": str(self.home), "LAMBDALAKE_SPARK_MASTER": "local[2]",
                    "LAMBDALAKE_SHUFFLE_PARTITIONS": "2"}
        self.rng = random.Random(self.seed)

    # ---- the lake before the first kill ----------------------------------------------------
    def prepare(self) -> GenerationResult:
        generated = generate(self.staging, START, HOURS, OPTIONS, seed=self.seed, progress=False)
        with (generated.truth_dir / "user_sessions.csv").open() as handle:
            ends = [row["session_end"] for row in csv.DictReader(handle) if row["session_start"] < str(DAY_TWO)]
        if max(ends) >= (SETTLED - SESSION_GAP).strftime("%Y-%m-%dT%H:%M"):
            raise ValueError(f"seed {self.seed}: a session of day one runs to {max(ends)}, too close to "
                             f"{SETTLED:%H:%M} for day one's input to be final; choose another seed")
        self.land(until=SETTLED)
        self.run("stream", "--available-now", "--max-files-per-trigger", "100")
        self.run("batch", "--date", str(DAY_ONE))
        return generated

    def staged(self) -> list[tuple[datetime, Path]]:
        """Staged landing files by arrival window (the name's leading time)."""
        files = self.staging.landing_dir.glob("*/*.jsonl")
        return sorted((datetime.strptime(p.name[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc), p)
                      for p in files)

    def land(self, until: datetime | None = None, slots: int | None = None) -> int:
        """Move staged files into the landing zone, atomically: those before ``until``, or the
        next ``slots`` arrival windows. Returns how many files moved."""
        staged = self.staged()
        if slots is not None:
            windows = sorted({moment for moment, _ in staged})[:slots]
            until = windows[-1] + timedelta(seconds=1) if windows else None
        moved = 0
        for moment, path in staged:
            if until is None or moment < until:
                target = self.settings.landing_dir / path.parent.name / path.name
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
                moved += 1
        return moved

    # ---- processes ----------------------------------------------------------------------------
    def start(self, *args: str) -> subprocess.Popen:
        logs = self.settings.run_dir
        logs.mkdir(parents=True, exist_ok=True)
        output = (logs / f"chaos-{args[0]}.log").open("ab")
        return subprocess.Popen([LAMBDALAKE, *args], env=self.env, stdout=output, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def run(self, *args: str, timeout: float = 900) -> None:
        process = self.start(*args)
        if process.wait(timeout=timeout) != 0:
            raise AssertionError(f"`lambdalake {' '.join(args)}` exited {process.returncode}; "
                                 f"see {self.settings.run_dir / f'chaos-{args[0]}.log'}")

    @staticmethod
    def kill(process: subprocess.Popen) -> None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def ingest_version(self) -> int:
        path = self.settings.lakehouse_dir / tables.INGEST_BATCHES
        return DeltaTable(str(path)).version() if DeltaTable.is_deltatable(str(path)) else -1

    # ---- the kills ----------------------------------------------------------------------------------
    def stream_kills(self) -> None:
        """``kills`` times: land the next arrival windows, start the stream, kill its process group
        at the next of :data:`KILL_POINTS` (after a random delay there)."""
        windows = len({moment for moment, _ in self.staged()})
        per_round = max(1, windows // (self.kills + 1))
        for number in range(1, self.kills + 1):
            self.land(slots=per_round)
            before, planned = self.ingest_version(), self.newest_batch("offsets")
            where = KILL_POINTS[(number - 1) % len(KILL_POINTS)]
            stream = self.start("stream")
            started = time.monotonic()
            if where == "start-up":
                time.sleep(self.rng.uniform(2, 40))
            else:
                reached = ((lambda: self.ingest_version() > before) if where == "micro-batches"
                           else lambda: self.newest_batch("offsets") > max(planned, self.newest_batch("commits")))
                while not reached() and stream.poll() is None and time.monotonic() - started < 600:
                    time.sleep(0.05)
                if stream.poll() is not None or not reached():
                    raise AssertionError(f"kill {number}: the stream (exit {stream.poll()}) never reached {where}")
                if where == "micro-batches":
                    time.sleep(self.rng.uniform(0, 8))
            self.kill(stream)
            self.log.append(f"kill {number}: stream killed after {time.monotonic() - started:.1f} s ({where}), "
                            f"ingest version {before} -> {self.ingest_version()}")

    def newest_batch(self, log: str) -> int:
        """The newest micro-batch in :data:`PLANNED_QUERY`'s checkpoint ``log`` (offsets: planned,
        commits: done). One planned by this start and not committed must be replayed as planned by
        the restart, whose limits may differ."""
        folder = self.settings.checkpoints_dir / PLANNED_QUERY / log
        return max((int(p.name) for p in folder.glob("*") if p.name.isdigit()), default=-1)

    def side_jobs(self, stop: threading.Event) -> None:
        """Until ``stop``: maintenance and day one's batch in turn, every other run of each killed
        at a random moment (maintenance first: it takes seconds, so both run however soon the
        kills are done)."""
        rng = random.Random(self.seed + 1)
        jobs = [("maintain",), ("batch", "--date", str(DAY_ONE))]
        turn = 0
        while not stop.is_set():
            args = jobs[turn % 2]
            turn += 1
            process = self.start(*args)
            started = time.monotonic()
            longest = 40 if args[0] == "batch" else 3  # maintenance takes seconds here
            kill_after = rng.uniform(0.5, longest) if turn % 4 in (2, 3) else None
            while process.poll() is None and (kill_after is None or time.monotonic() - started < kill_after):
                time.sleep(0.2)
            killed = process.poll() is None
            if killed:
                self.kill(process)
            self.side_runs.append({"command": args[0], "seconds": round(time.monotonic() - started, 1),
                                   "outcome": "killed" if killed else f"exit {process.returncode}"})

    def run_all(self) -> None:
        """The kills with the side jobs beside them; vacuum without retention and the feeds' hygiene
        while the stream lies killed with batches planned and not committed; then the stream and
        both days' batches to the end, unkilled (a whole maintenance ran beside the stream)."""
        stop = threading.Event()
        side = threading.Thread(target=self.side_jobs, args=(stop,), name="side-jobs")
        side.start()
        try:
            self.stream_kills()
            deadline = time.monotonic() + 300  # each side job has run at least once (a fast stream's kills end first)
            while {run["command"] for run in self.side_runs} != {"batch", "maintain"} and time.monotonic() < deadline:
                time.sleep(0.5)
        finally:
            stop.set()
            side.join()
        store = open_store(self.settings)
        self.unreferenced_before_vacuum = unreferenced_parquet(self.settings)
        self.vacuumed = sum(store.vacuum(name, retention_hours=0) for name in all_tables(self.settings.lakehouse_dir))
        self.feeds_removed = checkpoint_hygiene(self.settings)["feed_files"]
        self.log.append(f"vacuum without retention: {self.vacuumed} of {self.unreferenced_before_vacuum} "
                        f"unreferenced data files removed; {self.feeds_removed} consumed feed files removed")
        self.land()
        self.run("stream", "--available-now", "--max-files-per-trigger", "100")
        self.run("batch", "--date", str(DAY_ONE))
        self.run("batch", "--date", str(DAY_TWO))

    def verify(self, store: LakehouseStore, generated: GenerationResult, day_one: dict[str, list[tuple]]) -> None:
        """What every fault case ends with; raises AssertionError naming the first broken promise."""
        failed = [run for run in self.side_runs if run["outcome"] not in ("killed", "exit 0")]
        assert not failed, f"a batch or maintenance run failed on its own: {failed} (see {self.settings.run_dir})"
        assert {run["command"] for run in self.side_runs} == {"batch", "maintain"}, self.side_runs
        assert_every_line_once(store, generated.ledger)
        assert_speed_views_once(store, generated.truth_dir)
        assert batch_rows(self.settings, DAY_ONE) == day_one, "day one's batch rerun differs"
        assert served_differences(self.settings, generated.truth_dir) == []
        assert self.vacuumed > 0, "vacuum removed nothing: the case proves nothing about it"
        # Among them: a data file a table's current version references, missing or short.
        needing_a_person = [f.line() for f in examine(self.settings).findings if f.repair is None]
        assert not needing_a_person, needing_a_person


RUN_TIME_COLUMNS = {"detected_at"}  # a batch alert's detection time is its run's


def batch_rows(settings: Settings, day: date) -> dict[str, list[tuple]]:
    """Every batch view's rows of ``day``, sorted, without the run's own time: what a rerun on the
    same input must reproduce."""
    rows = {}
    for view in VIEWS:
        table = DeltaTable(str(settings.lakehouse_dir / view.batch_table))
        data = table.to_pyarrow_table(filters=[("date", "=", day)]).to_pylist()
        rows[view.name] = sorted((tuple(sorted((k, v) for k, v in row.items() if k not in RUN_TIME_COLUMNS))
                                  for row in data), key=repr)
    return rows


def unreferenced_parquet(settings: Settings) -> int:
    """Data files no table's current version references (what vacuum may take)."""
    orphans = 0
    for name in all_tables(settings.lakehouse_dir):
        folder = settings.lakehouse_dir / name
        referenced = {Path(uri.removeprefix("file://")) for uri in DeltaTable(str(folder)).file_uris()}
        orphans += sum(1 for path in folder.rglob("*.parquet") if path not in referenced
                       and "_delta_log" not in path.parts)
    return orphans




def served_differences(settings: Settings, truth_dir: Path) -> list[str]:
    """The views whose served rows (both days batch-covered) differ from the generator's truth."""
    from serving.engine import ServingEngine

    def truth(name: str) -> list[dict]:
        with (truth_dir / f"{name}.csv").open() as handle:
            return list(csv.DictReader(handle))

    def iso(value: datetime | None) -> str | None:
        return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z" if value else None

    engine = ServingEngine(settings)
    compared = {
        "revenue_by_category_5m": (
            sorted((r["window_start"], r["category"], float(r["revenue"]), int(r["orders"]), int(r["unique_buyers"]))
                   for r in truth("revenue_by_category_5m")),
            sorted((iso(r["window_start"]), r["category"], r["revenue"], r["orders"], r["unique_buyers"])
                   for r in engine.rows("SELECT * FROM revenue_by_category_5m"))),
        "order_payments": (
            sorted((r["order_id"], r["status"], r["payment_id"] or None, r["pay_time"] or None, float(r["amount"]))
                   for r in truth("order_payments")),
            sorted((r["order_id"], r["status"], r["payment_id"], iso(r["pay_time"]), r["amount"])
                   for r in engine.rows("SELECT * FROM order_payments"))),
        "device_health_5m": (
            sorted((r["window_start"], r["device_id"], int(r["readings"]), float(r["max_temperature"]))
                   for r in truth("device_health_5m")),
            sorted((iso(r["window_start"]), r["device_id"], r["readings"], r["max_temperature"])
                   for r in engine.rows("SELECT * FROM device_health_5m"))),
        "alerts": (sorted(r["alert_id"] for r in truth("alerts") if r["in_batch"] == "True"),
                   sorted(r["alert_id"] for r in engine.rows("SELECT alert_id FROM alerts"))),
    }
    return [name for name, (expected, served) in compared.items() if expected != served]
