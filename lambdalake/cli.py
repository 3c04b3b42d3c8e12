"""The ``lambdalake`` command line.

Every command takes ``--home`` (default ``$LAMBDALAKE_HOME``) and exits non-zero with a one-line
error on bad input; commands that print data take ``--format``.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import sys
from collections.abc import Sequence
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from include.config import ConfigError, Settings, load_settings
from include.output import FORMATS, format_rows

# Exit codes: 1 a runtime failure (the stream died, a commit conflict persisted, data quality
# failed), 2 bad input (usage, configuration, a refused query).
RUNTIME_FAILURE, BAD_INPUT = 1, 2
FAILED_CALLBACK = "There was an exception while executing the Python Proxy"  # py4j's log of it


class UsageError(ValueError):
    """Bad command-line input: printed as one line, exit code 2."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line (``--help`` still shows the full usage)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---- argument types -----------------------------------------------------------------------
def parse_instant(text: str) -> datetime:
    """ISO-8601 with 'Z' or an offset (a bare date means its midnight UTC)."""
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), time(), timezone.utc)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO-8601 time like 2026-11-20T00:00:00Z, got '{text}'") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"time needs 'Z' or an offset, got '{text}'")
    return moment.astimezone(timezone.utc)


def parse_fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 0.5, got '{text}'") from None
    if not 0 <= value <= 0.5:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 0.5, got '{text}'")
    return value


def positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got '{text}'")
        return value

    return parse


