"""`lambdalake serve` for SQL tools and operators, for real: psycopg, SQLAlchemy, pandas and psql
over the PostgreSQL wire protocol; the row cap, query slots and body limit under hostile load;
CSV, Arrow and the JSON envelope; /health, /ready and /metrics; the CLI for scripts."""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import pandas as pd
import psycopg
import pyarrow as pa
import pytest
import sqlalchemy
from live_server import (LAMBDALAKE, MAX_CONCURRENT_QUERIES, MAX_RESULT_ROWS, QUERY_TIMEOUT_SECONDS, TOKEN, call,
                         call_with_headers, clean_env)
from prometheus_client.parser import text_string_to_metric_families

from include.backlog import INGEST_QUERY
from include.heartbeat import HEARTBEAT_FILE
from include.jvm import cache_dir, jdk_tool
from include.output import jsonable
from include.views import VIEWS, VIEWS_BY_NAME
from serving.engine import QUERYABLE, SOURCES

pytestmark = pytest.mark.slow

RUNAWAY = "SELECT sum(a.range * b.range) AS s FROM range(100000000) a, range(100000000) b"
# Far more rows than the cap, and wide: computing them all would take the server many seconds and GBs.
FLOOD = "SELECT range AS n, repeat('x', 200) AS padding FROM range(200000000)"


@pytest.fixture
def pg(server, ports):
    with psycopg.connect(host="127.0.0.1", port=ports.pg, user="analyst", password=TOKEN, dbname="lambdalake",
                         autocommit=True, connect_timeout=10) as connection:
        yield connection


def over_http(url: str, sql: str) -> list[dict]:
    status, body = call(url, "/api/query", {"sql": sql})
    assert status == 200, body
    return json.loads(body)


def as_json(rows: list[tuple], columns: list[str]) -> list[dict]:
    """psycopg's rows as the HTTP API's JSON shows them."""
    return json.loads(json.dumps([{c: jsonable(v) for c, v in zip(columns, row)} for row in rows], default=str))


