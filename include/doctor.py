"""What a crash can leave behind in a lake, found and put right: ``lambdalake doctor [--repair]``.

Spark's checkpoint logs, Delta's logs and the feed files are written whole and renamed into place,
so a crash leaves temporary files, never a torn log, on a file system that renames atomically. A
torn or empty log file means a full disk, a copy taken of a live home, or a file system without
atomic renames. Each finding says what ``--repair`` does about it, or why a person must decide:

- a checkpoint's newest commit record (``commits/N``) torn: removed, so batch N runs again from
  its recorded plan (``offsets/N``) and every table skips what it already holds (the batch's
  transaction id);
- a checkpoint's newest plan (``offsets/N``, or a file source's ``sources/*/N``) torn, batch N not
  run: removed, so the batch is planned again; refused when a table already holds batch N;
- temporary files of writers that died, and empty data files no table version references:
  deleted once older than :data:`ABANDONED_AFTER_SECONDS` (a live writer's are younger); those in
  a checkpoint's logs the stream removes itself when it starts
  (:func:`speed_layer.runner.remove_torn_writes`);
- a landing file changed after the stream read it (a producer renamed it into place before it
  was whole): the lines written later were never read; ``--repair`` lands them as a new file
  (``<name>.rest-<line>.jsonl``), which the stream reads like any other;
- a rerun of a covered day that began hours ago and never published (killed, or failed): the
  day is served from its previous run, read at that run's versions, whose files vacuum deletes a
  week after the rerun replaced them; reported with the command that publishes the day again;
- anything older that is torn, a torn Delta commit (whoever wrote it has moved on, so setting it
  aside would lose its rows), a data file that a table version references but is missing or
  short, a table that does not open: reported for a person (restore the file or the table from a
  backup), never touched.

It reads files only (no Spark), so it runs with the stream stopped or not; repair with the stream
stopped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
from deltalake import DeltaTable

from include import tables
from include.checkpoints import file_source_entries
from include.config import Settings
from include.lakehouse import all_tables

ABANDONED_AFTER_SECONDS = 3600
# A nightly run past this long (the nightly DAG's deadline) has failed, not merely not finished.
RERUN_UNFINISHED_AFTER_SECONDS = 3 * 3600
CHECKPOINT_LOGS = ("offsets", "commits")
LOG_VERSION = re.compile(r"v\d+")
DELTA_COMMIT = re.compile(r"(\d{20})\.json")
DELETE = "deletes it"
LAND_REST = "lands the lines written later as a new file"
REST_FILE = re.compile(r"(?P<stem>.+)\.rest-(?P<start>\d+)\.jsonl")


@dataclass(frozen=True)
class Finding:
    path: Path
    problem: str
    repair: str | None  # DELETE, LAND_REST, or None: a person must decide (``problem`` says how)
    from_line: int = 0  # LAND_REST: the first line (0-based) not read
    command: str | None = None  # a person's finding: the lambdalake command that resolves it, if one does

    def line(self, repaired: bool = False) -> str:
        done = "deleted" if self.repair == DELETE else "landed"
        action = (done if repaired else f"--repair {self.repair}") if self.repair else "not repaired here"
        resolve = f": run `{self.command}`" if self.command else ""
        return f"{self.path}: {self.problem} ({action}{resolve})"


@dataclass(frozen=True)
class Examination:
    findings: list[Finding]
    checkpoints: int
    tables: int


def examine(settings: Settings, now: float | None = None) -> Examination:
    """Every finding in the lake of ``settings``: its checkpoints, Delta tables and feeds."""
    now = time.time() if now is None else now
    findings: list[Finding] = []
    queries = sorted(path for path in settings.checkpoints_dir.glob("*") if path.is_dir())
    names = all_tables(settings.lakehouse_dir) if settings.lakehouse_dir.exists() else []
    for query in queries:
        findings += _checkpoint_findings(query, settings, names, now)
    for name in names:
        findings += _table_findings(settings.lakehouse_dir / name, now)
    findings += _abandoned(settings.lakehouse_dir.glob("_staging/*"), "a dead writer's staged files", now)
    findings += _abandoned(settings.feeds_dir.glob("*/.*.tmp"), "a dead writer's temporary feed file", now)
    findings += _abandoned(settings.landing_dir.glob("*/.*.tmp"), "a landing file never renamed into place", now)
    findings += _landing_findings(settings, queries)
    findings += _unpublished_reruns(settings, now)
    return Examination(findings, len(queries), len(names))


def repair(findings: list[Finding]) -> list[Finding]:
    """Carry out the repairs of ``findings``; returns those left for a person."""
    left = []
    for finding in findings:
        path = finding.path
        if finding.repair == DELETE:
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
        elif finding.repair == LAND_REST:
            rest = path.read_bytes().splitlines(keepends=True)[finding.from_line:]
            target = path.with_name(f"{path.stem}.rest-{finding.from_line}.jsonl")
            temporary = target.with_name(f".{target.name}.tmp")
            temporary.write_bytes(b"".join(rest) if rest[-1].endswith(b"\n") else b"".join(rest) + b"\n")
            os.replace(temporary, target)
        else:
            left.append(finding)
    return left


# ---- Spark checkpoints ---------------------------------------------------------------------
def log_file_intact(path: Path) -> bool:
    """Spark's metadata log format: a version line, then one JSON value per line."""
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except (OSError, UnicodeDecodeError):
        return False
    if not lines or not LOG_VERSION.fullmatch(lines[0]):
        return False
    try:
        for line in lines[1:]:
            if line and line != "-":  # "-": a source without an offset yet
                json.loads(line)
    except ValueError:
        return False
    return len(lines) > 1