def port_or_off(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number (0 for none), got '{text}'")
    return int(text)


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lambdalake")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"


# ---- commands -----------------------------------------------------------------------------
def cmd_generate(args: argparse.Namespace, settings: Settings) -> int:
    from include.generator import TrafficOptions, follow, generate

    if args.bootstrap_servers:
        settings = settings.model_copy(update={"kafka_bootstrap_servers": args.bootstrap_servers})
    target = f"Kafka at {settings.kafka_bootstrap_servers}" if args.sink == "kafka" else str(settings.landing_dir)

    options = TrafficOptions(
        orders_per_hour=args.orders_per_hour,
        late_fraction=args.late_fraction,
        duplicate_fraction=args.duplicate_fraction,
        corrupt_fraction=args.corrupt_fraction,
        customers=args.customers,
        devices=args.devices,
        sensor_interval_seconds=args.sensor_interval,
        watermark_delay=settings.watermark_delay,
    )
    if args.follow:
        print(f"landing live traffic into {target} (Ctrl-C to stop)", file=sys.stderr)
        counts = follow(settings, options, args.seed, args.flush_seconds, args.duration, sink=args.sink)
        print(format_rows([{"kind": kind, "lines": n} for kind, n in sorted(counts.items())], args.format))
        return 0
    start = args.start or datetime.combine(
        datetime.now(timezone.utc).date() - timedelta(days=1), time(), timezone.utc
    )
    result = generate(settings, start, args.hours, options, args.seed, args.file_minutes, sink=args.sink)
    rows = [
        {"topic": topic, "files": result.ledger["files"].get(topic, 0),
         **{key: counts[key] for key in ("lines", "valid", "duplicate", "corrupt", "late")}}
        for topic, counts in result.ledger["topics"].items()
    ]
    print(format_rows(rows, args.format))
    if args.format == "table":
        paid = result.ledger["order_payments"]
        print(
            f"\nlanded into {target}; ground truth in {result.truth_dir}\n"
            f"orders: {paid['orders']} ({paid['paid']} paid, {paid['unpaid']} unpaid, "
            f"{paid['late_paid']} paid by a late event the stream will miss)"
        )
    return 0


def cmd_stream(args: argparse.Namespace, settings: Settings) -> int:
    from include.accounting import ingest_totals
    from include.views import speed_trigger_intervals
    from speed_layer.runner import StreamFailed, run_stream

    speed_trigger_intervals(settings)  # an unknown view name is a usage error, before Spark starts
    try:
        store = run_stream(settings, available_now=args.available_now, show_progress=args.available_now)
    except StreamFailed as exc:
        print(f"lambdalake: error: {exc}", file=sys.stderr)
        return RUNTIME_FAILURE
    print(format_rows(ingest_totals(store), args.format))
    return 0


def parse_day(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a date like 2026-11-20, got '{text}'") from None


def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    from batch_layer.nightly import run_batch

    rows = run_batch(settings, args.date, show_progress=True)
    print(format_rows(rows, args.format))
    return 0


def parse_as_of(text: str) -> int | datetime:
    """A Delta version number or an ISO-8601 time."""
    if text.isdigit():
        return int(text)
    try:
        return parse_instant(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected a version number or an ISO-8601 time like 2026-11-21T10:00:00Z, got '{text}'"
        ) from None


def query_text(args: argparse.Namespace) -> str:
    """The SQL of ``lambdalake query``: the argument, or ``-f FILE`` (``-f -``: standard input)."""
    if (args.sql is None) == (args.file is None):
        raise UsageError("give the query as an argument or with -f FILE (- for standard input), not both")
    if args.file is None:
        return args.sql
    if args.file == "-":
        return sys.stdin.read()
    try:
        with open(args.file, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"cannot read the query from {args.file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"the query file {args.file} is not UTF-8 text") from None


def cmd_query(args: argparse.Namespace, settings: Settings) -> int:
    from serving.engine import ServingEngine

    sql = query_text(args)
    engine = ServingEngine(settings, query_timeout=settings.query_timeout.total_seconds(), as_of=args.as_of)
    print(format_rows(engine.rows(sql), args.format))
    return 0


def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    from serving.history import table_history

    print(format_rows(table_history(settings, args.table, args.limit), args.format))
    return 0


def cmd_maintain(args: argparse.Namespace, settings: Settings) -> int:
    from batch_layer.maintenance import checkpoint_hygiene, compact_and_vacuum, record_maintenance

    rows = [{"step": "compact, vacuum", **table} for table in compact_and_vacuum(settings)]
    rows += [{"step": "checkpoint hygiene", "table": kind, "files_added": 0, "files_removed": n, "vacuumed": None}
             for kind, n in checkpoint_hygiene(settings).items()]
    record_maintenance(settings)
    print(format_rows(rows, args.format))
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from include.doctor import examine, repair

    examination = examine(settings)
    findings = examination.findings
    left = repair(findings) if args.repair else findings
    if args.format != "table":
        print(format_rows([{"path": str(f.path), "problem": f.problem, "repair": f.repair,
                            "repaired": f.repair is not None and args.repair} for f in findings], args.format))
    else:
        for finding in findings:
            print(finding.line(repaired=args.repair))
    checked = f"{examination.checkpoints} checkpoints and {examination.tables} tables checked"
    if not findings:
        print(f"ok: {checked}, nothing a crash left behind", file=sys.stderr)
    elif args.repair:
        print(f"repaired {len(findings) - len(left)} of {len(findings)}; {len(left)} need you ({checked})",
              file=sys.stderr)
    else:
        repairable = sum(1 for f in findings if f.repair)
        print(f"{len(findings)} found, {repairable} repairable with --repair (stop the stream first; {checked})",
              file=sys.stderr)
    return RUNTIME_FAILURE if left else 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from serving.http import dashboard_url, serve, serve_token

    token = serve_token(settings)
    pg_port = settings.pg_port if args.pg_port is None else args.pg_port
    base = f"http://{args.host}:{args.port}"
    print(f"Dashboard: {dashboard_url(args.host, args.port, token)}", flush=True)
    print(f"SQL API:   curl -H 'Authorization: Bearer {token}' -d '{{\"sql\": \"SELECT 1\"}}' {base}/api/query",
          flush=True)
    if pg_port:
        print(f"Postgres:  PGPASSWORD={token} psql -h {args.host} -p {pg_port} -U lambdalake lambdalake", flush=True)
    serve(settings, args.host, args.port, token, pg_port)
    return 0


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    from serving.status import status_summary, view_status

    rows = view_status(settings)
    if args.check:
        return check_status(settings, rows)
    print(format_rows(rows, args.format) if args.verbose or args.format != "table" else status_summary(rows))
    return 0


def check_status(settings: Settings, rows: list[dict[str, Any]]) -> int:
    """For monitors: exit 1 with one line why when the stream is absent, dead or stalled, or a
    view's speed side is further behind than ``LAMBDALAKE_FRESHNESS_SLA``; else 0 and ``ok``."""
    from speed_layer.supervisor import diagnose

    now = datetime.now(timezone.utc)
    stream = diagnose(settings, now)
    if stream.state in ("absent", "dead", "stalled"):
        print(f"stream {stream.state}: {stream.reason}")
        return RUNTIME_FAILURE
    late = [(row["view"], now - row["speed_max_event_time"]) for row in rows
            if row["speed_max_event_time"] is not None and now - row["speed_max_event_time"] > settings.freshness_sla]
    if late:
        listed = ", ".join(f"{view} {lag.total_seconds() / 60:,.0f} min" for view, lag in late)
        print(f"past the freshness SLA of {settings.freshness_sla.total_seconds() / 60:g} min: {listed}")
        return RUNTIME_FAILURE
    print(f"ok: stream {stream.state}, every view within the freshness SLA")
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from lambdalake.demo import run_demo

    if any(settings.landing_dir.glob("*/*.jsonl")):
        raise UsageError(f"{settings.landing_dir} already holds events; the demo needs an empty --home")
    run_demo(settings, args.date, args.orders_per_hour)
    return 0


def cmd_up(args: argparse.Namespace, settings: Settings) -> int:
    from lambdalake.platform import password_file, reachable_host, up
    from serving.http import dashboard_url, serve_token

    pg_port = settings.pg_port if args.pg_port is None else args.pg_port
    if args.cluster:
        from lambdalake.cluster import Ports, cluster_up

        ports = Ports(airflow=args.port, serve=args.serve_port, pg_serve=pg_port)
        url = cluster_up(settings, ports)
        print(f"Spark master: http://127.0.0.1:{ports.spark_master_ui}  ({ports.master_url}; "
              f"Kafka 127.0.0.1:{ports.kafka}, PostgreSQL 127.0.0.1:{ports.postgres})")
    else:
        url = up(settings, args.port, args.serve_port, pg_port=pg_port)
    token = serve_token(settings)
    host = reachable_host(settings.bind_host)
    print(f"Airflow UI: {url}  (user admin, password in {password_file(settings)}; the dashboard: Lambdalake)")
    print(f"Dashboard:  {dashboard_url(host, args.serve_port, token)}")
    if pg_port:
        print(f"Postgres:   PGPASSWORD={token} psql -h {host.strip('[]')} -p {pg_port} -U lambdalake lambdalake")
    if settings.bind_host not in ("127.0.0.1", "localhost", "::1"):
        print(f"Listening on {settings.bind_host} (LAMBDALAKE_BIND_HOST): reachable from the network")
    source, stop = ("flow into Kafka", "make cluster-local-down") if args.cluster else \
        (f"land in {settings.landing_dir}", "make down")
    print(f"Events {source}; speed_layer_supervisor starts the stream. Stop with: {stop}")
    return 0


def cmd_down(args: argparse.Namespace, settings: Settings) -> int:
    from lambdalake.platform import down

    stopped = down(settings)
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    return 0


def cmd_kafka(args: argparse.Namespace, settings: Settings) -> int:
    from include.kafka_broker import broker_down, broker_up

    if args.action == "up":
        address, started = broker_up(settings.home, settings.run_dir, args.port)
        print(f"Kafka {'started' if started else 'already running'} at {address} (data in {settings.home / 'kafka'})")
        if address != settings.kafka_bootstrap_servers.replace("localhost", "127.0.0.1"):
            print(f"export LAMBDALAKE_KAFKA_BOOTSTRAP_SERVERS={address}")
    else:
        print("Kafka stopped" if broker_down(settings.run_dir) else "Kafka was not running")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument("--home", help="lambdalake home directory (default: $LAMBDALAKE_HOME)")
    common.add_argument("--verbose", action="store_true",
                        help="show Spark's own output and progress logs (else in <home>/run/spark.log); "
                        "status: every column")
    printing = OneLineParser(add_help=False)  # the commands that print data
    printing.add_argument("--format", choices=FORMATS, default="table")

    parser = OneLineParser(prog="lambdalake", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {installed_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    gen = commands.add_parser(
        "generate", parents=[common, printing], help="land synthetic events and their ground truth",
        description="Write synthetic events for all topics into the landing zone (in arrival "
        "order) and a ground-truth ledger into truth/<run id>/.",
    )
    gen.add_argument("--start", type=parse_instant, help="first event time (default: yesterday 00:00Z)")
    gen.add_argument("--hours", type=positive(float), default=24.0, help="hours of event time (default 24)")
    gen.add_argument("--orders-per-hour", type=positive(float), default=200.0)
    gen.add_argument("--late-fraction", type=parse_fraction, default=0.02,
                     help="share of events landing after the watermark passed them")
    gen.add_argument("--duplicate-fraction", type=parse_fraction, default=0.01)
    gen.add_argument("--corrupt-fraction", type=parse_fraction, default=0.005)
    gen.add_argument("--seed", type=int, default=0, help="same seed, same files")
    gen.add_argument("--customers", type=positive(int), default=500)
    gen.add_argument("--devices", type=positive(int), default=20)
    gen.add_argument("--sensor-interval", type=positive(int), default=60, help="seconds between readings")
    gen.add_argument("--file-minutes", type=positive(int), default=5, help="minutes of arrival per file")
    gen.add_argument("--sink", choices=("landing", "kafka"), default="landing",
                     help="landing zone files (default) or Kafka topics (cluster deployment)")
    gen.add_argument("--bootstrap-servers", help="with --sink kafka (default: $LAMBDALAKE_KAFKA_BOOTSTRAP_SERVERS)")
    gen.add_argument("--follow", action="store_true", help="keep landing live traffic (event time ≈ now)")
    gen.add_argument("--flush-seconds", type=positive(float), default=1.0, help="with --follow: file cadence")
    gen.add_argument("--duration", type=positive(float), help="with --follow: stop after this many seconds")
    gen.set_defaults(handler=cmd_generate)

    stream = commands.add_parser(
        "stream", parents=[common, printing], help="run the speed layer",
        description="Run the speed layer: ingest (Bronze, Silver, DLQ, late_events) and the "
        "streaming Gold views. SIGTERM/SIGINT stop it after the current micro-batch.",
    )
    stream.add_argument("--available-now", action="store_true",
                        help="process everything landed so far, in micro-batches, then exit")
    stream.add_argument("--trigger-interval", help="micro-batch interval when running continuously (default 1s)")
    stream.add_argument("--max-files-per-trigger", type=positive(int),
                        help="landing files per topic per micro-batch (default: 1 with --available-now; running "
                        "continuously, every file waiting up to $LAMBDALAKE_MAX_BYTES_PER_TRIGGER, 64 MiB)")
    stream.add_argument("--source", choices=("landing", "kafka", "rate"), help="event source (default: landing)")
    stream.add_argument("--views", metavar="VIEW,...",
                        help="the views to maintain (default: all, or $LAMBDALAKE_SPEED_VIEWS); "
                        "the others are served from the batch layer alone")
    stream.add_argument("--view-triggers", metavar="VIEW=DURATION,...",
                        help="a view's own micro-batch interval when running continuously "
                        "(default: --trigger-interval, or 30 s if longer for the views that need not be fresh "
                        "to the second; or $LAMBDALAKE_VIEW_TRIGGERS)")
    stream.add_argument("--bronze-trigger", metavar="DURATION",
                        help="Bronze's own micro-batch interval when running continuously "
                        "(default: 10 s, or --trigger-interval if longer; or $LAMBDALAKE_BRONZE_TRIGGER_INTERVAL); "
                        "no view waits for Bronze")
    stream.set_defaults(handler=cmd_stream)

    batch = commands.add_parser(
        "batch", parents=[common, printing], help="nightly batch for one event-time day",
        description="Recompute every batch view of the day from Bronze, reconcile with the speed "
        "views, and mark the day batch-covered. Idempotent: rerun to restate a stale day.",
    )
    batch.add_argument("--date", type=parse_day, required=True, help="event-time day, YYYY-MM-DD (UTC)")
    batch.set_defaults(handler=cmd_batch)

    query = commands.add_parser(
        "query", parents=[common, printing], help="read-only SQL over the merged views",
        description="Run one SELECT/WITH query over the merged views and operational tables "
        "(see docs/serving.md).",
    )
    query.add_argument("sql", nargs="?", help="one SELECT or WITH statement")
    query.add_argument("-f", "--file", metavar="FILE", help="read the query from FILE (- for standard input)")
    query.add_argument("--as-of", type=parse_as_of, metavar="VERSION|TIME",
                       help="the lake as it was: at an ISO-8601 time (every table), or every table at a Delta "
                       "version (for a query over one table; see `lambdalake history`)")
    query.set_defaults(handler=cmd_query)

    history = commands.add_parser(
        "history", parents=[common, printing], help="a Delta table's versions (for query --as-of)",
        description="List a lakehouse table's versions, newest first: when, which operation, rows after it.",
    )
    history.add_argument("table", help="lakehouse table, e.g. speed/order_payments, batch/revenue_by_category_5m, dlq")
    history.add_argument("--limit", type=positive(int), default=20, help="newest versions to list (default 20)")
    history.set_defaults(handler=cmd_history)

    maintain = commands.add_parser(
        "maintain", parents=[common, printing],
        help="compaction, vacuum, checkpoint hygiene (the lakehouse_maintenance DAG)",
        description="Run what the lakehouse_maintenance DAG runs: compact every table (Silver z-ordered by "
        "event time), vacuum files older than a week, remove consumed feed files and abandoned temporary files.",
    )
    maintain.set_defaults(handler=cmd_maintain)

    doctor = commands.add_parser(
        "doctor", parents=[common, printing], help="find (and --repair) what a crash left in the lake",
        description="Check the checkpoints, Delta tables and feeds for torn or empty files and a dead writer's "
        "leftovers; say what --repair would do about each, or why a person must. Exit 1 while anything is left.")
    doctor.add_argument("--repair", action="store_true",
                        help="carry out the repairs (with the stream stopped)")
    doctor.set_defaults(handler=cmd_doctor)

    status = commands.add_parser(
        "status", parents=[common, printing], help="stream health, coverage, freshness",
        description="A short summary: the stream, one line per view (freshness, batch coverage, stale days), "
        "the latest alert. --verbose or --format json|csv: every detail (table versions, times).")
    status.add_argument("--check", action="store_true",
                        help="for monitors: exit 1 with one line why when the stream is absent, dead or stalled or "
                        "a view is past LAMBDALAKE_FRESHNESS_SLA, else print ok and exit 0")
    status.set_defaults(handler=cmd_status)

    serve = commands.add_parser(
        "serve", parents=[common], help="the serving layer over HTTP and the PostgreSQL protocol",
        description="Serve the merged views until stopped: over HTTP, POST /api/query and "
        "GET /api/status with the bearer token (LAMBDALAKE_SERVE_TOKEN, else generated into "
        "run/serve-token), /health, /ready, /metrics and the dashboard at /; and the PostgreSQL wire "
        "protocol (psql, BI tools) with the token as the password.",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=positive(int), default=8090, help="HTTP port (default 8090)")
    serve.add_argument("--pg-port", type=port_or_off, metavar="PORT",
                       help="PostgreSQL protocol port, 0 for none (default 5433, or $LAMBDALAKE_PG_PORT)")
    serve.set_defaults(handler=cmd_serve)

    demo = commands.add_parser("demo", parents=[common], help="one day through the whole platform (make run)")
    demo.add_argument("--date", type=parse_day, help="event-time day (default: yesterday, UTC)")
    demo.add_argument("--orders-per-hour", type=positive(float), default=200.0)
    demo.set_defaults(handler=cmd_demo)

    up = commands.add_parser("up", parents=[common], help="start Airflow, the generator and the stream (make up)")
    up.add_argument("--port", type=positive(int), default=8080, help="Airflow API/UI port")
    up.add_argument("--serve-port", type=positive(int), default=8090,
                    help="`lambdalake serve` port (dashboard, SQL API)")
    up.add_argument("--pg-port", type=port_or_off, metavar="PORT",
                    help="`lambdalake serve` PostgreSQL port, 0 for none (default 5433, or $LAMBDALAKE_PG_PORT)")
    up.add_argument("--cluster", action="store_true",
                    help="docker-compose.yml's services as local processes: PostgreSQL, Kafka, a Spark master and "
                    "worker, Airflow's four components, the generator into Kafka, serve (make cluster-local-up)")
    up.set_defaults(handler=cmd_up)
    down = commands.add_parser("down", parents=[common], help="stop what `up` started (make down)")
    down.set_defaults(handler=cmd_down)

    kafka = commands.add_parser("kafka", parents=[common],
                                help="a local Apache Kafka broker (KRaft, as docker-compose.yml runs it)")
    kafka.add_argument("action", choices=("up", "down"))
    kafka.add_argument("--port", type=positive(int), default=9092, help="listener port (default 9092; controller: +1)")
    kafka.set_defaults(handler=cmd_kafka)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    with contextlib.suppress(ValueError):  # io.UnsupportedOperation: stderr is no file (captured)
        faulthandler.enable()  # a crash in native code (Arrow, delta-rs) leaves its Python stacks
    parser = build_parser()
    args = parser.parse_args(argv)
    overrides = {
        "home": args.home,
        "log_level": "INFO" if args.verbose else None,
        "trigger_interval": getattr(args, "trigger_interval", None),
        "max_files_per_trigger": getattr(args, "max_files_per_trigger", None),
        "event_source": getattr(args, "source", None),
        "speed_views": getattr(args, "views", None),
        "view_triggers": getattr(args, "view_triggers", None),
        "bronze_trigger_interval": getattr(args, "bronze_trigger", None),
    }
    from include.lakehouse.base import LakehouseError

    settings = None
    try:
        settings = load_settings(**overrides)
        logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("py4j").setLevel(logging.WARNING)
        if not args.verbose:  # a failed foreachBatch's traceback: the query's error tells it in one line
            logging.getLogger("py4j.clientserver").addFilter(
                lambda record: not record.getMessage().startswith(FAILED_CALLBACK))
        return args.handler(args, settings)
    except (ConfigError, UsageError, ValueError, FileExistsError) as exc:
        print(f"lambdalake: error: {exc}", file=sys.stderr)
        return BAD_INPUT
    except (LakehouseError, RuntimeError) as exc:
        print(f"lambdalake: error: {exc}", file=sys.stderr)
        return RUNTIME_FAILURE
    except Exception as exc:  # a full disk, told by Spark, delta-rs or Python in its own words
        from include.disk_space import as_no_space_left

        full = as_no_space_left(exc, settings.home if settings else "the lambdalake home")
        if full is None:
            raise
        print(f"lambdalake: error: {full}", file=sys.stderr)
        return RUNTIME_FAILURE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