# ---- the PostgreSQL wire protocol -------------------------------------------------------------
def test_psycopg_lists_every_served_table_and_its_columns(pg):
    listed = {row[0] for row in pg.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
    assert listed == set(QUERYABLE)  # what the views are made of is in schemas of its own
    for view in VIEWS:
        columns = pg.execute("SELECT column_name FROM information_schema.columns WHERE table_name = %s "
                             "ORDER BY ordinal_position", (view.name,)).fetchall()
        assert [name for (name,) in columns] == [*view.columns, "source"], view.name


@pytest.mark.parametrize("name", QUERYABLE)
def test_each_served_table_answers_over_pgwire_as_over_http(server, pg, name):
    url, _ = server
    sql = f"SELECT * FROM {name} ORDER BY ALL LIMIT 200"
    cursor = pg.execute(sql)
    assert as_json(cursor.fetchall(), [column.name for column in cursor.description]) == over_http(url, sql)


def test_the_demo_lake_has_rows_where_the_comparisons_look(pg):
    counts = dict(pg.execute("SELECT 'orders', count(*) FROM order_payments UNION ALL "
                             "SELECT 'windows', count(*) FROM revenue_by_category_5m UNION ALL "
                             "SELECT 'late', count(*) FROM late_events UNION ALL "
                             "SELECT 'dlq', count(*) FROM dlq").fetchall())
    assert min(counts.values()) > 0, counts


def test_types_arrive_as_python_types(pg):
    row = pg.execute("SELECT window_start, revenue, orders, category, DATE '2026-11-20' AS day, true AS yes, "
                     "1.25::DECIMAL(6,2) AS exact FROM revenue_by_category_5m ORDER BY window_start LIMIT 1").fetchone()
    window_start, revenue, orders, category, day, yes, exact = row
    assert window_start.tzinfo is not None and window_start.utcoffset().total_seconds() == 0
    assert isinstance(revenue, float) and isinstance(orders, int) and isinstance(category, str)
    assert str(day) == "2026-11-20" and yes is True and str(exact) == "1.25"


def test_binary_results_read_as_the_text_ones(pg):
    sql = ("SELECT 7::SMALLINT AS small, 1::INTEGER AS i, 2::BIGINT AS big, 2.5::DOUBLE AS f, 'x' AS s, "
           "true AS b, DATE '2026-11-20' AS d, TIMESTAMPTZ '2026-11-20 10:00:00.25+00' AS t, "
           "TIMESTAMP '2026-11-20 10:00' AS naive")
    assert pg.cursor(binary=True).execute(sql).fetchone() == pg.execute(sql).fetchone()
    with pytest.raises(psycopg.errors.ProtocolViolation, match="cannot be sent in binary"):
        pg.cursor(binary=True).execute("SELECT 1.5::DECIMAL(4,2) AS exact")
    assert pg.execute("SELECT 1").fetchone() == (1,)


def test_a_prepared_statement_is_described_without_running(pg):
    pg.pgconn.prepare(b"late_by_topic", b"SELECT topic, lateness_seconds FROM late_events WHERE topic = $1", [25])
    described = pg.pgconn.describe_prepared(b"late_by_topic")
    assert described.status == psycopg.pq.ExecStatus.COMMAND_OK, described.error_message
    assert (described.nparams, described.nfields) == (1, 2)
    assert [described.fname(0), described.ftype(0), described.ftype(1)] == [b"topic", 25, 701]


def test_a_parameterised_query(server, pg):
    url, _ = server
    status = over_http(url, "SELECT status FROM order_payments GROUP BY status ORDER BY count(*) DESC LIMIT 1")[0]
    since = datetime(2026, 11, 20, 1, tzinfo=timezone.utc)
    (count,) = pg.execute("SELECT count(*) FROM order_payments WHERE status = %s AND order_time >= %s",
                          (status["status"], since)).fetchone()
    expected = over_http(url, f"SELECT count(*) AS n FROM order_payments WHERE status = '{status['status']}' "
                              "AND order_time >= TIMESTAMPTZ '2026-11-20 01:00:00+00'")
    assert count == expected[0]["n"] > 0


@pytest.mark.parametrize("sql, sqlstate", [
    ("DELETE FROM dlq", "25006"),
    ("SELECT 1; DROP VIEW dlq", "25006"),
    ("SELECT * FROM read_csv('/etc/passwd')", "42501"),
    ("SELEC 1", "42000"),
    ("SELECT * FROM no_such_view", "42000"),
])
def test_a_refused_statement_is_an_error_with_a_sqlstate_and_the_connection_stays_usable(pg, sql, sqlstate):
    with pytest.raises(psycopg.Error) as refused:
        pg.execute(sql)
    assert refused.value.sqlstate == sqlstate, refused.value
    assert pg.execute("SELECT count(*) FROM dlq").fetchone()[0] > 0


def test_a_wrong_password_is_refused(server, ports):
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(host="127.0.0.1", port=ports.pg, user="analyst", password="wrong", dbname="lambdalake",
                        connect_timeout=10)


def test_a_result_over_the_row_cap_is_capped_with_a_notice(pg):
    notices = []
    pg.add_notice_handler(lambda notice: notices.append(notice.message_primary))
    started = time.monotonic()
    rows = pg.execute(FLOOD).fetchall()
    assert len(rows) == MAX_RESULT_ROWS and time.monotonic() - started < QUERY_TIMEOUT_SECONDS
    assert notices == [f"result truncated to {MAX_RESULT_ROWS:,} rows (LAMBDALAKE_MAX_RESULT_ROWS); the query has more"]
    notices.clear()
    assert len(pg.execute(f"SELECT * FROM range({MAX_RESULT_ROWS})").fetchall()) == MAX_RESULT_ROWS
    assert notices == []  # exactly the cap is not truncated


def test_a_query_past_the_time_limit_is_cancelled_and_the_connection_stays_usable(pg):
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled, match=f"after the {QUERY_TIMEOUT_SECONDS} s time limit"):
        pg.execute(RUNAWAY)
    assert QUERY_TIMEOUT_SECONDS <= time.monotonic() - started < 4 * QUERY_TIMEOUT_SECONDS
    assert pg.execute("SELECT 1").fetchone() == (1,)


