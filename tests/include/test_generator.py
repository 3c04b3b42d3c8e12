"""The generator, checked by recounting the landed files independently of its own bookkeeping."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from include.generator import TrafficOptions, follow, generate

START = datetime(2026, 11, 20, tzinfo=timezone.utc)
TOPICS = {"clicks", "orders", "payments", "customers_cdc", "sensors"}
REQUIRED = {
    "clicks": {"event_id": str, "user_id": str, "session_id": str, "page_url": str, "action": str, "device_type": str,
               "event_time": "time"},
    "orders": {"order_id": str, "user_id": str, "product_id": str, "category": str, "amount": (int, float),
               "event_time": "time"},
    "payments": {"payment_id": str, "order_id": str, "amount": (int, float), "method": str, "event_time": "time"},
    "customers_cdc": {"op": str, "ts_ms": int},
    "sensors": {"device_id": str, "temperature": (int, float), "humidity": (int, float), "event_time": "time"},
}


def parse_time(text):
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        raise ValueError(text)
    return moment.astimezone(timezone.utc)


def event_id(topic, record):
    if topic == "customers_cdc":
        row = record["after"] or record["before"]
        return f"{row['customer_id']}|{record['ts_ms']}"
    if topic == "sensors":
        moment = parse_time(record["event_time"])
        return f"{record['device_id']}|{moment:%Y-%m-%dT%H:%M:%S.}{moment.microsecond // 1000:03d}Z"
    return record[next(iter(REQUIRED[topic]))]


def valid_record(topic, line):
    """The record if the line is a valid event, else None (an independent validator)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    for field, kind in REQUIRED[topic].items():
        if field not in record:
            return None
        if kind == "time":
            try:
                record["_time"] = parse_time(record[field])
            except (ValueError, TypeError):
                return None
        elif not isinstance(record[field], kind) or isinstance(record[field], bool):
            return None
    if topic == "customers_cdc":
        record["_time"] = datetime.fromtimestamp(record["ts_ms"] / 1000, timezone.utc)
    return record


