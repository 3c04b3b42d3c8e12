"""Faults survived, shown: each fault case as a user meets it, with what was injected and checked.

    .venv/bin/python benchmarks/faults.py [--kills 20] [--seed 44] [--burst-lines 1000000]
        [--cases kills,burst,tests] [--report benchmarks/results/faults.md]

1. **kill -9 under concurrency** (``tests/faults/chaos.py``, which the test runs with 2 kills):
   the stream's process group killed ``--kills`` times (past a committed micro-batch, inside a
   planned one, in its start-up, in turn, after seeded random delays), while
   ``lambdalake batch`` of an earlier day and ``lambdalake maintain`` run beside it and are killed
   too; vacuum without retention while the stream lies killed mid-batch; then the stream and both
   days' batches run to the end. Checked: every line once, the speed views and alerts once, day one's batch rerun
   identical, the served views equal to the generator's truth, no referenced file missing.
2. **Bad input at volume**: a burst of ``--burst-lines`` lines landed at once, clean, and with 1%
   corrupt in the generator's ways plus odd lines for each of the parser's other reasons (not an
   object, invalid UTF-8, NUL bytes, a CDC delete without its row) and odd files (not UTF-8 at
   all, empty, one line of 50 MB). Each burst is streamed by ``lambdalake stream --available-now``
   (one view, so the figure is ingest's) in its own process on a copy of its landing zone, clean
   and corrupt alternately, twice. Throughput = lines / the ingest query's summed micro-batch
   durations (``ops/stream_metrics``), and / the process's wall time. Checked: every line in
   Bronze, each bad one in the DLQ with its reason, Silver as the ledger says.
3. **The fault tests** (hung stream under the supervisor DAG, full disk, torn files, odd input),
   run here by pytest: their outcome and time.

Writes a Markdown report (default ``benchmarks/results/faults.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "faults")]

from chaos import DAY_ONE, Chaos, batch_rows  # noqa: E402

from include import tables  # noqa: E402
from include.config import load_settings  # noqa: E402
from include.generator import TrafficOptions, generate  # noqa: E402
from include.lakehouse import open_store  # noqa: E402
from include.schemas import TOPIC_NAMES  # noqa: E402

LAMBDALAKE = str(Path(sys.executable).parent / "lambdalake")
FAULT_TESTS = [
    "tests/speed_layer/test_supervisor.py",
    "tests/faults/test_torn_files.py",
    "tests/faults/test_bad_input.py",
    "tests/faults/test_full_disk.py",
]
HUGE_LINE = 50 * 1024 * 1024


# ---- 1. kill -9 under concurrency ----------------------------------------------------------
def kills_case(work: Path, kills: int, seed: int) -> dict:
    from include.spark import get_spark

    started = time.monotonic()
    chaos = Chaos(work / "kills" / "home", kills=kills, seed=seed)
    generated = chaos.prepare()
    day_one = batch_rows(chaos.settings, DAY_ONE)
    chaos.run_all()
    store = open_store(chaos.settings, get_spark(chaos.settings))
    try:
        chaos.verify(store, generated, day_one)
        verdict = "passed"
    except AssertionError as error:
        verdict = f"FAILED: {error}"
    return {"verdict": verdict, "seconds": time.monotonic() - started, "log": chaos.log,
            "side_runs": chaos.side_runs, "lines": sum(t["lines"] for t in generated.ledger["topics"].values())}


# ---- 2. bad input at volume ---------------------------------------------------------------------
def odd_lines(count: int) -> dict[str, list[bytes]]:
    """``count`` lines per odd kind the generator does not make, by topic."""
    click = {"event_id": "odd", "user_id": "u1", "session_id": "s1", "page_url": "/home", "action": "view",
             "device_type": "mobile", "event_time": "2026-11-20T10:00:00Z"}
    lines: dict[str, list[bytes]] = {"clicks": [], "customers_cdc": []}
    for number in range(count):
        lines["clicks"] += [
            b'["not", "an", "object"]',
            json.dumps({**click, "event_id": f"odd-latin1-{number}", "page_url": "/caf\u00e9"},
                       ensure_ascii=False).encode("latin-1"),
            b"\x00" + json.dumps({**click, "event_id": f"odd-nul-{number}"}).encode(),
        ]
        lines["customers_cdc"].append(json.dumps({"op": "d", "ts_ms": 1795000000000 + number, "before": None,
                                                  "after": None}).encode())
    return lines


def land_bytes(folder: Path, name: str, content: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{name}.tmp").write_bytes(content)
    os.replace(folder / f".{name}.tmp", folder / f"{name}.jsonl")


def make_burst(home: Path, lines: int, corrupt: bool, seed: int) -> dict:
    """A landing zone with about ``lines`` lines; returns the expected counts."""
    settings = load_settings(home=home)
    hours = 3
    orders = lines / hours / 22  # about 22 lines per order with its clicks, payments and sensors
    options = TrafficOptions(orders_per_hour=orders, devices=100, customers=20_000,
                             corrupt_fraction=0.01 if corrupt else 0.0)
    ledger = generate(settings, datetime(2026, 11, 20, tzinfo=timezone.utc), hours, options, seed=seed,
                      file_minutes=5, progress=False).ledger
    expected = {"bronze": {t: ledger["topics"][t]["lines"] for t in TOPIC_NAMES},
                "dlq": sum(t["corrupt"] for t in ledger["topics"].values()),
                "silver": {t: ledger["topics"][t]["valid"] for t in TOPIC_NAMES}}
    if corrupt:
        odd = odd_lines(max(1, lines // 10_000))
        for topic, batch in odd.items():
            land_bytes(settings.landing_dir / topic, "odd-lines", b"\n".join(batch) + b"\n")
            expected["bronze"][topic] += len(batch)
            expected["dlq"] += len(batch)
        land_bytes(settings.landing_dir / "clicks", "odd-binary", bytes(range(14, 256)) * 4 + b"\n")
        land_bytes(settings.landing_dir / "orders", "odd-empty", b"")
        land_bytes(settings.landing_dir / "orders", "odd-huge", b'{"order_id": "' + b"x" * HUGE_LINE + b'"}\n')
        expected["bronze"]["clicks"] += 1
        expected["bronze"]["orders"] += 1
        expected["dlq"] += 2
    return expected


def stream_burst(template: Path, home: Path) -> dict:
    shutil.copytree(template / "landing", home / "landing")
    env = {**os.environ, "LAMBDALAKE_SPARK_MASTER": "local[2]", "LAMBDALAKE_SHUFFLE_PARTITIONS": "2"}
    started = time.monotonic()
    done = subprocess.run([LAMBDALAKE, "stream", "--home", str(home), "--available-now",
                           "--views", "revenue_by_category_5m", "--max-files-per-trigger", "12"],
                          env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise RuntimeError(f"the stream exited {done.returncode}: {done.stderr[-2000:]}")
    from deltalake import DeltaTable

    lake = home / "lakehouse"
    metrics = DeltaTable(str(lake / tables.STREAM_METRICS)).to_pyarrow_table().to_pylist()
    busy = sum(row["batch_duration_ms"] for row in metrics if row["query"] == "speed_ingest") / 1000
    counts = {"bronze": {}, "silver": {}}
    for topic in TOPIC_NAMES:
        counts["bronze"][topic] = DeltaTable(str(lake / tables.bronze(topic))).to_pyarrow_table(columns=[]).num_rows
        counts["silver"][topic] = DeltaTable(str(lake / tables.silver(topic))).to_pyarrow_table(columns=[]).num_rows
    dlq = DeltaTable(str(lake / tables.DLQ)).to_pyarrow_table(columns=["reason"]).to_pylist()
    counts["dlq"] = len(dlq)
    counts["reasons"] = Counter(_reason_family(row["reason"]) for row in dlq)
    shutil.rmtree(home)
    return {"wall": wall, "ingest_busy": busy, **counts}


def _reason_family(reason: str | None) -> str:
    if reason is None:
        return "NO REASON"
    for prefix in ("line too long", "missing field", "wrong type", "bad timestamp"):
        if reason.startswith(prefix):
            return prefix
    return reason.split(":")[0].split(" '")[0]


def burst_case(work: Path, lines: int, seed: int) -> dict:
    templates = {kind: work / "burst" / kind for kind in ("clean", "corrupt")}
    expected = {kind: make_burst(path, lines, kind == "corrupt", seed) for kind, path in templates.items()}
    runs: dict[str, list[dict]] = {"clean": [], "corrupt": []}
    for round_number in range(2):
        for kind in ("clean", "corrupt") if round_number == 0 else ("corrupt", "clean"):
            runs[kind].append(stream_burst(templates[kind], work / "burst" / f"run-{kind}-{round_number}"))
    problems = []
    for kind, results in runs.items():
        for result in results:
            for what in ("bronze", "silver", "dlq"):
                if result[what] != expected[kind][what]:
                    problems.append(f"{kind} {what}: {result[what]} != expected {expected[kind][what]}")
            if result["reasons"].get("NO REASON"):
                problems.append(f"{kind}: DLQ rows without a reason")
    return {"expected": expected, "runs": runs, "problems": problems,
            "lines": {kind: sum(e["bronze"].values()) for kind, e in expected.items()}}


# ---- 3. the fault tests ---------------------------------------------------------------------------
def tests_case() -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
                           *[test for test in FAULT_TESTS if (ROOT / test).exists()]],
                          cwd=ROOT, capture_output=True, text=True)
    durations = [line.strip() for line in done.stdout.splitlines() if " call " in line]
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    return {"returncode": done.returncode, "summary": summary, "durations": durations,
            "seconds": time.monotonic() - started}


# ---- the report -----------------------------------------------------------------------------------
SECTIONS = {"kills": "## 1.", "burst": "## 2.", "tests": "## 3."}


def kept_sections(path: Path, results: dict) -> dict[str, str]:
    """The previous report's sections of the cases not run this time (each says when it ran)."""
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    kept = {}
    for case, heading in SECTIONS.items():
        if case not in results and heading in text:
            section = text[text.index(heading):]
            later = [section.find(h, 1) for h in SECTIONS.values() if section.find(h, 1) > 0]
            kept[case] = section[:min(later)] if later else section
    return kept


