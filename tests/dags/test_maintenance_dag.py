"""lakehouse_maintenance looks at what a crash or a producer left (doctor's examination), through
a real DAG run (`dag.test()`) on a streamed lake: a landing file that grew after the stream read
it, the stream's newest commit record torn (both repairable) and an older plan torn (a person's).
Off by default it only alerts, with the command to run; with LAMBDALAKE_MAINTENANCE_REPAIRS it
repairs the first two and still alerts the third."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from deltalake import DeltaTable

from include import tables

PROJECT = Path(__file__).resolve().parents[2]
GROWN = {"order_id": "o-grown-after-read", "user_id": "U0001", "product_id": "P0001", "category": "books",
         "amount": 12.5, "event_time": "2026-11-20T02:30:00Z"}


def batch_number(path: Path) -> int:
    return int(path.name)


@pytest.fixture
def troubled_lake(streamed_lake, tmp_path, monkeypatch, airflow_db):
    """The streamed day (its copied checkpoint names the copy's landing files), then left in
    trouble."""
    settings = streamed_lake.copy_to(tmp_path / "home")
    for key in list(os.environ):
        if key.startswith("LAMBDALAKE_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("LAMBDALAKE_HOME", str(settings.home))
    # A producer that renamed its file into place before it was whole, and wrote on.
    grown = max(settings.landing_topic_dir("orders").glob("*.jsonl"))
    with grown.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(GROWN) + "\n")
    ingest = settings.checkpoints_dir / "speed_ingest"
    commits = sorted((p for p in (ingest / "commits").iterdir() if p.name.isdigit()), key=batch_number)
    commits[-1].write_text('v1\n{"nextBatchW')  # the newest commit record torn: repairable
    offsets = sorted((p for p in (ingest / "offsets").iterdir() if p.name.isdigit()), key=batch_number)
    offsets[0].write_text('v1\n{"batchWate')  # an older plan torn: a person must restore it
    return settings, grown, commits[-1], offsets[0]


def maintenance_run():
    return DagBag(dag_folder=str(PROJECT / "dags")).dags["lakehouse_maintenance"].test()


def maintenance_alerts(settings) -> list[dict]:
    rows = DeltaTable(str(settings.lakehouse_dir / tables.ALERTS)).to_pyarrow_table().to_pylist()
    return sorted((row for row in rows if row["source"] == "lakehouse_maintenance"), key=lambda row: row["message"])


@pytest.mark.slow
def test_maintenance_alerts_what_doctor_finds_and_repairs_it_only_when_the_setting_says_so(troubled_lake,
                                                                                           monkeypatch):
    settings, grown, torn_commit, torn_plan = troubled_lake
    assert maintenance_run().state == "success"
    alerts = maintenance_alerts(settings)
    by_path = {json.loads(alert["details"])["path"]: alert for alert in alerts}
    assert set(by_path) == {str(grown), str(torn_commit), str(torn_plan)}, [a["message"] for a in alerts]
    for path in (grown, torn_commit):  # repairable: a person decides, with this command
        alert = by_path[str(path)]
        command = json.loads(alert["details"])["command"]
        assert alert["severity"] == "warning" and command == f"lambdalake doctor --home {settings.home} --repair"
        assert command in alert["message"]
    assert "changed after the stream read it" in by_path[str(grown)]["message"]
    person = by_path[str(torn_plan)]
    assert person["severity"] == "error" and "restore the checkpoint" in person["message"]
    # Nothing changed: the torn files as they were, no rest of the grown file landed.
    assert torn_commit.read_text() == 'v1\n{"nextBatchW' and torn_plan.read_text() == 'v1\n{"batchWate'
    assert not list(grown.parent.glob(f"{grown.stem}.rest-*"))

    monkeypatch.setenv("LAMBDALAKE_MAINTENANCE_REPAIRS", "true")
    assert maintenance_run().state == "success"
    assert not torn_commit.exists()
    (rest,) = grown.parent.glob(f"{grown.stem}.rest-*.jsonl")
    assert json.loads(rest.read_text().splitlines()[-1]) == GROWN
    again = [alert for alert in maintenance_alerts(settings) if alert not in alerts]
    assert [json.loads(alert["details"])["path"] for alert in again] == [str(torn_plan)]  # a person's, still
    assert torn_plan.read_text() == 'v1\n{"batchWate'
