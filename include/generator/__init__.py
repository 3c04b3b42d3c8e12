"""The event generator: synthetic traffic into the landing zone (or Kafka), plus its ground truth."""

from __future__ import annotations

import heapq
import itertools
import signal
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path


from include.progress import Progress
from include.config import Settings
from include.generator.landing import LandingZone
from include.generator.kafka import KafkaSink
from include.generator.simulation import Line, Simulator, TrafficOptions
from include.generator.truth import write_truth

FOLLOW_CHUNK = timedelta(minutes=1)


SINKS = ("landing", "kafka")


def open_sink(settings: Settings, sink: str) -> LandingZone | KafkaSink:
    """Where lines go: the landing zone (embedded) or Kafka's topics (cluster deployment)."""
    if sink == "kafka":
        return KafkaSink(settings.kafka_bootstrap_servers, settings.kafka_partitions)
    if sink == "landing":
        return LandingZone(settings.landing_dir)
    raise ValueError(f"unknown sink '{sink}': expected one of {', '.join(SINKS)}")


@dataclass(frozen=True)
class GenerationResult:
    run_id: str
    truth_dir: Path
    ledger: dict


def _group_into_files(lines: list[Line], start: datetime, file_minutes: int) -> dict[tuple[int, str], list[Line]]:
    """Lines by (arrival window, topic); each window of arrival time becomes one file per topic."""
    span = file_minutes * 60
    files: dict[tuple[int, str], list[Line]] = defaultdict(list)
    for line in sorted(lines, key=lambda line: line.arrival):
        window = int((line.arrival - start).total_seconds() // span)
        files[(window, line.topic)].append(line)
    return files


def generate(
    settings: Settings,
    start: datetime,
    hours: float,
    options: TrafficOptions,
    seed: int,
    file_minutes: int = 5,
    progress: bool | None = None,
    sink: str = "landing",
) -> GenerationResult:
    """Land ``hours`` of traffic starting at ``start`` and write its ground truth.

    Files are named by arrival window and seed, so the same seed gives the same files; an
    existing file is never overwritten (nothing is written at all in that case). With
    ``sink="kafka"`` the same lines go, file by file in the same order, to Kafka, which appends:
    producing a seed twice sends its events twice (the stream drops the copies as duplicates).
    """
    if start.tzinfo is None:
        raise ValueError(f"start must carry a time zone, got '{start.isoformat()}'")
    if hours <= 0:
        raise ValueError(f"hours must be positive, got {hours}")
    if file_minutes < 1:
        raise ValueError(f"file minutes must be >= 1, got {file_minutes}")
    start = start.astimezone(timezone.utc)
    end = start + timedelta(hours=hours)
    events, lines = Simulator(options, seed).lines(start, end)
    files = _group_into_files(lines, start, file_minutes)

    names = {
        key: f"{start + timedelta(minutes=key[0] * file_minutes):%Y%m%dT%H%M%SZ}-s{seed}" for key in files
    }
    output = open_sink(settings, sink)
    if isinstance(output, LandingZone):
        clashes = [path for (_, topic), name in names.items() if (path := output.path(topic, name)).exists()]
        if clashes:
            raise FileExistsError(
                f"{len(clashes)} landing files of this run already exist (e.g. {clashes[0]}); "
                "use another --seed or a fresh --home"
            )
    bar = Progress(sink, len(files), "files") if progress is not False else None
    for done, key in enumerate(sorted(files), start=1):
        output.write(key[1], names[key], (line.text for line in files[key]))
        if bar:
            bar.update(done)
    output.flush()
    if bar:
        bar.close()

    run_id = f"{start:%Y%m%dT%H%M%SZ}-{hours:g}h-s{seed}"
    parameters = {
        "start": start.isoformat().replace("+00:00", "Z"),
        "end": end.isoformat().replace("+00:00", "Z"),
        "hours": hours,
        "seed": seed,
        "file_minutes": file_minutes,
        "sink": sink,
        **{key: (str(value) if isinstance(value, timedelta) else value) for key, value in asdict(options).items()},
        "join_window": str(settings.join_window),
    }
    file_counts = dict(sorted(Counter(topic for _, topic in files).items()))
    truth_dir = settings.truth_dir / run_id
    ledger = write_truth(truth_dir, events, lines, settings.join_window, parameters, file_counts,
                         settings.temperature_limit, settings.velocity_limit)
    return GenerationResult(run_id, truth_dir, ledger)


def follow(
    settings: Settings,
    options: TrafficOptions,
    seed: int,
    flush_seconds: float = 1.0,
    duration_seconds: float | None = None,
    stop: threading.Event | None = None,
    sink: str = "landing",
) -> Counter:
    """Keep landing traffic with event time ≈ now until stopped (SIGINT/SIGTERM, ``stop`` or
    ``duration_seconds``). Every ``flush_seconds`` the lines that have arrived are written, one
    file per topic. Returns the counts of lines landed per kind."""
    if flush_seconds <= 0:
        raise ValueError(f"flush seconds must be positive, got {flush_seconds}")
    stop = stop or threading.Event()
    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[signum] = signal.signal(signum, lambda *_: stop.set())
    try:
        return _land_live(open_sink(settings, sink), options, seed, flush_seconds, duration_seconds, stop)
    finally:
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def _land_live(
    output: LandingZone | KafkaSink,
    options: TrafficOptions,
    seed: int,
    flush_seconds: float,
    duration_seconds: float | None,
    stop: threading.Event,
) -> Counter:
    simulator = Simulator(options, seed)
    pending: list[tuple[datetime, int, Line]] = []
    order = itertools.count()
    counts: Counter = Counter()
    simulated_until = datetime.now(timezone.utc)
    deadline = time.monotonic() + duration_seconds if duration_seconds else None
    while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
        now = datetime.now(timezone.utc)
        while simulated_until < now + FOLLOW_CHUNK:
            chunk_end = simulated_until + FOLLOW_CHUNK
            # Traffic goes on after every chunk, so any event may be made late.
            _, lines = simulator.lines(simulated_until, chunk_end, horizon=datetime.max.replace(tzinfo=timezone.utc))
            for line in lines:
                heapq.heappush(pending, (line.arrival, next(order), line))
            simulated_until = chunk_end
        due: dict[str, list[Line]] = defaultdict(list)
        while pending and pending[0][0] <= now:
            line = heapq.heappop(pending)[2]
            due[line.topic].append(line)
            counts[line.kind.split(":")[0]] += 1
        for topic, lines in sorted(due.items()):
            output.write(topic, f"{now:%Y%m%dT%H%M%S%fZ}-s{seed}-live", (line.text for line in lines))
        output.flush()
        stop.wait(flush_seconds)
    return counts


__all__ = ["SINKS", "GenerationResult", "TrafficOptions", "follow", "generate", "open_sink"]