def recount(home: Path, watermark: timedelta) -> tuple[dict, dict]:
    """Per topic: lines, valid, duplicate, corrupt, late; plus the unique valid records."""
    counts: dict[str, Counter] = defaultdict(Counter)
    records: dict[str, dict] = defaultdict(dict)
    for path in sorted((home / "landing").glob("*/*.jsonl")):
        topic = path.parent.name
        # File names carry the start of their arrival window.
        arrived_from = datetime.strptime(path.name.split("-")[0], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
        for line in path.read_text(encoding="utf-8").splitlines():
            counts[topic]["lines"] += 1
            record = valid_record(topic, line)
            if record is None:
                counts[topic]["corrupt"] += 1
                continue
            key = event_id(topic, record)
            if key in records[topic]:
                counts[topic]["duplicate"] += 1
                continue
            counts[topic]["valid"] += 1
            records[topic][key] = record
            if record["_time"] < arrived_from - watermark:
                counts[topic]["late"] += 1
    return counts, records


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    from include.config import load_settings

    settings = load_settings(home=tmp_path_factory.mktemp("gen") / "home")
    options = TrafficOptions(late_fraction=0.05, duplicate_fraction=0.03, corrupt_fraction=0.02)
    result = generate(settings, START, 6, options, seed=11, progress=False)
    return settings, result


def test_every_topic_lands_files_in_arrival_order(generated):
    settings, result = generated
    assert {p.name for p in settings.landing_dir.iterdir()} == TOPICS
    assert set(result.ledger["topics"]) == TOPICS
    for topic in TOPICS:
        files = sorted((settings.landing_dir / topic).glob("*.jsonl"))
        assert files, topic
        mtimes = [f.stat().st_mtime_ns for f in files]
        assert mtimes == sorted(mtimes) and len(set(mtimes)) == len(mtimes)  # read in name order
    assert not list(settings.landing_dir.glob("*/.*"))  # no temporary files left


def test_ledger_matches_an_independent_recount(generated):
    settings, result = generated
    counts, _ = recount(settings.home, settings.watermark_delay)
    for topic, ledger in result.ledger["topics"].items():
        for key in ("lines", "valid", "duplicate", "corrupt", "late"):
            assert ledger[key] == counts[topic][key], (topic, key)
        assert sum(ledger["corrupt_by_kind"].values()) == ledger["corrupt"]


def test_fractions_are_honoured(generated):
    settings, result = generated
    counts, records = recount(settings.home, settings.watermark_delay)
    valid = sum(c["valid"] for c in counts.values())
    late = sum(c["late"] for c in counts.values())
    # Late events are drawn only from events followed by an hour of traffic.
    end = START + timedelta(hours=6)
    eligible = sum(1 for topic in records for r in records[topic].values() if r["_time"] < end - timedelta(hours=1))
    assert late / eligible == pytest.approx(0.05, rel=0.2)
    assert sum(c["duplicate"] for c in counts.values()) / (valid - late) == pytest.approx(0.03, rel=0.2)
    assert sum(c["corrupt"] for c in counts.values()) / valid == pytest.approx(0.02, rel=0.2)
    kinds = Counter()
    for ledger in result.ledger["topics"].values():
        kinds.update(ledger["corrupt_by_kind"])
    assert set(kinds) == {"invalid_json", "missing_field", "wrong_type", "bad_timestamp"}


def test_realistic_traffic_shape(generated):
    settings, _ = generated
    _, records = recount(settings.home, settings.watermark_delay)
    orders, payments = records["orders"], records["payments"]
    assert len(orders) == pytest.approx(6 * 200, rel=0.15)
    delays = sorted((p["_time"] - orders[p["order_id"]]["_time"]).total_seconds() / 60 for p in payments.values())
    assert delays[len(delays) // 2] < 10  # most pay within minutes
    assert any(12 < d < 60 for d in delays) and any(d > 60 for d in delays)
    assert len(payments) < len(orders)  # some never pay
    assert {r["op"] for r in records["customers_cdc"].values()} == {"r", "c", "u", "d"}
    temperatures = [r["temperature"] for r in records["sensors"].values()]
    assert max(temperatures) > 40 > sorted(temperatures)[len(temperatures) // 2]  # spikes exist
    actions = Counter(r["action"] for r in records["clicks"].values())
    assert set(actions) == {"view", "click", "add_to_cart"}


def test_truth_views_match_an_independent_computation(generated):
    settings, result = generated
    _, records = recount(settings.home, settings.watermark_delay)
    revenue: dict = defaultdict(float)
    for order in records["orders"].values():
        t = order["_time"]
        window = t.replace(minute=t.minute - t.minute % 5, second=0, microsecond=0)
        revenue[(window.strftime("%Y-%m-%dT%H:%M:%S.000Z"), order["category"])] += order["amount"]
    with (result.truth_dir / "revenue_by_category_5m.csv").open() as handle:
        truth = {(row["window_start"], row["category"]): float(row["revenue"]) for row in csv.DictReader(handle)}
    assert truth.keys() == revenue.keys()
    assert all(truth[key] == pytest.approx(value, abs=0.005) for key, value in revenue.items())

    paid = set()
    for payment in records["payments"].values():
        order = records["orders"].get(payment["order_id"])
        if order and order["_time"] <= payment["_time"] <= order["_time"] + settings.join_window:
            paid.add(payment["order_id"])
    with (result.truth_dir / "order_payments.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert {r["order_id"] for r in rows if r["status"] == "paid"} == paid
    assert len(rows) == len(records["orders"])
    late_paid = sum(r["late_paid"] == "True" for r in rows)
    assert late_paid == result.ledger["order_payments"]["late_paid"] > 0


def test_same_seed_same_files_and_no_overwrite(tmp_path):
    from include.config import load_settings

    def landed(home, seed):
        settings = load_settings(home=tmp_path / home)
        generate(settings, START, 1, TrafficOptions(), seed=seed, progress=False)
        return {str(p.relative_to(settings.landing_dir)): p.read_bytes()
                for p in settings.landing_dir.glob("*/*.jsonl")}

    first = landed("a", 5)
    assert landed("b", 5) == first
    assert landed("c", 6) != first
    settings = load_settings(home=tmp_path / "a")
    with pytest.raises(FileExistsError, match="already exist"):
        generate(settings, START, 1, TrafficOptions(), seed=5, progress=False)
    assert {str(p.relative_to(settings.landing_dir)): p.read_bytes()
            for p in settings.landing_dir.glob("*/*.jsonl")} == first


def test_follow_lands_live_traffic(tmp_path):
    from include.config import load_settings

    settings = load_settings(home=tmp_path / "home")
    before = datetime.now(timezone.utc)
    counts = follow(settings, TrafficOptions(orders_per_hour=20000, customers=50), seed=1,
                    flush_seconds=0.5, duration_seconds=3)
    assert counts["valid"] > 0
    times = []
    for path in settings.landing_dir.glob("*/*.jsonl"):
        for line in path.read_text().splitlines():
            record = valid_record(path.parent.name, line)
            if record:
                times.append(record["_time"])
    assert times and all(before - timedelta(minutes=1) <= t <= datetime.now(timezone.utc) for t in times)


def test_cli_generate_and_one_line_errors(tmp_path):
    lambdalake = Path(sys.executable).parent / "lambdalake"
    ok = subprocess.run(
        [lambdalake, "generate", "--home", tmp_path / "x", "--start", "2026-11-20T00:00:00Z", "--hours", "1",
         "--seed", "7", "--format", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(ok.stdout)
    assert {row["topic"] for row in rows} == TOPICS
    assert (tmp_path / "x" / "truth" / "20261120T000000Z-1h-s7" / "ledger.json").exists()
    for bad in (["--late-fraction", "2"], ["--start", "noon"], ["--hours", "-1"]):
        failed = subprocess.run([lambdalake, "generate", "--home", tmp_path / "y", *bad],
                                capture_output=True, text=True)
        assert failed.returncode == 2
        assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
    assert not (tmp_path / "y" / "landing").exists()
