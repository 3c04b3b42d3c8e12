"""Freshness of the live speed layer as users see it: from a landing file's atomic rename to the
first answer of ``lambdalake serve`` that shows its events.

    .venv/bin/python benchmarks/freshness.py [--events-per-second 10000] [--seconds 120]
        [--warmup 30] [--trigger-interval 1] [--views all revenue_by_category_5m,order_payments]
        [--cdc-per-second 0] [--view-triggers '' 'revenue_by_segment_1h=5s']
        [--bronze-triggers '' 10s] [--client http|in-process] [--checks recent|whole-day]
        [--outage 0] [--outage-at SECONDS]

1. ``lambdalake stream`` runs continuously in its own process on a fresh home, with the project's
   defaults (this script sets no ``LAMBDALAKE_MAX_*``) apart from its processing-time trigger
   ``--trigger-interval`` (each ``--view-triggers`` and ``--bronze-triggers`` setting in a run of
   its own). With ``--client http`` (the default) ``lambdalake serve`` runs beside it on the same
   home, on a free port of 127.0.0.1, with a token generated for the run
   (``LAMBDALAKE_SERVE_TOKEN``). Both write their output to ``run/bench-stream.log`` and
   ``run/bench-serve.log`` in the home (printed at the start); when one exits with an error, the
   end of its log is printed.
2. Once the server answers and the stream's heartbeat says it runs (JVM up, queries started;
   files landed before would be a start-up backlog carried through the run), every second for
   ``--seconds`` this process lands one file per topic (clicks, sensors, orders, payments) with
   that second's share of ``--events-per-second``, event time = now, written and renamed
   atomically like the generator's files. Order ids carry the file's number; payments pay the
   previous file's orders.
3. Every 250 ms, as a dashboard would, a client checks per file: its orders in
   ``order_payments``, and ``revenue_by_category_5m`` counting every order landed up to it.
   Freshness = the first answer that shows a file - its rename time. Files landed during
   ``--warmup`` are not counted (JVM start-up, first plans). A sensors file holds one reading of
   each device of a fixed fleet (as many devices as readings per second), plus one reading
   above the temperature limit from a device named after the file: alert latency = its
   ``high_temperature`` row in ``alerts`` first seen - rename time. With ``--cdc-per-second N``
   each second also lands a ``customers_cdc`` file of N changes (updates spread over 300,000
   customers, plus the creation of a customer named after the file): CDC apply latency = that
   customer in ``customers`` first seen - rename time.

   ``--client http`` sends every check of every poll to ``POST /api/query`` with the token, so
   freshness includes the server's own refresh (every 250 ms) and its answers under load.
   ``--client in-process`` keeps one serving engine in this process instead, refreshed at each
   poll; a view is checked only when its speed table changed. ``--checks recent`` (the default)
   asks each view for its rows from the oldest file it has not shown yet on, as a dashboard asks
   for its last minutes; ``--checks whole-day`` asks for every row of the day at every poll, so
   the answers' cost grows with the day.

4. CPU, in cores (CPU seconds / wall seconds) per phase of the landing (after the warm-up;
   with an outage: steady, outage, after the restart): utime + stime from ``/proc/<pid>/stat`` of
   every process of the stream's tree (its Python process, the JVM, Python workers) and of the
   server's, taken at the phases' bounds; a process that exits within a phase loses its share.
   The client's: this process's ``time.process_time()`` (lander, polls, memory sampling; in-process
   also the serving engine).

5. ``--outage SECONDS``: ``--outage-at`` seconds after the landing began (default: half of
   ``--seconds``) the stream's process group gets SIGKILL (a crash, the JVM with it) while files
   keep landing; SECONDS later the same command starts again on the same home. Steady freshness
   counts the files landed after the warm-up that a view showed before the kill (those still in
   flight then wait for the restart: the outage hit them, and their delays are reported apart);
   make that part long enough for a stable p95: the warm-up plus about 60 s (the documented run
   uses ``--outage 120``). Then: backlog drained = from the restart until the last file landed
   during the outage is visible; catch-up = the rename of the first of 10 consecutive files
   landed after the restart that are all visible within the steady p95, minus the restart time.

6. Every 10 s (in a thread of its own, so the polls keep their pace) it samples the stream's
   resident memory (its process tree, from ``/proc``) and the JVM's heap
   (``jcmd GC.heap_info``), so growth shows as heap (the JVM collects lazily up to its maximum)
   or beyond it (RocksDB state, metadata, Python workers): with ``--seconds 1200`` this is the
   20-minute memory run (state bounded by the watermark keeps it flat). Afterwards the report
   gives each query's state rows (first / last tenth of its micro-batches), to tell state still
   filling its window from growth without bound. With ``--seconds 1800`` or more it also compares
   the p50 of the last 10 minutes with minutes 3-10, and the RSS of the last 10 minutes with
   minutes 10-20 (the 30-minute stability run).

7. Where the stream's CPU goes: per thread of its processes (``/proc/<pid>/task``), grouped by
   thread name (the JVM's JIT compiler, collector, stream-execution and task threads; delta-rs'
   runtime and the rest of the Python process), over the first phase.

Writes a Markdown report to ``--report`` (default ``benchmarks/results/freshness.md``,
overwritten). Ctrl-C during a run stops its landing and reports what was measured until then.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import pairwise, product
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
# Each second's events across topics (clicks dominate, as in the generator's traffic).
SHARES = {"clicks": 0.70, "sensors": 0.20, "orders": 0.05, "payments": 0.05}
CATEGORIES = ("books", "electronics", "fashion", "home")
CDC_CUSTOMERS, CDC_SEGMENTS = 300_000, ("consumer", "premium", "business")
POLL_SECONDS = 0.25
MEMORY_SECONDS = 10
STOP_SECONDS = 600
CAUGHT_UP_FILES = 10
MEASURED = ("order_payments", "revenue_by_category_5m", "alerts")
# What each poll asks of a measured view, from the oldest file it has not shown yet on
# (``{since}``; 0 with ``--checks whole-day``); ``files_shown`` reads the answer.
# ``revenue_by_category_5m`` is a row per window and category: asked whole.
CHECKS = {
    "order_payments": "SELECT CAST(substr(order_id, 3, 6) AS INTEGER) AS file, count(*) AS orders "
                      "FROM order_payments WHERE order_id >= 'o-{since:06d}' AND order_id LIKE 'o-%' GROUP BY 1",
    "revenue_by_category_5m": "SELECT CAST(coalesce(sum(orders), 0) AS BIGINT) AS orders FROM revenue_by_category_5m",
    "alerts": "SELECT CAST(substr(entity_id, 2) AS INTEGER) AS file FROM alerts "
              "WHERE kind = 'high_temperature' AND entity_id >= 'H{since:06d}' AND entity_id LIKE 'H%'",
    "customers": "SELECT CAST(substr(customer_id, 2) AS INTEGER) AS file FROM customers "
                 "WHERE customer_id >= 'M{since:06d}' AND customer_id LIKE 'M%'",
}


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def lines_for(topic: str, number: int, count: int, now: datetime) -> list[str]:
    at = iso(now)
    if topic == "orders":
        return [json.dumps({"order_id": f"o-{number:06d}-{i}", "user_id": f"U{i % 997}", "product_id": f"P{i % 50}",
                            "category": CATEGORIES[i % 4], "amount": 10.0 + i % 90, "event_time": at})
                for i in range(count)]
    if topic == "payments":  # pays the previous file's orders
        return [json.dumps({"payment_id": f"p-{number:06d}-{i}", "order_id": f"o-{number - 1:06d}-{i}",
                            "amount": 10.0 + i % 90, "method": "card", "event_time": at}) for i in range(count)]
    if topic == "clicks":
        return [json.dumps({"event_id": f"c-{number:06d}-{i}", "user_id": f"U{i % 997}", "session_id": f"S{i % 300}",
                            "page_url": f"/p/{i % 40}", "action": "view", "device_type": "mobile", "product_id": None,
                            "event_time": at}) for i in range(count)]
    if topic == "customers_cdc":  # the file's own new customer, then updates across a large customer base
        ts_ms = int(now.timestamp() * 1000)

        def row(customer: str, segment: str) -> dict:
            return {"customer_id": customer, "name": "Ada", "email": f"{customer}@example.com", "segment": segment,
                    "country": "DE"}

        marker = json.dumps({"op": "c", "ts_ms": ts_ms, "before": None, "after": row(f"M{number:06d}", "consumer")})
        return [marker] + [
            json.dumps({"op": "u", "ts_ms": ts_ms, "before": None,
                        "after": row(f"K{(number * count + i) % CDC_CUSTOMERS:06d}", CDC_SEGMENTS[(number + i) % 3])})
            for i in range(count - 1)
        ]
    # A fleet that reports once a second per device (the same devices every second), plus one
    # overheating device named after the file, whose alert is timed.
    hot = [json.dumps({"device_id": f"H{number:06d}", "temperature": 90.0, "humidity": 40.0, "event_time": at})]
    return hot + [json.dumps({"device_id": f"D{i:05d}", "temperature": 21.5, "humidity": 40.0, "event_time": at})
                  for i in range(count - 1)]


# Spark's processing-time trigger fires on wall-clock multiples of its interval, so a file's wait
# for the next micro-batch depends on where in the second it lands: at a fixed phase a run
# measures one point of that (Spark's floor measured 0.3 s in one run, 1.0 s in another). Each
# second's files land at a phase of their own, spread evenly over the second (golden-ratio steps).
PHASE_STEP = (5 ** 0.5 - 1) / 2


class Lander(threading.Thread):
    """Lands one file per topic every second, at a phase within the second that changes from one
    second to the next (``PHASE_STEP``); remembers each file's rename time."""

    def __init__(self, landing: Path, events_per_second: int, seconds: int, cdc_per_second: int = 0) -> None:
        super().__init__(daemon=True)
        self.landing, self.seconds = landing, seconds
        self.counts = {topic: max(1, round(events_per_second * share)) for topic, share in SHARES.items()}
        if cdc_per_second:
            self.counts["customers_cdc"] = cdc_per_second
        self.renamed: dict[int, float] = {}
        self.orders: dict[int, int] = {}
        self.halt = threading.Event()

    def start(self) -> None:
        self.started = time.monotonic()
        super().start()

    def run(self) -> None:
        for number in range(self.seconds):
            phase = number * PHASE_STEP % 1
            if self.halt.wait(max(0.0, self.started + number + phase - time.monotonic())):
                return
            now = datetime.now(timezone.utc)
            files = []
            for topic, count in self.counts.items():
                folder = self.landing / topic
                folder.mkdir(parents=True, exist_ok=True)
                temporary = folder / f".{number:06d}.tmp"
                temporary.write_text("\n".join(lines_for(topic, number, count, now)) + "\n")
                files.append((temporary, folder / f"{number:06d}.jsonl"))
                if topic == "orders":
                    self.orders[number] = count
            for temporary, final in files:
                os.replace(temporary, final)
            self.renamed[number] = time.monotonic()