def test_a_cancel_request_cancels_the_running_query(pg):
    canceller = threading.Timer(1.0, pg.cancel_safe)
    canceller.start()
    started = time.monotonic()
    with pytest.raises(psycopg.errors.QueryCanceled, match="canceling statement due to user request"):
        pg.execute(RUNAWAY)
    canceller.join()
    assert time.monotonic() - started < QUERY_TIMEOUT_SECONDS
    assert pg.execute("SELECT 1").fetchone() == (1,)


def test_transactions_and_client_settings_are_answered(server, ports):
    # psycopg's default: every query inside BEGIN ... COMMIT/ROLLBACK, as most drivers do.
    with psycopg.connect(host="127.0.0.1", port=ports.pg, user="analyst", password=TOKEN, dbname="lambdalake",
                         connect_timeout=10) as connection:
        connection.execute("SET application_name = 'a test'")
        assert connection.execute("SHOW transaction isolation level").fetchone() == ("read committed",)
        assert connection.execute("SELECT count(*) > 0 FROM late_events").fetchone() == (True,)
        connection.rollback()
        with pytest.raises(psycopg.errors.UndefinedObject, match='unrecognized configuration parameter "no_such"'):
            connection.execute("SHOW no_such")
        connection.rollback()
        assert ("revenue_by_category_5m",) in connection.execute("SHOW TABLES").fetchall()
        connection.rollback()
        assert connection.execute("SELECT 2").fetchone() == (2,)


def test_sqlalchemy_and_pandas(server, ports):
    url, _ = server
    engine = sqlalchemy.create_engine(f"postgresql+psycopg://analyst:{TOKEN}@127.0.0.1:{ports.pg}/lambdalake")
    try:
        inspector = sqlalchemy.inspect(engine)
        assert set(inspector.get_view_names()) == set(QUERYABLE) and inspector.get_table_names() == []
        for view in VIEWS:  # reflected with PostgreSQL's type names, which SQLAlchemy maps to its types
            columns = inspector.get_columns(view.name)
            assert [c["name"] for c in columns] == [*view.columns, "source"], view.name
            assert not [c["name"] for c in columns if isinstance(c["type"], sqlalchemy.types.NullType)], view.name
        sql = ("SELECT category, count(*) AS windows, round(sum(revenue), 2) AS revenue FROM revenue_by_category_5m "
               "GROUP BY category ORDER BY category")
        frame = pd.read_sql(sql, engine)
        assert frame.to_dict("records") == over_http(url, sql)
        with engine.connect() as connection:
            count = connection.execute(sqlalchemy.text("SELECT count(*) FROM dlq WHERE topic = :topic"),
                                       {"topic": "orders"}).scalar()
        assert count == over_http(url, "SELECT count(*) AS n FROM dlq WHERE topic = 'orders'")[0]["n"]
    finally:
        engine.dispose()


def psql(ports, *args: str, password: str = TOKEN) -> subprocess.CompletedProcess:
    return subprocess.run(["psql", "-h", "127.0.0.1", "-p", str(ports.pg), "-U", "analyst", "-d", "lambdalake",
                           "--no-psqlrc", "-v", "ON_ERROR_STOP=1", *args], capture_output=True, text=True,
                          env={**os.environ, "PGPASSWORD": password, "PGCONNECT_TIMEOUT": "10"}, timeout=60)


