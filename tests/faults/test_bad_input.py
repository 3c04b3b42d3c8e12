"""Input the parser's own checks do not spell out: NUL bytes, a file that is not UTF-8 at all, an
empty file, a line of 50 MB, a file renamed into place before it was whole. Every line reaches
Bronze byte for byte, every bad one the DLQ with its reason, and the good lines beside them
Silver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from include import tables
from include.config import load_settings
from speed_layer.runner import run_stream

pytestmark = pytest.mark.slow
HUGE = 50 * 1024 * 1024
LAMBDALAKE = Path(sys.executable).parent / "lambdalake"


def doctor(settings, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([LAMBDALAKE, "doctor", "--home", settings.home, *options],
                          capture_output=True, text=True, timeout=120)


def land(settings, topic: str, name: str, content: bytes) -> None:
    """A landing file as an odd producer might write it (still whole, then renamed into place)."""
    folder = settings.landing_dir / topic
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f".{name}.tmp").write_bytes(content)
    os.replace(folder / f".{name}.tmp", folder / f"{name}.jsonl")


def click(event_id: str, page: str = "/home") -> dict:
    return {"event_id": event_id, "user_id": "u1", "session_id": "s1", "page_url": page, "action": "view",
            "device_type": "mobile", "event_time": "2026-11-20T10:00:00Z"}


def test_odd_bytes_go_to_the_dlq_with_reasons_and_disturb_nothing(spark, tmp_path):
    settings = load_settings(home=tmp_path / "home", spark_master="local[2]", shuffle_partitions=2,
                             speed_views="revenue_by_category_5m")
    good = json.dumps(click("c-good")).encode()
    land(settings, "clicks", "nul", b"\n".join([
        good,
        json.dumps(click("c-nul-inside", page="/a\x00b")).encode().replace(b"\\u0000", b"\x00"),  # raw NUL in a string
        b"\x00" + json.dumps(click("c-nul-before")).encode(),
    ]) + b"\n")
    land(settings, "clicks", "latin1", json.dumps(click("c-latin1", page="/café"), ensure_ascii=False)
         .encode("latin-1") + b"\n")
    not_text = bytes(b for b in range(256) if b not in b"\r\n")  # one line, no UTF-8
    land(settings, "clicks", "binary", not_text * 4 + b"\n")
    land(settings, "orders", "empty", b"")
    huge = {"order_id": "o-huge", "user_id": "u1", "product_id": "p" * HUGE, "category": "books", "amount": 1.0,
            "event_time": "2026-11-20T10:00:00Z"}
    land(settings, "orders", "huge", json.dumps(huge).encode() + b"\n")

    store = run_stream(settings, available_now=True)

    bronze = store.read(tables.bronze("clicks")).count()
    assert bronze == 3 + 1 + 1 and store.read(tables.bronze("orders")).count() == 1
    assert [r["event_id"] for r in store.read(tables.silver("clicks")).collect()] == ["c-good"]
    assert not store.exists(tables.silver("orders")) or store.read(tables.silver("orders")).count() == 0
    dlq = sorted((r["topic"], r["reason"], len(r["raw"])) for r in store.read(tables.DLQ).collect())
    reasons = [(topic, reason) for topic, reason, _ in dlq]
    assert reasons.count(("clicks", "invalid JSON")) == 2  # a raw NUL is a control character in JSON
    assert reasons.count(("clicks", "invalid UTF-8")) == 2  # the Latin-1 line, the binary one
    (huge_row,) = [row for row in dlq if row[0] == "orders"]
    assert huge_row[1].startswith("line too long: ") and huge_row[2] < 10_000  # the DLQ keeps its head only


def test_a_line_over_a_lowered_limit_goes_to_the_dlq(spark, tmp_path):
    """LAMBDALAKE_MAX_LINE_BYTES below the default reaches the parser: a line valid under the
    default but over the limit is rejected, and its reason names the limit."""
    settings = load_settings(home=tmp_path / "home", spark_master="local[2]", shuffle_partitions=2,
                             speed_views="revenue_by_category_5m", max_line_bytes=512)
    long_line = json.dumps(click("c-long", page="/" + "p" * 600)).encode()
    land(settings, "clicks", "limit", b"\n".join([json.dumps(click("c-short")).encode(), long_line]) + b"\n")

    store = run_stream(settings, available_now=True)

    assert [r["event_id"] for r in store.read(tables.silver("clicks")).collect()] == ["c-short"]
    assert [(r["reason"], r["raw"]) for r in store.read(tables.DLQ).collect()] == [
        (f"line too long: {len(long_line)} bytes (limit 512)", long_line.decode())]


def test_a_file_renamed_in_while_still_growing_is_found_and_its_rest_landed_once(spark, tmp_path):
    settings = load_settings(home=tmp_path / "home", spark_master="local[2]", shuffle_partitions=2,
                             speed_views="revenue_by_category_5m")
    lines = [json.dumps(click(f"c-{number}")).encode() for number in range(5)]
    growing = settings.landing_dir / "clicks" / "growing.jsonl"
    growing.parent.mkdir(parents=True)
    # Renamed into place too early: three lines and half of the fourth are there when the stream reads it.
    growing.write_bytes(b"\n".join(lines[:3]) + b"\n" + lines[3][:20])
    run_stream(settings, available_now=True)
    with growing.open("ab") as producer:  # ... and its producer goes on writing
        producer.write(lines[3][20:] + b"\n" + lines[4] + b"\n")

    found = doctor(settings)
    assert f"{growing}: changed after the stream read it: lines 4-5 were written later and not read" in found.stdout
    assert "--repair lands the lines written later as a new file" in found.stdout
    assert "landed" in doctor(settings, "--repair").stdout
    assert doctor(settings).stdout == ""  # found once, landed once

    store = run_stream(settings, available_now=True)
    assert sorted(r["event_id"] for r in store.read(tables.silver("clicks")).collect()) == \
        [f"c-{number}" for number in range(5)]
    assert [(r["reason"], r["raw"]) for r in store.read(tables.DLQ).collect()] == \
        [("invalid JSON", lines[3][:20].decode())]  # the half line read first
    assert store.read(tables.bronze("clicks")).count() == 4 + 2