class Service:
    """A ``lambdalake`` command in a process group of its own (so that a kill takes its JVM too),
    its output appended to ``bench-<name>.log`` in the home's run directory."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], run_dir: Path) -> None:
        self.name, self.command, self.env = name, command, env
        self.log = run_dir / f"bench-{name}.log"
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as log:
            log.write(f"--- {iso(datetime.now(timezone.utc))}: {shlex.join(self.command)}\n")
            log.flush()
            self.process = subprocess.Popen(self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def check(self) -> None:
        """Fail when the process ended: it must run until stopped."""
        if self.process and self.process.poll() is not None:
            raise ServiceDied(f"lambdalake {self.name} exited with {self.process.returncode}; the end of {self.log}:\n"
                              f"{self.tail()}")

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None

    def stop(self, timeout: float) -> None:
        """SIGTERM, and wait (a backlogged stream finishes its in-flight micro-batches first)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"lambdalake {self.name} still running {timeout:.0f} s after SIGTERM: killed", file=sys.stderr)
            self.kill()
            return
        # Its JVM exits after it; one still there later would load the next run.
        deadline = time.monotonic() + 30
        while group_alive(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_alive(self.process.pid):
            print(f"lambdalake {self.name}: processes of its group still running 30 s after it exited: killed",
                  file=sys.stderr)
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.process.returncode not in (0, -signal.SIGTERM):  # uvicorn exits by the signal it got
            print(f"lambdalake {self.name} exited with {self.process.returncode}; "
                  f"the end of {self.log}:\n{self.tail()}",
                  file=sys.stderr)
        self.process = None


class ServiceDied(SystemExit):
    """A service the run needs ended by itself (a crash): the run stops there and is reported."""


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def stream_running(settings, pid: int | None) -> bool:
    """The heartbeat of this stream process (not a killed one's) says its queries run."""
    from include.heartbeat import read_heartbeat

    beat = read_heartbeat(settings.run_dir) or {}
    return pid is not None and beat.get("pid") == pid and beat.get("state") == "running"


def wait_until_running(settings, stream: Service, timeout: float = 300) -> None:
    """Until the stream's heartbeat says its queries run: files landed while its JVM starts would
    be a backlog that a stream with little spare capacity carries through the whole run."""
    deadline = time.monotonic() + timeout
    while not stream_running(settings, stream.pid):
        stream.check()
        if time.monotonic() > deadline:
            raise SystemExit(f"lambdalake stream did not start within {timeout:.0f} s; see {stream.log}")
        time.sleep(0.2)


def unseen_from(seen: dict[int, float], start: int) -> int:
    """The first file number from ``start`` on that is not in ``seen``."""
    while start in seen:
        start += 1
    return start


def files_shown(view: str, rows: list[dict], orders: dict[int, int]) -> list[int]:
    """The files whose events ``rows`` (the answer to ``CHECKS[view]``) show; ``orders``: the
    orders landed per file."""
    if view == "order_payments":  # all of the file's orders
        return [row["file"] for row in rows if row["orders"] >= orders.get(row["file"], 1 << 30)]
    if view == "revenue_by_category_5m":  # every order landed up to the file counted
        counted, landed, shown = rows[0]["orders"], 0, []
        for number in sorted(orders):
            landed += orders[number]
            if landed > counted:
                break
            shown.append(number)
        return shown
    return [row["file"] for row in rows]


class HttpClient:
    """The checks as a program asks them: ``POST /api/query`` of ``lambdalake serve``, over one
    kept-alive connection. The server refreshes itself, so every poll checks every view."""

    def __init__(self, port: int, token: str) -> None:
        import httpx

        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                                 timeout=60)

    def wait(self, server: Service, timeout: float = 120) -> None:
        """Until the server answers a query."""
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            server.check()
            try:
                if self.http.post("/api/query", json={"sql": "SELECT 1"}).status_code == 200:
                    return
            except httpx.TransportError:  # not listening yet
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"lambdalake serve did not answer within {timeout:.0f} s; see {server.log}")
            time.sleep(0.2)

    def due(self, views: list[str]) -> list[str]:
        return views

    def rows(self, sql: str) -> list[dict]:
        answer = self.http.post("/api/query", json={"sql": sql})
        if answer.status_code != 200:
            raise SystemExit(f"POST /api/query answered {answer.status_code}: {answer.text[:500]}")
        return answer.json()

    def close(self) -> None:
        self.http.close()