def torn_checkpoint_logs(checkpoints_dir: Path) -> list[Path]:
    """The torn newest log files of the checkpoints under ``checkpoints_dir``: what makes a query
    fail as it starts (Spark names the file for some and only the JSON error for others)."""
    torn = []
    for query in sorted(path for path in checkpoints_dir.glob("*") if path.is_dir()):
        for log in _logs(query):
            if log and not log_file_intact(newest := log[max(log)]):
                torn.append(newest)
    return torn


def _logs(query: Path) -> list[dict[int, Path]]:
    """A checkpoint's metadata logs by batch: offsets, commits, then each source's."""
    sources = sorted(folder for folder in (query / "sources").glob("*") if folder.is_dir())
    return [_batches(folder) for folder in [*(query / name for name in CHECKPOINT_LOGS), *sources]]


def _batches(folder: Path) -> dict[int, Path]:
    return {int(path.name): path for path in folder.glob("*") if path.name.isdigit()}


def _checkpoint_findings(query: Path, settings: Settings, tables: list[str], now: float) -> list[Finding]:
    findings = []
    offsets, commits, *sources = _logs(query)
    planned = max((n for n, path in offsets.items() if log_file_intact(path)), default=-1)
    for log in (offsets, commits, *sources):
        newest = max(log, default=None)
        for batch, path in sorted(log.items()):
            if log_file_intact(path):
                continue
            findings.append(_torn_log_file(query, path, batch, batch == newest, planned, commits, settings, tables))
    return findings


def _torn_log_file(query: Path, path: Path, batch: int, newest: bool, planned: int, commits: dict[int, Path],
                   settings: Settings, tables: list[str]) -> Finding:
    if not newest:
        return Finding(path, f"torn or empty, and batch {batch} is not the newest: restore the checkpoint "
                             f"{query} from a backup", None)
    if path.parent.name == "commits":
        if batch == planned:
            return Finding(path, f"batch {batch}'s commit record is torn or empty; without it the batch runs "
                                 "again from its plan and every table skips what it already holds", DELETE)
        return Finding(path, f"batch {batch}'s commit record is torn and its plan is missing or torn: restore "
                             f"the checkpoint {query} from a backup", None)
    if batch in commits or (path.parent.parent.name == "sources" and batch <= planned):
        return Finding(path, f"batch {batch}'s plan is torn but the batch was planned or committed: restore the "
                             f"checkpoint {query} from a backup", None)
    holders = [name for name in tables if _txn_version(settings.lakehouse_dir / name, query.name) >= batch]
    if holders:
        return Finding(path, f"batch {batch}'s plan is torn but {', '.join(holders[:3])} already hold the batch: "
                             f"restore the checkpoint {query} from a backup", None)
    return Finding(path, f"batch {batch}'s plan is torn or empty and the batch never ran; without it the "
                         "batch is planned again", DELETE)


def _txn_version(table: Path, app_id: str) -> int:
    try:
        version = DeltaTable(str(table)).transaction_version(app_id)
    except Exception:  # noqa: BLE001 - an unreadable table is a finding of its own
        return -1
    return -1 if version is None else version


# ---- the landing zone ----------------------------------------------------------------------
def _landing_findings(settings: Settings, queries: list[Path]) -> list[Finding]:
    """Landing files modified since a query listed them: lines written after the read were not
    read (Spark's file source reads a file once). What was read is what Bronze holds of it."""
    listed: dict[Path, int] = {}
    for query in queries:
        for path, (_, modified_ms) in file_source_entries(query).items():
            if path.is_relative_to(settings.landing_dir):
                listed[path] = min(modified_ms, listed.get(path, modified_ms))
    findings = []
    for path, modified_ms in sorted(listed.items()):
        if not path.exists() or int(path.stat().st_mtime * 1000) <= modified_ms:
            continue
        lines = path.read_bytes().splitlines()
        start = _lines_landed(settings, path, lines)
        if start < len(lines):
            findings.append(Finding(path, f"changed after the stream read it: lines {start + 1}-{len(lines)} were "
                                          "written later and not read (write a landing file whole, then rename it "
                                          "into place)", LAND_REST, start))
    return findings