def report(args: argparse.Namespace, results: dict, kept: dict[str, str]) -> str:
    ran = (f"{datetime.now(timezone.utc):%Y-%m-%d %H:%MZ} on {platform.node()}: {os.cpu_count()} cores, "
           f"Python {platform.python_version()}, `benchmarks/faults.py --kills {args.kills} --seed {args.seed} "
           f"--burst-lines {args.burst_lines} --cases {args.cases}`")
    out = ["# Faults benchmark", "", "Each section says when it ran and with what: the script runs the cases "
           "asked for (`--cases`) and keeps the other sections of the previous report.", ""]
    if "kills" in results:
        kills = results["kills"]
        out += ["## 1. kill -9 under concurrency", "", f"Run {ran}.", "",
                f"**{kills['verdict']}** in {kills['seconds']:.0f} s; {kills['lines']:,} landed lines (ten of "
                "them in a hundred corrupt or duplicated, some late). What was injected:", ""]
        out += [f"- {line}" for line in kills["log"]]
        side = Counter((run["command"], run["outcome"]) for run in kills["side_runs"])
        out += ["", "Beside the stream: " + ", ".join(f"`lambdalake {command}` {outcome} × {n}"
                                                      for (command, outcome), n in sorted(side.items())) + ".",
                "", "Checked after everything ran to the end: every landed line in Bronze once, Bronze = Silver + "
                "DLQ + duplicates per topic; the speed views without a duplicate key, revenue counting every on-time "
                "order once, the customer dimension and its history equal to the truth; every alert raised once and "
                "told to the notifier once; day one's batch views identical to those batched before the first kill; "
                "the served `revenue_by_category_5m`, `order_payments`, `device_health_5m` and `alerts` of both days "
                "equal to the generator's truth; no data file a table's current version references missing; "
                "`lambdalake doctor` with nothing for a person.", ""]
    else:
        out.append(kept.get("kills", ""))
    if "burst" in results:
        burst = results["burst"]
        out += ["## 2. Bad input at volume", "", f"Run {ran}.", "",
                f"Clean burst: {burst['lines']['clean']:,} lines; corrupt burst: {burst['lines']['corrupt']:,} lines, "
                f"{burst['expected']['corrupt']['dlq']:,} of them bad. Each streamed in its own process "
                "(`lambdalake stream --available-now --views revenue_by_category_5m --max-files-per-trigger 12`).",
                "", "| burst | run | ingest busy s | lines/s (ingest) | wall s | lines/s (wall) |",
                "|---|---:|---:|---:|---:|---:|"]
        for kind, runs in burst["runs"].items():
            for number, run in enumerate(runs, start=1):
                lines = burst["lines"][kind]
                out.append(f"| {kind} | {number} | {run['ingest_busy']:.1f} | {lines / run['ingest_busy']:,.0f} | "
                           f"{run['wall']:.1f} | {lines / run['wall']:,.0f} |")
        rate = {kind: sum(burst["lines"][kind] / r["ingest_busy"] for r in runs) / len(runs)
                for kind, runs in burst["runs"].items()}
        wall = {kind: sum(burst["lines"][kind] / r["wall"] for r in runs) / len(runs)
                for kind, runs in burst["runs"].items()}
        out += ["", f"Corrupt / clean throughput: **{rate['corrupt'] / rate['clean']:.2f}** (ingest), "
                f"{wall['corrupt'] / wall['clean']:.2f} (wall); target ≥ 0.80.", "",
                "DLQ reasons of the corrupt burst: " + ", ".join(
                    f"{reason} {n:,}" for reason, n in sorted(burst["runs"]["corrupt"][0]["reasons"].items())) + ".",
                "", "Checks: " + ("every line in Bronze, each bad one in the DLQ with a reason, Silver as the "
                                  "ledger says, in every run." if not burst["problems"]
                                  else "**FAILED**: " + "; ".join(burst["problems"])), ""]
    else:
        out.append(kept.get("burst", ""))
    if "tests" in results:
        tests = results["tests"]
        out += ["## 3. The fault tests", "", f"Run {ran}.", "",
                f"`pytest {' '.join(FAULT_TESTS)}`: **{tests['summary']}** ({tests['seconds']:.0f} s).", ""]
        out += [f"- `{line}`" for line in tests["durations"]]
        out.append("")
    else:
        out.append(kept.get("tests", ""))
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--burst-lines", type=int, default=1_000_000)
    parser.add_argument("--cases", default="kills,burst,tests")
    parser.add_argument("--report", type=Path, default=ROOT / "benchmarks" / "results" / "faults.md")
    args = parser.parse_args()
    cases = args.cases.split(",")
    results = {}
    with tempfile.TemporaryDirectory(prefix="lambdalake-faults-") as folder:
        work = Path(folder)
        if "kills" in cases:
            results["kills"] = kills_case(work, args.kills, args.seed)
            print(results["kills"]["verdict"], flush=True)
        if "burst" in cases:
            results["burst"] = burst_case(work, args.burst_lines, args.seed)
            print(results["burst"]["problems"] or "burst checks passed", flush=True)
    if "tests" in cases:
        results["tests"] = tests_case()
        print(results["tests"]["summary"], flush=True)
    text = report(args, results, kept_sections(args.report, results))
    args.report.write_text(text, encoding="utf-8")
    print(text)
    failed = ("kills" in results and results["kills"]["verdict"] != "passed") or \
        ("burst" in results and results["burst"]["problems"]) or ("tests" in results and results["tests"]["returncode"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