class InProcessClient:
    """The checks on one serving engine in this process (no HTTP, no server)."""

    def __init__(self, settings) -> None:
        from serving.engine import ServingEngine

        self.engine = ServingEngine(settings)

    def due(self, views: list[str]) -> list[str]:
        """Refresh; the views whose speed table changed. Only they can show a new file, and a
        check scans a whole view on the cores the stream uses."""
        from include.views import VIEWS_BY_NAME
        from serving.engine import speed_relation

        changed = set(self.engine.refresh())
        return [view for view in views if speed_relation(VIEWS_BY_NAME[view]) in changed]

    def rows(self, sql: str) -> list[dict]:
        return self.engine.rows(sql)

    def close(self) -> None:
        pass


def children_of() -> dict[int, list[int]]:
    """Every process's children (Linux ``/proc``)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    return children


def tree(pid: int | None) -> list[int]:
    """``pid`` and all its descendants."""
    children, found, todo = children_of(), [], [pid] if pid else []
    while todo:
        found.append(todo.pop())
        todo += children.get(found[-1], [])
    return found


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, MB (Linux ``/proc``)."""
    total = 0
    for member in tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def tree_ticks(pid: int | None) -> dict[int, int]:
    """CPU clock ticks (utime + stime) used so far by ``pid`` and each of its descendants."""
    ticks = {}
    for member in tree(pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
            ticks[member] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue
    return ticks


# Thread groups of the stream's processes, by thread name (Linux ``comm``, 15 characters) and
# process: where its CPU goes.
THREAD_GROUPS = (
    ("JVM: JIT compiler", "java", re.compile(r"^C[12] CompilerThre")),
    ("JVM: garbage collector", "java", re.compile(r"^(GC Thread|G1 |VM Thread)")),
    ("JVM: micro-batch planning and commits (stream execution)", "java", re.compile(r"^stream executio")),
    ("JVM: Spark tasks", "java", re.compile(r"^Executor task")),
    ("JVM: other threads", "java", re.compile("")),
    ("Python: delta-rs (tokio)", "", re.compile(r"^tokio-runtime-w|^tokio-rt-worker")),
    ("Python: interpreter, DuckDB, pyarrow", "", re.compile("")),
)


def tree_thread_ticks(pid: int | None) -> dict[tuple[int, int], tuple[str, int]]:
    """Per thread of ``pid``'s tree: its group (:data:`THREAD_GROUPS`) and CPU clock ticks so far."""
    found = {}
    for member in tree(pid):
        try:
            java = b"java" in Path(f"/proc/{member}/cmdline").read_bytes().split(b"\0")[0]
            threads = list(Path(f"/proc/{member}/task").iterdir())
        except OSError:
            continue
        for thread in threads:
            try:
                stat = (thread / "stat").read_text()
            except OSError:
                continue
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat.rsplit(")", 1)[1].split()
            group = next(label for label, process, pattern in THREAD_GROUPS
                         if (process == "java") == java and pattern.search(name))
            found[(member, int(thread.name))] = (group, int(fields[11]) + int(fields[12]))
    return found


def jvm_heap_mb(pid: int) -> tuple[float, float] | None:
    """(used, committed) heap of the JVM under ``pid``, MB (``jcmd GC.heap_info``), or None."""
    for child in children_of().get(pid, []):
        try:
            if b"java" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[0]:
                found = subprocess.run(["jcmd", str(child), "GC.heap_info"], capture_output=True, text=True, timeout=30)
                match = re.search(r"heap\s+total (\d+)K, used (\d+)K", found.stdout)
                return (int(match[2]) / 1024, int(match[1]) / 1024) if match else None
        except (OSError, subprocess.SubprocessError):
            continue
    return None


class MemorySampler(threading.Thread):
    """Every 10 s: (seconds since ``since``, RSS MB of the stream's tree, its JVM's heap MB)."""

    def __init__(self, stream: Service, since: float) -> None:
        super().__init__(daemon=True)
        self.stream, self.since = stream, since
        self.samples: list[tuple[float, float, tuple[float, float] | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            pid = self.stream.pid
            if pid is not None:  # none while the stream is down
                sample = (time.monotonic() - self.since, tree_rss_mb(pid), jvm_heap_mb(pid))
                if self.stream.pid == pid:  # not killed meanwhile (a half-gone tree)
                    self.samples.append(sample)
            if self.done.wait(MEMORY_SECONDS):
                return


@dataclass(frozen=True)
class Mark:
    """The CPU used up to one moment: per process of the stream's and the server's trees (clock
    ticks), and this process's (seconds)."""

    at: float
    stream: dict[int, int]
    server: dict[int, int]
    client: float
    threads: dict[tuple[int, int], tuple[str, int]]  # the stream's, by group


def mark(stream: Service, server: Service | None) -> Mark:
    return Mark(time.monotonic(), tree_ticks(stream.pid), tree_ticks(server.pid if server else None),
                time.process_time(), tree_thread_ticks(stream.pid))


def thread_cores(start: Mark, end: Mark) -> dict[str, float]:
    """The stream's cores between two marks per thread group (threads gone by ``end`` left out)."""
    seconds, tick, used = end.at - start.at, os.sysconf("SC_CLK_TCK"), {}
    for thread, (group, ticks) in end.threads.items():
        before = start.threads.get(thread, (group, 0))[1]
        used[group] = used.get(group, 0.0) + max(0, ticks - before) / tick / seconds
    return used


def cores(start: Mark, end: Mark) -> tuple[float, float, float]:
    """(stream, server, client) cores between two marks. A process first seen at ``end`` started
    in between; one gone by ``end`` is left out."""
    seconds, tick = end.at - start.at, os.sysconf("SC_CLK_TCK")

    def used(before: dict[int, int], after: dict[int, int]) -> float:
        return sum(max(0, ticks - before.get(pid, 0)) for pid, ticks in after.items()) / tick / seconds

    return used(start.stream, end.stream), used(start.server, end.server), (end.client - start.client) / seconds


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def measure(args: argparse.Namespace, rate: int, views: str, triggers: str, bronze: str, design: str) -> dict:
    """One live stream at ``rate`` events/s (``views``: `all` or ``stream --views``; ``triggers``: ``stream
    --view-triggers``; ``bronze``: ``stream --bronze-trigger``; ``design``: ``stream``, the
    project's stream, or ``floor``) on a fresh home while files land,
    watched by the ``--client``; with ``--outage``, killed and restarted on the way."""
    from include.config import load_settings

    home = Path(tempfile.mkdtemp(prefix="lambdalake-freshness-"))
    settings = load_settings(home=home)
    print(f"home {home} (logs in {settings.run_dir})", file=sys.stderr)
    env = {**os.environ, "LAMBDALAKE_HOME": str(home)}
    if design == "floor":
        return measure_floor(args, rate, home, settings, env)
    stream = Service("stream", [LAMBDALAKE, "stream"] + ([] if views == "all" else ["--views", views]),
                     {**env, "LAMBDALAKE_TRIGGER_INTERVAL": f"{args.trigger_interval}s",
                      "LAMBDALAKE_VIEW_TRIGGERS": triggers,
                      "LAMBDALAKE_BRONZE_TRIGGER_INTERVAL": bronze}, settings.run_dir)
    server = client = None
    if args.client == "http":
        port, token = free_port(), secrets.token_urlsafe(32)
        server = Service("serve", [LAMBDALAKE, "serve", "--host", "127.0.0.1", "--port", str(port), "--pg-port", "0"],
                         {**env, "LAMBDALAKE_SERVE_TOKEN": token}, settings.run_dir)
        client = HttpClient(port, token)
    services = [service for service in (stream, server) if service]
    intervals = trigger_intervals(home, args.trigger_interval, views, triggers, bronze)
    lander = Lander(settings.landing_dir, rate, args.seconds, args.cdc_per_second)
    measured = [*MEASURED, *(["customers"] if args.cdc_per_second else [])]
    seen: dict[str, dict[int, float]] = {view: {} for view in measured if views == "all" or view in views.split(",")}
    unseen = dict.fromkeys(seen, 0)  # per view, no file before this one is still to be shown
    marks: list[tuple[str, Mark]] = []  # each phase's name and start, then ("end", ...)
    outage: dict[str, float] = {}  # when the stream was killed, restarted, running again
    sampler = None
    try:
        for service in services:
            service.start()
        if server:
            client.wait(server)
        wait_until_running(settings, stream)
        client = client or InProcessClient(settings)
        lander.start()
        started_at = datetime.now(timezone.utc)
        sampler = MemorySampler(stream, lander.started)
        sampler.start()
        deadline = lander.started + args.seconds + 180
        next_poll = time.monotonic()
        interrupted = died = None
        try:
            while time.monotonic() < deadline:
                time.sleep(max(0.0, next_poll - time.monotonic()))
                next_poll = max(next_poll, time.monotonic()) + POLL_SECONDS
                for service in services:
                    service.check()
                now = time.monotonic()
                if not marks and now >= lander.started + args.warmup:
                    marks.append(("steady", mark(stream, server)))
                if args.outage and "killed" not in outage and now >= lander.started + args.outage_at:
                    marks.append(("outage", mark(stream, server)))
                    stream.kill()
                    outage["killed"] = time.monotonic()
                elif "killed" in outage and "restarted" not in outage and now >= outage["killed"] + args.outage:
                    marks.append(("after the restart", mark(stream, server)))
                    stream.start()
                    outage["restarted"] = time.monotonic()
                elif "restarted" in outage and "running" not in outage and stream_running(settings, stream.pid):
                    outage["running"] = now
                landed = not lander.is_alive()
                if landed and marks[-1][0] != "end":
                    marks.append(("end", mark(stream, server)))
                for view in client.due(list(seen)):
                    since = unseen_from(seen[view], unseen[view]) if args.checks == "recent" else 0
                    unseen[view] = since
                    shown = files_shown(view, client.rows(CHECKS[view].format(since=since)), lander.orders)
                    answered = time.monotonic()
                    for number in shown:
                        seen[view].setdefault(number, answered)
                if seen and all(len(files) == args.seconds for files in seen.values()):
                    break
                if not seen and landed:  # no measured view: memory and state only
                    break
        except KeyboardInterrupt:  # Ctrl-C: stop landing, report what was measured so far
            lander.halt.set()
            interrupted = time.monotonic() - lander.started
            if marks and marks[-1][0] != "end":
                marks.append(("end", mark(stream, server)))
        except ServiceDied as death:  # a crash: report it with what was measured so far, go on
            lander.halt.set()
            died = (time.monotonic() - lander.started, str(death))
            print(death, file=sys.stderr)
    finally:
        if sampler:
            sampler.done.set()
            sampler.join()
        if client:
            client.close()
        try:
            if server:
                server.stop(30)
        finally:
            stream.stop(STOP_SECONDS)
    return {"rate": rate, "views": views, "triggers": triggers, "bronze": bronze, "design": design,
            "intervals": intervals, "seen": seen,
            "renamed": dict(lander.renamed), "started": lander.started, "counts": lander.counts, "marks": marks,
            "outage": outage, "memory": sampler.samples, "state_series": state_series(settings, started_at),
            "interrupted": interrupted, "died": died}


def measure_floor(args: argparse.Namespace, rate: int, home: Path, settings, env: dict[str, str]) -> dict:
    """Spark's floor on the same landing: one Structured Streaming query (``spark_floor.py
    --continuous``: landed lines as text to Parquet, the platform's Spark settings, the same
    trigger) and a file's rename to its rows being committed to the Parquet output."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from spark_floor import committed_files

    out = home / "floor"
    floor = Service("floor", [sys.executable, str(ROOT / "benchmarks" / "spark_floor.py"), "--continuous",
                              str(args.trigger_interval), str(settings.landing_dir), str(out), "0"], env,
                    settings.run_dir)
    lander = Lander(settings.landing_dir, rate, args.seconds, args.cdc_per_second)
    seen: dict[str, dict[int, float]] = {"floor": {}}
    marks: list[tuple[str, Mark]] = []
    sampler = None
    for topic in lander.counts:  # the stream creates its landing folders; the floor's source needs them
        (settings.landing_dir / topic).mkdir(parents=True, exist_ok=True)
    floor.start()
    try:
        deadline = time.monotonic() + 300
        while "running" not in floor.tail():
            floor.check()
            if time.monotonic() > deadline:
                raise SystemExit(f"spark_floor.py did not start within 300 s; see {floor.log}")
            time.sleep(0.2)
        lander.start()
        sampler = MemorySampler(floor, lander.started)
        sampler.start()
        deadline, next_poll = lander.started + args.seconds + 180, time.monotonic()
        while time.monotonic() < deadline and len(seen["floor"]) < args.seconds:
            time.sleep(max(0.0, next_poll - time.monotonic()))
            next_poll = max(next_poll, time.monotonic()) + POLL_SECONDS
            floor.check()
            now = time.monotonic()
            if not marks and now >= lander.started + args.warmup:
                marks.append(("steady", mark(floor, None)))
            if not lander.is_alive() and marks and marks[-1][0] != "end":
                marks.append(("end", mark(floor, None)))
            committed = committed_files(out)
            for number in lander.renamed:  # a file number counts once every topic's file of it is committed
                if number not in seen["floor"] and all(
                        str(settings.landing_dir / topic / f"{number:06d}.jsonl") in committed
                        for topic in lander.counts):
                    seen["floor"][number] = now
    finally:
        if sampler:
            sampler.done.set()
            sampler.join()
        floor.stop(STOP_SECONDS)
    return {"rate": rate, "views": "all", "triggers": "", "bronze": "", "design": "floor",
            "intervals": {"spark_floor": args.trigger_interval}, "seen": seen, "renamed": dict(lander.renamed),
            "started": lander.started, "counts": lander.counts, "marks": marks, "outage": {},
            "memory": sampler.samples if sampler else [], "state_series": {}, "interrupted": None, "died": None}


def trigger_intervals(home: Path, trigger: float, views: str, triggers: str, bronze: str) -> dict[str, float]:
    """The micro-batch interval of each of the stream's queries, in seconds, as the stream
    started with these options takes them."""
    from include.config import load_settings
    from speed_layer.runner import query_trigger_intervals

    settings = load_settings(home=home, trigger_interval=f"{trigger}s", view_triggers=triggers,
                             bronze_trigger_interval=bronze or None, speed_views="" if views == "all" else views)
    return {query: interval.total_seconds() for query, interval in query_trigger_intervals(settings).items()}


def state_series(settings, started_at: datetime) -> dict[str, list[tuple[float, int]]]:
    """Per query and micro-batch: (seconds since the landing began, rows its state operators
    keep), from Spark's progress in ``ops/stream_metrics``."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(settings.lakehouse_dir / "ops" / "stream_metrics")).to_pyarrow_table(
        columns=["query", "timestamp", "state_rows"]).to_pylist()
    series: dict[str, list[tuple[float, int]]] = {}
    for row in sorted(rows, key=lambda row: row["timestamp"]):
        series.setdefault(row["query"], []).append(
            ((row["timestamp"] - started_at).total_seconds(), row["state_rows"] or 0))
    return dict(sorted(series.items()))


def state_ends(run: dict, warmup: float) -> dict[str, tuple[float, float]]:
    """Per query, its state rows averaged over the first and the last tenth of its micro-batches
    after the warm-up."""
    ends = {}
    for query, series in run["state_series"].items():
        counts = [rows for at, rows in series if at >= warmup]
        if counts:
            tenth = max(1, len(counts) // 10)
            ends[query] = (sum(counts[:tenth]) / tenth, sum(counts[-tenth:]) / tenth)
    return ends


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def delays(run: dict, view: str, files: list[int]) -> list[float]:
    """Seen - rename time of those of ``files`` the view showed, in landing order."""
    times = run["seen"][view]
    return [times[number] - run["renamed"][number] for number in files if number in times]


def landed_between(run: dict, low: float, high: float) -> list[int]:
    """The files renamed from ``low`` to before ``high`` (monotonic clock), in landing order."""
    return [number for number, at in sorted(run["renamed"].items()) if low <= at < high]


def steady_files(run: dict, view: str, warmup: int) -> list[int]:
    """The files landed after the warm-up; with an outage, those the view showed before the kill
    (one landed before it but not shown by then waits for the restart: the outage hit it)."""
    killed, times = run["outage"].get("killed"), run["seen"][view]
    return [number for number in sorted(run["renamed"])
            if number >= warmup and (killed is None or times.get(number, killed) < killed)]


def catch_up(run: dict, view: str, steady_p95: float | None) -> tuple[float | None, float | None, list[float]]:
    """(backlog drained, caught up: seconds from the restart, or None; the delays of the files
    from the catch-up on). No steady p95 (no file seen before the outage): no catch-up."""
    times, renamed, restarted = run["seen"][view], run["renamed"], run["outage"]["restarted"]
    down = landed_between(run, run["outage"]["killed"], restarted)
    drained = times[down[-1]] - restarted if down and down[-1] in times else None
    after, streak = landed_between(run, restarted, float("inf")), 0
    for index, number in enumerate(after):
        on_time = steady_p95 is not None and number in times and times[number] - renamed[number] <= steady_p95
        streak = streak + 1 if on_time else 0
        if streak == CAUGHT_UP_FILES:
            first = index + 1 - CAUGHT_UP_FILES
            return drained, renamed[after[first]] - restarted, delays(run, view, after[first:])
    return drained, None, []


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def over_time(run: dict, args: argparse.Namespace) -> list[str]:
    """The run in tenths after the warm-up: the first measured view's median delay, memory and
    the two largest states. Growth that stops (state filling its window plus the watermark
    delay) shows apart from growth without bound."""
    start, length = args.warmup, (args.seconds - args.warmup) / 10
    ends = state_ends(run, args.warmup)
    largest = sorted(ends, key=lambda query: -ends[query][1])[:2]
    view = next(iter(run["seen"]), None)
    header = ["minutes", *([f"`{view}` p50 s"] if view else []), "RSS MB", "heap used MB",
              *(f"`{q}` state rows" for q in largest)]
    lines = ["| " + " | ".join(header) + " |", "|---" + "|---:" * (len(header) - 1) + "|"]

    def mean(values: list[float]) -> str:
        return f"{sum(values) / len(values):,.0f}" if values else "-"

    for part in range(10):
        low, high = start + part * length, start + (part + 1) * length
        cells = [f"{low / 60:.1f}-{high / 60:.1f}"]
        if view:
            late = delays(run, view, [number for number in run["renamed"] if low <= number < high])
            cells.append(f"{percentile(late, 0.5):.1f}" if late else "-")
        samples = [(rss, heap) for at, rss, heap in run["memory"] if low <= at < high]
        cells += [mean([rss for rss, _ in samples]), mean([heap[0] for _, heap in samples if heap])]
        cells += [mean([rows for at, rows in run["state_series"][q] if low <= at < high]) for q in largest]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def revision() -> str:
    found = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return found.stdout.strip() or "an unknown revision"


def report(args: argparse.Namespace, runs: list[dict]) -> str:
    counts = "; ".join(f"{run['rate']:,} events/s: "
                       + ", ".join(f"{topic} {count:,}" for topic, count in run["counts"].items())
                       for run in runs)
    inherited = sorted(name for name in os.environ if name.startswith("LAMBDALAKE_"))
    client = ("`lambdalake serve` in its own process on the run's home (it refreshes its engine every 250 ms), asked "
              f"through `POST /api/query` (httpx, one kept-alive connection) every {POLL_SECONDS:g} s, "
              "every view's check at each poll") if args.client == "http" else (
              f"one serving engine in this process, refreshed every {POLL_SECONDS:g} s; a view checked when its speed "
              "table changed")
    lines = [
        "# Freshness benchmark", "",
        f"Run {datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, at {revision()}: "
        f"`{shlex.join(['.venv/bin/python', 'benchmarks/freshness.py', *sys.argv[1:]])}`.", "",
        "- Stream: `lambdalake stream` on a fresh home per run, with the project's defaults (no `LAMBDALAKE_MAX_*` set"
        + (f"; the environment set {', '.join(f'`{name}`' for name in inherited)}" if inherited else "")
        + f") apart from a processing-time trigger of {args.trigger_interval:g} s (each query's below).",
        f"- Landing: one file per topic every second for {args.seconds} s, each second's at a phase of its own "
        "(spread evenly over the second, so a trigger's wall-clock ticks are met at every phase); events per "
        f"file at {counts} (each sensors file one reading per device of a fixed fleet, one of them overheating; "
        "payments pay the previous file's orders). Event time = now.",
        f"- Client: {client} (`--client {args.client}`). Checks (`--checks {args.checks}`): "
        + ("each asks for the rows from the oldest file the view has not shown yet on, as a dashboard asks for its "
           "last minutes (`revenue_by_category_5m`, a row per window and category, whole)" if args.checks == "recent"
           else "each asks for every row of the day") + ".",
        "- Freshness: a file's atomic rename to the first answer that shows its events; files of the first "
        f"{args.warmup} s not counted. `alerts`: the file's overheating reading to its `high_temperature` alert. "
        "`customers`: the file's new customer to its row in `customers`.",
    ]
    if args.outage:
        lines.append(f"- Outage: {args.outage_at} s into the landing the stream's process group got SIGKILL; "
                     f"files kept landing; {args.outage} s later the same command started again on the same home.")
    lines.append("- One run per rate, view set and trigger setting, one after another.")
    lines += [f"- {label(run)}: interrupted (Ctrl-C) {run['interrupted']:.0f} s after the landing began; "
              "the figures cover what was measured until then." for run in runs if run["interrupted"] is not None]
    for run in runs:
        if run["died"] is not None:
            seconds, why = run["died"]
            lines += [f"- {label(run)}: **a service died** {seconds:.0f} s after the landing began; the figures cover "
                      "what was measured until then. " + why.splitlines()[0], "", "```", *why.splitlines()[1:], "```"]
    lines += ["",
              "Micro-batch intervals (each query's processing-time trigger):", ""]
    for run in runs:
        by_interval: dict[float, list[str]] = {}
        for query, interval in run["intervals"].items():
            by_interval.setdefault(interval, []).append(f"`{query}`")
        lines.append(f"- {label(run)}: " + "; ".join(f"{interval:g} s: {', '.join(queries)}"
                                                    for interval, queries in sorted(by_interval.items())) + ".")
    lines += ["", "Steady freshness, of the files landed after the warm-up" + (" that the view showed before the kill"
                                                                             if args.outage else "")
              + "; first / last tenth: mean delay of the first / last tenth of them in landing order (a last tenth "
              "slower than the first means a growing backlog):", "",
              "| speed views | view | files measured | p50 s | p95 s | max s | first tenth mean s | last tenth mean s "
              "| never seen |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for view, times in run["seen"].items():
            files = steady_files(run, view, args.warmup)
            late, missing = delays(run, view, files), len([number for number in files if number not in times])
            if late:
                tenth = max(1, len(late) // 10)
                lines.append(f"| {label(run)} | `{view}` | {len(late)} | {percentile(late, 0.5):.1f} | "
                             f"{percentile(late, 0.95):.1f} | {max(late):.1f} | {sum(late[:tenth]) / tenth:.1f} | "
                             f"{sum(late[-tenth:]) / tenth:.1f} | {missing} |")
            else:
                lines.append(f"| {label(run)} | `{view}` | 0 | - | - | - | - | - | {missing} |")
    floors = {run["rate"]: run for run in runs if run["design"] == "floor"}
    if floors:
        lines += ["", "Against Spark's floor at the same rate (`floor`: one query, landed text to Parquet with the "
                  "same trigger; a file counts once every topic's file of its second is committed): the view's p50 "
                  "and p95 over the floor's.", "", "| speed views | view | p50 / floor p50 | p95 / floor p95 |",
                  "|---|---|---:|---:|"]
        for run in (run for run in runs if run["design"] != "floor" and run["rate"] in floors):
            floor = delays(floors[run["rate"]], "floor", steady_files(floors[run["rate"]], "floor", args.warmup))
            for view in run["seen"]:
                late = delays(run, view, steady_files(run, view, args.warmup))
                if late and floor:
                    lines.append(f"| {label(run)} | `{view}` | {percentile(late, 0.5) / percentile(floor, 0.5):.1f}x "
                                 f"| {percentile(late, 0.95) / percentile(floor, 0.95):.1f}x |")
    lines += ["", "CPU in cores (CPU seconds / wall seconds, utime + stime from `/proc`) per phase of the landing "
              "after the warm-up: stream = `lambdalake stream` and its descendants (JVM, Python workers); "
              "server = `lambdalake serve` and its descendants; client = this process (lander, polls, memory sampling"
              + ("" if args.client == "http" else ", the serving engine") + "; not the `jcmd` it runs). A process that "
              "exited within a phase is left out of it.", "",
              "| speed views | phase | seconds | stream cores | server cores | client cores |",
              "|---|---|---:|---:|---:|---:|"]
    for run in runs:
        for (phase, start), (_, end) in pairwise(run["marks"]):
            stream, server, client_cores = cores(start, end)
            lines.append(f"| {label(run)} | {phase} | {end.at - start.at:.0f} | {stream:.2f} | "
                         f"{f'{server:.2f}' if args.client == 'http' else '-'} | {client_cores:.2f} |")
    lines += ["", "Where the stream's CPU goes, in cores per thread group over the first phase above (threads "
              "by name: the JVM's JIT compiler threads, its collector, the queries' stream-execution threads that "
              "plan each micro-batch and commit its offsets, Spark's task threads; delta-rs' Rust runtime in the "
              "Python process; the rest of the Python process: the interpreter's threads, DuckDB, pyarrow):", "",
              "| speed views | " + " | ".join(label for label, _, _ in THREAD_GROUPS) + " |",
              "|---" + "|---:" * len(THREAD_GROUPS) + "|"]
    for run in runs:
        if len(run["marks"]) > 1:
            (_, start), (_, end) = run["marks"][:2]
            used = thread_cores(start, end)
            cells = " | ".join(f"{used.get(group, 0.0):.2f}" for group, _, _ in THREAD_GROUPS)
            lines.append(f"| {label(run)} | {cells} |")
    if args.outage:
        lines += ["", f"Catch-up after the outage, in seconds from the restart. Backlog drained: until the last file "
                  f"landed during the outage was visible. Catch-up: to the rename of the first of {CAUGHT_UP_FILES} "
                  "consecutive files landed after the restart that were all visible within the steady p95 (the table "
                  "above); the files from it on follow. Hit by the outage: the files landed after the warm-up and "
                  "before the restart that the view had not shown before the kill. Never seen: of the files after the "
                  "warm-up that are not steady.", ""]
        for run in runs:
            times = run["outage"]
            if "restarted" not in times:
                lines.append(f"- {label(run)}: interrupted before the restart.")
                continue
            running = times["running"] - times["restarted"] if "running" in times else None
            down = landed_between(run, times["killed"], times["restarted"])
            lines.append(f"- {label(run)}: killed {times['killed'] - run['started']:.1f} s into the landing, restarted "
                         f"{times['restarted'] - times['killed']:.1f} s later; {len(down)} files landed while it "
                         f"was down; its heartbeat said its queries ran again {seconds(running)} s after the restart.")
        lines += ["", "| speed views | view | steady p95 s | files hit by the outage | their max delay s | "
                  "backlog drained s | catch-up s | files from the catch-up | their p50 s | their p95 s | never seen |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for run in (run for run in runs if "restarted" in run["outage"]):
            for view, times in run["seen"].items():
                steady = steady_files(run, view, args.warmup)
                p95 = percentile(delays(run, view, steady), 0.95) if steady else None
                drained, caught, late = catch_up(run, view, p95)
                kept = set(steady)
                others = [number for number in run["renamed"] if number >= args.warmup and number not in kept]
                hit = [number for number in others if run["renamed"][number] < run["outage"]["restarted"]]
                missing = len([number for number in others if number not in times])
                lines.append(f"| {label(run)} | `{view}` | {seconds(p95)} | {len(hit)} | "
                             f"{seconds(max(delays(run, view, hit), default=None))} | "
                             f"{seconds(drained)} | {seconds(caught)} | {len(late)} | "
                             f"{seconds(percentile(late, 0.5) if late else None)} | "
                             f"{seconds(percentile(late, 0.95) if late else None)} | {missing} |")
    lines += ["", "Stream memory (RSS of `lambdalake stream`'s process tree, sampled every 10 s after the warm-up; "
              "the JVM's heap from `jcmd GC.heap_info`; beyond the committed heap: RocksDB state, JVM metadata, "
              "Python workers):", ""]
    for run in runs:
        samples = [(rss, heap) for at, rss, heap in run["memory"] if at >= args.warmup]
        if not samples:
            continue
        tenth = max(1, len(samples) // 10)

        def ends(values: list[float]) -> str:
            first, last = sum(values[:tenth]) / tenth, sum(values[-tenth:]) / tenth
            return f"first tenth {first:,.0f} MB, last tenth {last:,.0f} MB ({last / first:.2f}x)"

        rss = [mb for mb, _ in samples]
        lines.append(f"- {label(run)}: {len(samples)} samples. RSS {ends(rss)}, peak {max(rss):,.0f} MB.")
        heaps = [(mb, heap) for mb, heap in samples if heap]
        if heaps:
            lines.append(f"  Heap used {ends([heap[0] for _, heap in heaps])}; "
                         f"committed {ends([heap[1] for _, heap in heaps])}; "
                         f"RSS beyond the committed heap {ends([mb - heap[1] for mb, heap in heaps])}.")
    lines += ["", "State rows per query (Spark's progress, mean of the first / last tenth of its micro-batches after "
              "the warm-up; each bounded by its window or horizon plus the watermark delay, so it grows until that "
              "has passed):", ""]
    for run in runs:
        kept = ", ".join(f"`{query}` {first:,.0f} / {last:,.0f}"
                         for query, (first, last) in state_ends(run, args.warmup).items() if last or first)
        lines.append(f"- {label(run)}: {kept}.")
    if args.seconds >= 30 * 60:
        lines += ["", "Stability over the 30 minutes (the landing's minutes; freshness by the files landed in them, "
                  "RSS of the stream's tree by the samples taken in them):", "",
                  "| speed views | view | p50 s, minutes 3-10 | p50 s, last 10 minutes | ratio | RSS MB, minutes "
                  "10-20 | RSS MB, last 10 minutes | ratio |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        last = args.seconds - 600
        for run in runs:
            rss = {window: [mb for at, mb, _ in run["memory"] if window[0] <= at < window[1]]
                   for window in ((600, 1200), (last, args.seconds))}
            before, after = (sum(values) / len(values) if values else None for values in rss.values())
            memory = (f"{before:,.0f} | {after:,.0f} | {after / before:.2f}x" if before and after else "- | - | -")
            for view in run["seen"]:
                early = delays(run, view, [number for number in run["renamed"] if 180 <= number < 600])
                late = delays(run, view, [number for number in run["renamed"] if number >= last])
                if early and late:
                    p50s = f"{percentile(early, 0.5):.1f} | {percentile(late, 0.5):.1f} | " \
                           f"{percentile(late, 0.5) / percentile(early, 0.5):.2f}x"
                else:
                    p50s = "- | - | -"
                lines.append(f"| {label(run)} | `{view}` | {p50s} | {memory} |")
    for run in runs:
        lines += ["", f"Over time, {label(run)} (means per tenth of the run after the warm-up; the view's delay by the "
                  "files landed in that tenth):", "", *over_time(run, args)]
    return "\n".join(lines) + "\n"


def label(run: dict) -> str:
    if run["design"] == "floor":
        return f"{run['rate']:,} events/s, Spark's floor"
    views = run["views"]
    named = f"{run['rate']:,} events/s, " + (
        "all" if views == "all" else ", ".join(f"`{name}`" for name in views.split(",")))
    options = ([f"--view-triggers {run['triggers']}"] * bool(run["triggers"])
               + [f"--bronze-trigger {run['bronze']}"] * bool(run["bronze"]))
    return named + f", {run['design']}" + "".join(f" (`{option}`)" for option in options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events-per-second", type=int, nargs="+", default=[10_000],
                        help="rates: one run per rate (and view set, ...), one after another")
    parser.add_argument("--seconds", type=int, default=120, help="seconds of landing")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--trigger-interval", type=float, default=1.0)
    parser.add_argument("--cdc-per-second", type=int, default=0, help="customer changes landed per second (0: none)")
    parser.add_argument("--views", nargs="+", default=["all"],
                        help="view sets, `all` or comma-separated names (`stream --views`): "
                             "one run per set, one after another")
    parser.add_argument("--view-triggers", nargs="+", default=[""],
                        help="`stream --view-triggers` settings (VIEW=DURATION,...; '' for none): "
                             "one run per setting and view set")
    parser.add_argument("--bronze-triggers", nargs="+", default=[""],
                        help="`stream --bronze-trigger` settings (a duration; '' for --trigger-interval): "
                             "one run per setting too")
    parser.add_argument("--designs", nargs="+", choices=("stream", "floor"), default=["stream", "floor"],
                        help="`stream`: `lambdalake stream`; `floor`: Spark's floor (spark_floor.py --continuous, "
                             "landed text to Parquet) in the same run: one run per design")
    parser.add_argument("--client", choices=("http", "in-process"), default="http",
                        help="http: `lambdalake serve` asked over HTTP (default); "
                             "in-process: a serving engine in this process")
    parser.add_argument("--checks", choices=("recent", "whole-day"), default="recent",
                        help="recent: each poll asks for the rows from the oldest file not shown yet on, as a "
                             "dashboard asks for its last minutes (default); whole-day: every row of the day")
    parser.add_argument("--outage", type=int, default=0,
                        help="seconds the stream stays killed, files still landing (0: none)")
    parser.add_argument("--outage-at", type=int,
                        help="seconds into the landing the stream is killed (default: --seconds / 2)")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "freshness.md")
    args = parser.parse_args()
    if args.outage_at is None:
        args.outage_at = args.seconds // 2
    if not 0 <= args.warmup < args.seconds:
        parser.error("--warmup must be shorter than --seconds")
    if args.outage and not args.warmup < args.outage_at < args.seconds - args.outage - CAUGHT_UP_FILES:
        parser.error(f"the outage must start after the warm-up and end {CAUGHT_UP_FILES} s before the landing does")
    runs = []
    for rate, views, triggers, bronze, design in product(args.events_per_second, args.views, args.view_triggers,
                                                         args.bronze_triggers, args.designs):
        runs.append(measure(args, rate, views, triggers, bronze, design))
        if runs[-1]["interrupted"] is not None:
            break
    text = report(args, runs)
    args.report.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