def test_psql(server, ports):
    if shutil.which("psql") is None:
        pytest.skip("psql is not installed (Debian: apt-get install postgresql-client)")
    listed = psql(ports, "-At", "-c", r"\d")
    assert listed.returncode == 0, listed.stderr
    assert sorted(line.split("|")[1] for line in listed.stdout.splitlines()) == QUERYABLE
    view = VIEWS[0]
    described = psql(ports, "-At", "-c", rf"\d+ {view.name}")
    assert described.returncode == 0, described.stderr
    assert [line.split("|")[0] for line in described.stdout.splitlines()[:len(view.columns) + 1]] == \
        [*view.columns, "source"]
    assert "View definition:" in psql(ports, "-c", rf"\d+ {view.name}").stdout  # the merge rule, in SQL
    # The other listings psql users type: one database, one role, no functions of our own.
    listings = {command: psql(ports, "-At", "-c", command) for command in (r"\l", r"\du", r"\df", r"\dv+", r"\dn")}
    assert {command: run.stderr for command, run in listings.items() if run.returncode != 0} == {}
    databases = [line.split("|")[:3] for line in listings[r"\l"].stdout.splitlines()]
    assert databases == [["lambdalake", "lambdalake", "UTF8"]]  # name, owner, encoding
    assert listings[r"\du"].stdout.startswith("lambdalake|") and listings[r"\df"].stdout == ""
    assert sorted(line.split("|")[1] for line in listings[r"\dv+"].stdout.splitlines()) == QUERYABLE
    assert "main|lambdalake" in listings[r"\dn"].stdout.splitlines()
    counted = psql(ports, "-At", "-c", "SELECT count(*) FROM late_events")
    assert counted.returncode == 0 and int(counted.stdout) > 0
    refused = psql(ports, "-c", "DROP VIEW dlq")
    assert refused.returncode == 1 and "ERROR:  only SELECT/WITH queries are allowed, got DROP" in refused.stderr
    capped = psql(ports, "-At", "-c", FLOOD)
    assert capped.returncode == 0 and len(capped.stdout.splitlines()) == MAX_RESULT_ROWS
    assert "NOTICE:  result truncated" in capped.stderr
    assert psql(ports, "-c", "SELECT 1", password="wrong").returncode == 2


JDBC = Path(__file__).parent / "jdbc"


@pytest.fixture(scope="session")
def pgjdbc() -> Path:
    """PostgreSQL's JDBC driver, fetched from Maven Central by mvn once per machine."""
    if not (jdk_tool("java") and shutil.which("mvn")):
        pytest.skip("no java or mvn to fetch and run PostgreSQL's JDBC driver")
    jars = cache_dir("pgjdbc-42.7.14")
    if not any(jars.glob("postgresql-*.jar")):
        fetched = subprocess.run(["mvn", "-q", "-B", "-f", str(JDBC / "pom.xml"), "dependency:copy-dependencies",
                                  "-DincludeScope=runtime", f"-DoutputDirectory={jars}"],
                                 capture_output=True, text=True, timeout=600)
        if fetched.returncode != 0:
            pytest.skip(f"PostgreSQL's JDBC driver could not be fetched: {fetched.stdout[-500:]}")
    return jars