def _lines_landed(settings: Settings, path: Path, lines: list[bytes]) -> int:
    """How many of the file's first lines the stream has: Bronze's lines from it (the last one
    not counted if Bronze holds it cut short), or what an earlier repair landed after them."""
    rests = [int(m.group("start")) + len(p.read_bytes().splitlines()) for p in path.parent.glob(f"{path.stem}.rest-*")
             if (m := REST_FILE.fullmatch(p.name)) and m.group("stem") == path.stem]
    bronze = settings.lakehouse_dir / "bronze" / path.parent.name
    held: list[bytes] = []
    if DeltaTable.is_deltatable(str(bronze)):
        sources = [f"file:{path}", f"file://{path}", f"file:{quote(str(path))}", f"file://{quote(str(path))}"]
        held = DeltaTable(str(bronze)).to_pyarrow_table(columns=["value"], filters=[("source", "in", sources)]) \
            .column("value").to_pylist()
    read = len(held)
    if read and read <= len(lines) and lines[read - 1] not in set(held):
        read -= 1  # the last line was read before it was whole: it goes again, whole
    return max([read, *rests])


# ---- the nightly runs -------------------------------------------------------------------------
def _unpublished_reruns(settings: Settings, now: float) -> list[Finding]:
    """Covered days whose rerun began long ago and never published (include/coverage.py)."""
    path = settings.lakehouse_dir / tables.BATCH_COVERAGE
    if not DeltaTable.is_deltatable(str(path)):
        return []
    coverage = DeltaTable(str(path))
    if "rerun_started_at" not in pa.schema(coverage.schema().to_arrow()).names:
        return []
    rows = pa.table(coverage.to_pyarrow_table(columns=["date", "run_id", "rerun_started_at"])).to_pylist()
    return [Finding(path, f"a rerun of {row['date']} began at {row['rerun_started_at']:%Y-%m-%d %H:%M}Z and never "
                          f"published: the day is served from its previous run ({row['run_id']}), whose files of "
                          "the day vacuum deletes a week after the rerun replaced them; run the day's batch again",
                    None, command=f"lambdalake batch --home {settings.home} --date {row['date']}")
            for row in sorted(rows, key=lambda row: row["date"])
            if row["rerun_started_at"] is not None
            and now - row["rerun_started_at"].timestamp() > RERUN_UNFINISHED_AFTER_SECONDS]


# ---- Delta tables ---------------------------------------------------------------------------
def _table_findings(table: Path, now: float) -> list[Finding]:
    log_dir = table / "_delta_log"
    findings = _abandoned((p for p in log_dir.glob("*") if p.name.endswith(".tmp")),
                          "a dead writer's uncommitted commit file", now)
    commits = sorted((int(m.group(1)), path) for path in log_dir.glob("*.json")
                     if (m := DELTA_COMMIT.fullmatch(path.name)))
    torn = [(version, path) for version, path in commits if not _commit_intact(path)]
    for version, path in torn:
        findings.append(Finding(path, f"version {version} is a torn commit: restore the table from a backup", None))
    if torn:
        return findings
    try:
        snapshot = DeltaTable(str(table))
        actions = pa.table(snapshot.get_add_actions(flatten=True)).select(["path", "size_bytes"]).to_pydict()
    except Exception as error:  # noqa: BLE001 - delta-rs' errors have no common base
        return [*findings, Finding(table, f"the table does not open: {str(error).splitlines()[0]}; restore it "
                                          "from a backup", None)]
    referenced = set()
    for relative, size in zip(actions["path"], actions["size_bytes"], strict=True):
        file = table / unquote(relative)
        referenced.add(file)
        actual = file.stat().st_size if file.exists() else None
        if actual != size:
            state = "missing" if actual is None else f"{actual} of {size} bytes"
            findings.append(Finding(file, f"version {snapshot.version()} references this data file, which is "
                                          f"{state}: restore it from a backup", None))
    empty = (path for path in table.rglob("*.parquet")
             if path not in referenced and "_delta_log" not in path.parts and path.stat().st_size == 0)
    return findings + _abandoned(empty, "an empty data file no version references", now)


def _commit_intact(path: Path) -> bool:
    try:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return bool(lines) and all(isinstance(json.loads(line), dict) for line in lines)
    except (OSError, ValueError):
        return False


def _abandoned(paths: Iterable[Path], what: str, now: float) -> list[Finding]:
    return [Finding(path, what, DELETE) for path in paths
            if now - path.stat().st_mtime > ABANDONED_AFTER_SECONDS]


__all__ = ["ABANDONED_AFTER_SECONDS", "RERUN_UNFINISHED_AFTER_SECONDS", "Examination", "Finding", "examine",
           "log_file_intact", "repair", "torn_checkpoint_logs"]