def test_jdbc_lists_views_and_columns_as_dbeaver_and_metabase_read_them(server, ports, pgjdbc):
    """PostgreSQL's JDBC driver's DatabaseMetaData (what Metabase's sync and DBeaver's navigator
    read), then a query."""
    run = subprocess.run([jdk_tool("java"), "-cp", f"{pgjdbc}/*", str(JDBC / "JdbcClient.java"),
                          f"jdbc:postgresql://127.0.0.1:{ports.pg}/lambdalake", "analyst", TOKEN,
                          "SELECT * FROM revenue_by_category_5m"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = [line.split("\t") for line in run.stdout.splitlines()]
    assert sorted(name for kind, name, *_ in lines if kind == "table") == QUERYABLE
    columns = [line[1:4] for line in lines if line[0] == "column"]  # table, column, type name
    for view in VIEWS:
        assert [name for table, name, _ in columns if table == view.name] == [*view.columns, "source"], view.name
    types = {(table, name): type_name for table, name, type_name in columns}
    assert types[("revenue_by_category_5m", "window_start")] == "timestamptz"
    assert types[("revenue_by_category_5m", "revenue")] == "float8"
    assert types[("revenue_by_category_5m", "orders")] == "int8"
    assert types[("revenue_by_category_5m", "category")] == "varchar"
    rows = over_http(server[0], "SELECT count(*) AS n FROM revenue_by_category_5m")[0]["n"]
    assert ["rows", str(rows)] in lines and rows > 0


# ---- results that cannot sink the server ------------------------------------------------------
def rss_kib(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_result_far_over_the_cap_is_capped_over_http_while_memory_stays_bounded(server):
    url, process = server
    before = rss_kib(process.pid)
    for _ in range(3):
        status, headers, body = call_with_headers(url, "/api/query", {"sql": FLOOD})
        assert status == 200 and headers["x-lambdalake-truncated"] == "true"
        assert len(json.loads(body)) == MAX_RESULT_ROWS
    status, headers, body = call_with_headers(url, "/api/query?format=json&envelope=1", {"sql": FLOOD})
    envelope = json.loads(body)
    assert (envelope["truncated"], envelope["row_count"], len(envelope["rows"])) == (True, MAX_RESULT_ROWS,
                                                                                     MAX_RESULT_ROWS)
    assert rss_kib(process.pid) - before < 200 * 1024  # computing every row would take GBs


def test_a_result_within_the_cap_is_not_marked_truncated(server):
    url, _ = server
    status, headers, body = call_with_headers(url, "/api/query?envelope=1",
                                              {"sql": f"SELECT * FROM range({MAX_RESULT_ROWS})"})
    assert headers["x-lambdalake-truncated"] == "false" and json.loads(body)["truncated"] is False


def test_status_stays_responsive_while_more_runaway_queries_than_slots_run(server):
    url, _ = server
    answers: list[int] = []
    runaways = [threading.Thread(target=lambda: answers.append(call(url, "/api/query", {"sql": RUNAWAY})[0]))
                for _ in range(3 * MAX_CONCURRENT_QUERIES)]
    for thread in runaways:
        thread.start()
    time.sleep(0.5)
    latencies = []
    while any(thread.is_alive() for thread in runaways) and len(latencies) < 15:
        started = time.perf_counter()
        status, _ = call(url, "/api/status")
        latencies.append(time.perf_counter() - started)
        assert status == 200
        time.sleep(0.2)
    for thread in runaways:
        thread.join()
    assert len(latencies) >= 5 and statistics.median(latencies) < 1.0, latencies
    # Two slots: the first ones run to the time limit (504), those left waiting as long get 503.
    assert set(answers) <= {503, 504} and answers.count(504) >= MAX_CONCURRENT_QUERIES and 503 in answers


@pytest.mark.parametrize("body, status", [
    (b'{"sql": "SELECT 1 -- ' + b"x" * (1024 * 1024) + b'"}', 413),  # just over 1 MiB
    (b"[" * 100_000 + b"]" * 100_000, 400),  # JSON 100,000 deep
    (b'{"sql": ' * 50_000 + b"1" + b"}" * 50_000, 400),
])
def test_bodies_over_the_limit_and_pathological_json_are_refused_with_a_4xx(server, body, status):
    url, _ = server
    answer, text = call(url, "/api/query", body)
    assert answer == status and "error" in json.loads(text)
    assert call(url, "/api/query", {"sql": "SELECT 1 AS one"}) == (200, '[{"one":1}]')


# ---- formats ----------------------------------------------------------------------------------
CATEGORIES = ("SELECT window_start, category, revenue, orders FROM revenue_by_category_5m "
              "ORDER BY window_start, category")


def test_csv_and_arrow_answer_the_same_rows_as_json(server):
    url, _ = server
    rows = over_http(url, CATEGORIES)
    status, headers, body = call_with_headers(url, "/api/query?format=csv", {"sql": CATEGORIES})
    assert status == 200 and headers["content-type"].startswith("text/csv")
    lines = body.decode().splitlines()
    assert lines[0] == "window_start,category,revenue,orders" and len(lines) == len(rows) + 1
    assert lines[1] == f"{rows[0]['window_start']},{rows[0]['category']},{rows[0]['revenue']},{rows[0]['orders']}"
    status, headers, body = call_with_headers(url, "/api/query?format=arrow", {"sql": CATEGORIES})
    assert status == 200 and headers["content-type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(body).read_all()
    assert table.schema.metadata[b"lambdalake.truncated"] == b"false"
    assert table.num_rows == len(rows) and table.column("orders").to_pylist() == [row["orders"] for row in rows]
    assert str(table.schema.field("window_start").type) == "timestamp[us, tz=UTC]"


def test_the_envelope_has_column_names_and_duckdb_types(server):
    url, _ = server
    status, body = call(url, "/api/query?format=json&envelope=1", {"sql": CATEGORIES})
    envelope = json.loads(body)
    assert envelope["columns"] == [{"name": "window_start", "type": "TIMESTAMP WITH TIME ZONE"},
                                   {"name": "category", "type": "VARCHAR"}, {"name": "revenue", "type": "DOUBLE"},
                                   {"name": "orders", "type": "BIGINT"}]
    rows = over_http(url, CATEGORIES)
    assert envelope["rows"] == [list(row.values()) for row in rows] and envelope["row_count"] == len(rows)


@pytest.mark.parametrize("query, error", [
    ("?format=xml", "format must be one of json, csv, arrow, got 'xml'"),
    ("?envelope=yes", "envelope must be 1 or 0, got 'yes'"),
    ("?format=csv&envelope=1", "envelope=1 goes with format=json (csv and arrow carry the columns themselves)"),
    ("?limit=5", "unknown query parameter 'limit' (known: format, envelope)"),
])
def test_bad_answer_options_are_a_clear_400(server, query, error):
    url, _ = server
    assert call(url, f"/api/query{query}", {"sql": "SELECT 1"}) == (400, json.dumps({"error": error},
                                                                                     separators=(",", ":")))


# ---- health and metrics -----------------------------------------------------------------------
def test_health_and_ready_need_no_token(server):
    url, _ = server
    assert call(url, "/health", token=None) == (200, '{"status":"ok"}')
    status, body = call(url, "/ready", token=None)
    assert status == 200 and json.loads(body)["ready"] is True


def test_metrics_need_the_token_and_parse_as_prometheus_text(server, pg):
    url, _ = server
    assert call(url, "/metrics", token=None)[0] == 401
    with pytest.raises(psycopg.Error):
        pg.execute("DELETE FROM dlq")  # one refusal at least, over pgwire
    over_http(url, "SELECT 1")
    status, text = call(url, "/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("lambdalake_http_request_duration_seconds_count", route="/api/query", status="200") >= 1
    assert value("lambdalake_query_duration_seconds_count", protocol="pgwire", outcome="ok") >= 1
    assert value("lambdalake_queries_refused_total", protocol="pgwire", reason="not_read_only") >= 1
    assert value("lambdalake_rows_returned_total", protocol="http") >= 1
    for relation in ("coverage", "late_events", "dlq"):
        assert value("lambdalake_table_version", table=SOURCES[relation][0]) >= 0
    streamed = [VIEWS_BY_NAME["revenue_by_category_5m"], VIEWS_BY_NAME["order_payments"]]
    for view in streamed:
        assert value("lambdalake_view_speed_freshness_seconds", view=view.name) > 0
    assert value("lambdalake_stream_state", state="stopped") + value("lambdalake_stream_state", state="dead") == 1
    for name, table in (("lambdalake_late_events_total", "late_events"), ("lambdalake_dlq_events_total", "dlq")):
        by_topic = over_http(url, f"SELECT topic, count(*) AS n FROM {table} GROUP BY topic")
        assert by_topic and all(value(name, topic=row["topic"]) == row["n"] for row in by_topic)


# ---- the command line for scripts and monitors -------------------------------------------------
def test_version():
    printed = subprocess.run([LAMBDALAKE, "--version"], capture_output=True, text=True, env=clean_env())
    assert printed.returncode == 0 and printed.stdout == f"lambdalake {version('lambdalake')}\n"


@pytest.fixture
def cli(monkeypatch, capsys):
    """``lambdalake`` in this process (opening the engine is the cost; a new interpreter would add
    seconds of imports): returns the exit code and what it printed."""
    from lambdalake.cli import main

    for key in [key for key in os.environ if key.startswith("LAMBDALAKE_")]:
        monkeypatch.delenv(key)

    def run_main(*args: str) -> tuple[int, str, str]:
        code = main(list(args))
        printed = capsys.readouterr()
        return code, printed.out, printed.err

    return run_main


def test_query_from_a_file_and_from_standard_input(server, lake, cli, tmp_path, monkeypatch):
    url, _ = server
    sql = "SELECT topic, count(*) AS n\nFROM late_events\nGROUP BY topic\nORDER BY topic;\n"
    (tmp_path / "late.sql").write_text(sql)
    code, from_file, _ = cli("query", "-f", str(tmp_path / "late.sql"), "--home", str(lake.home), "--format", "json")
    assert code == 0
    monkeypatch.setattr("sys.stdin", io.StringIO(sql))
    code, from_stdin, _ = cli("query", "-f", "-", "--home", str(lake.home), "--format", "json")
    assert code == 0 and json.loads(from_file) == json.loads(from_stdin) == over_http(url, sql) != []
    both = cli("query", "SELECT 1", "-f", str(tmp_path / "late.sql"), "--home", str(lake.home))
    assert both == (2, "", "lambdalake: error: give the query as an argument or with -f FILE "
                           "(- for standard input), not both\n")
    missing = cli("query", "-f", str(tmp_path / "none.sql"), "--home", str(lake.home))
    assert missing == (2, "", f"lambdalake: error: cannot read the query from {tmp_path / 'none.sql'}: "
                              "No such file or directory\n")


def test_status_check_exits_1_with_the_reason_for_monitors(streamed_lake, cli, tmp_path, monkeypatch):
    settings = streamed_lake.copy_to(tmp_path / "home")
    home = str(settings.home)
    code, stopped, _ = cli("status", "--check", "--home", home)
    assert code == 1 and stopped.startswith("stream dead: "), stopped
    # A live stream, as its heartbeat and pid file tell it (this process stands in for it).
    now = datetime.now(timezone.utc).isoformat()
    (settings.run_dir / HEARTBEAT_FILE).write_text(json.dumps({
        "pid": os.getpid(), "state": "running", "started_at": now, "heartbeat_at": now,
        "queries": {INGEST_QUERY: {"last_progress_at": now}}}))
    (settings.run_dir / "stream.pid").write_text(str(os.getpid()))
    code, behind, _ = cli("status", "--check", "--home", home)
    assert code == 1 and behind.startswith("past the freshness SLA of 30 min: "), behind
    assert "revenue_by_category_5m" in behind and len(behind.splitlines()) == 1
    monkeypatch.setenv("LAMBDALAKE_FRESHNESS_SLA", "3650d")
    assert cli("status", "--check", "--home", home) == (0, "ok: stream healthy, every view within the freshness SLA\n",
                                                        "")
