"""`lambdalake serve` for real: a streamed and batched lake, the server as a process, HTTP
clients, the CLI to compare with, and headless Chromium for the dashboard."""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from browser import PANELS, Chromium, chromium_binary, panel_states
from live_server import DAY, LAMBDALAKE, QUERY_TIMEOUT_SECONDS, TOKEN, call, clean_env, free_port
from pydantic import SecretStr
from test_serving import FORBIDDEN

from include.notifier import notify
from include.views import VIEWS
from serving.engine import QueryRefused, ServingEngine

pytestmark = pytest.mark.slow

# What the dashboard asks most; the concurrency test repeats them.
QUERIES = [
    "SELECT status, count(*) AS orders FROM order_payments GROUP BY status ORDER BY status",
    "SELECT category, round(sum(revenue), 2) AS revenue FROM revenue_by_category_5m "
    "GROUP BY category ORDER BY category",
    "SELECT topic, count(*) AS late FROM late_events GROUP BY topic ORDER BY topic",
    "SELECT view, metric, diff FROM reconciliation ORDER BY view, metric",
]


def cli(lake, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LAMBDALAKE, *args, "--home", lake.home], capture_output=True, text=True, env=clean_env())


def lake_files(settings) -> dict[Path, int]:
    return {path: path.stat().st_mtime_ns for path in settings.lakehouse_dir.rglob("*")}


def test_the_server_prints_the_dashboard_url_with_its_token(server):
    url, process = server
    first = process.stdout.readline()
    assert first.strip() == f"Dashboard: {url}/#token={TOKEN}"


@pytest.mark.parametrize("path", ["/api/query", "/api/status", "/api/no-such-thing"])
@pytest.mark.parametrize("token, scheme", [(None, "Bearer"), ("wrong", "Bearer"), (TOKEN, "Basic"), ("", "Bearer")])
def test_api_without_the_token_answers_401_and_nothing_else(server, path, token, scheme):
    url, _ = server
    body = {"sql": "SELECT * FROM order_payments"} if path == "/api/query" else None
    assert call(url, path, body, token=token, scheme=scheme) == (401, "")


def test_the_dashboard_page_is_static_and_needs_no_token(server):
    url, _ = server
    status, page = call(url, "/", token=None)
    assert status == 200 and "<title>lambdalake</title>" in page
    assert call(url, "/dashboard.js", token=None)[0] == 200


@pytest.mark.parametrize("sql", QUERIES)
def test_query_answers_exactly_what_the_cli_prints(server, lake, sql):
    url, _ = server
    status, body = call(url, "/api/query", {"sql": sql})
    printed = cli(lake, "query", sql, "--format", "json")
    assert printed.returncode == 0, printed.stderr
    assert status == 200 and json.loads(body)  # the lake has rows for each
    assert json.loads(body) == json.loads(printed.stdout)


def test_status_answers_what_the_cli_prints(server, lake):
    url, _ = server
    status, body = call(url, "/api/status")
    printed = json.loads(cli(lake, "status", "--format", "json").stdout)
    served = json.loads(body)
    assert status == 200 and [row["view"] for row in served] == [view.name for view in VIEWS]
    drop = {"checked_at"}  # the moment each was asked
    assert [{k: v for k, v in row.items() if k not in drop} for row in served] == \
        [{k: v for k, v in row.items() if k not in drop} for row in printed]
    assert served[0]["batch_covered_days"] == DAY.isoformat()
    assert served[0]["last_alert"] == "stream stalled; restarting"


@pytest.mark.parametrize("sql", [*FORBIDDEN, "SELEC 1", "SELECT * FROM no_such_view"])
def test_refused_statements_answer_400_with_the_cli_message(server, lake, sql):
    url, _ = server
    sql = sql.format(lake=lake.lakehouse_dir)
    before = lake_files(lake)
    status, body = call(url, "/api/query", {"sql": sql})
    with pytest.raises(QueryRefused) as refused:  # what `lambdalake query` prints after "error: "
        ServingEngine(lake).query(sql)
    assert status == 400 and json.loads(body) == {"error": str(refused.value)}
    assert lake_files(lake) == before


def test_the_cli_prints_the_same_refusal(server, lake):
    url, _ = server
    sql = "SELECT 1; DROP VIEW dlq"
    printed = cli(lake, "query", sql)
    assert printed.returncode == 2
    assert printed.stderr == f"lambdalake: error: {json.loads(call(url, '/api/query', {'sql': sql})[1])['error']}\n"


@pytest.mark.parametrize("body", [b"not json", b'{"query": "SELECT 1"}', b'{"sql": 1}', b""])
def test_a_malformed_body_answers_400(server, body):
    url, _ = server
    status, answer = call(url, "/api/query", body)
    assert status == 400 and json.loads(answer) == {"error": 'the body must be JSON {"sql": "SELECT ..."}'}


def test_a_slow_query_is_cancelled_at_the_time_limit(server):
    url, _ = server
    started = time.monotonic()
    status, body = call(url, "/api/query",
                        {"sql": "SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000000) b"})
    limit = f"query cancelled after the {QUERY_TIMEOUT_SECONDS} s time limit"
    assert status == 504 and json.loads(body) == {"error": limit}
    assert QUERY_TIMEOUT_SECONDS <= time.monotonic() - started < 30
    assert call(url, "/api/query", {"sql": "SELECT 1 AS one"}) == (200, '[{"one":1}]')


def test_fifty_concurrent_clients_for_twenty_seconds(server, lake):
    url, _ = server
    expected = {sql: call(url, "/api/query", {"sql": sql}) for sql in QUERIES}
    before = lake_files(lake)
    failures: list[str] = []
    answered = [0] * 50
    stop = time.monotonic() + 20

    def client(number: int) -> None:
        while time.monotonic() < stop:
            sql = QUERIES[(number + answered[number]) % len(QUERIES)]
            answer = call(url, "/api/query", {"sql": sql})
            if answer != expected[sql]:
                failures.append(f"client {number}: {answer[0]} {answer[1][:200]}")
                return
            answered[number] += 1

    clients = [threading.Thread(target=client, args=(n,)) for n in range(50)]
    for thread in clients:
        thread.start()
    for thread in clients:
        thread.join()
    assert failures == []
    assert min(answered) > 0, answered
    assert lake_files(lake) == before


def test_dashboard_renders_every_panel_in_headless_chromium(server, lake, tmp_path):
    url, _ = server
    browser = Chromium(chromium_binary(), tmp_path / "profile")
    try:
        browser.open(f"{url}/#token={TOKEN}")
        states = browser.wait_for(panel_states())
        assert states == dict.fromkeys(PANELS, "data")
        assert browser.evaluate("location.hash") == ""  # the token left the address bar
        series = browser.evaluate("Object.fromEntries([...document.querySelectorAll('#revenue polyline')]"
                                  ".map(l => [l.dataset.series, l.getAttribute('points').split(' ').length]))")
        assert set(series) == {"speed", "batch", "merged"} and min(series.values()) >= 3
        # A dot per hour as well: a series of a single hour (a line needs two) still shows.
        dots = browser.evaluate("Object.fromEntries(['speed', 'batch', 'merged'].map(s => "
                                "[s, document.querySelectorAll(`#revenue circle[data-series=${s}]`).length]))")
        assert dots == series
        views = browser.evaluate(
            "[...document.querySelectorAll('#freshness tbody tr')].map(r => r.cells[0].textContent)")
        assert views == [view.name for view in VIEWS]
        assert browser.evaluate("document.querySelectorAll('#losses tbody tr').length") >= 5
        assert browser.evaluate("document.querySelectorAll('#reconciliation tr.diff').length") >= 1
        badge = browser.evaluate("document.getElementById('stream').textContent")
        assert "stopped" in badge and "no input waiting" in badge, badge
        headers = browser.evaluate("[...document.querySelectorAll('#freshness th')].map(h => h.textContent)")
        assert headers[:3] == ["view", "newest event counted", "updated"]

        # New data shows up on its own, without reloading the page.
        browser.evaluate("window.sameDocument = true")
        notify(lake, "lambda_nightly_batch", "deadline missed in the browser test")
        browser.wait_for(
            "document.querySelector('#alerts tbody').textContent.includes('deadline missed in the browser test')", 30)
        assert browser.evaluate("window.sameDocument") is True
        shot = browser.screenshot(tmp_path / "dashboard.png")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        print(f"screenshot: {shot}")
    finally:
        browser.close()


def test_without_a_configured_token_one_is_generated_once_and_kept_private(settings):
    from serving.http import serve_token

    token = serve_token(settings)
    path = settings.run_dir / "serve-token"
    assert len(token) >= 32 and path.read_text() == token
    assert path.stat().st_mode & 0o777 == 0o600
    assert serve_token(settings) == token
    assert serve_token(settings.model_copy(update={"serve_token": SecretStr("mine")})) == "mine"


def test_make_up_starts_the_server_and_make_down_stops_it(lake):
    from lambdalake.platform import down, start_serve

    url = start_serve(lake, free_port(), pg_port=free_port())
    try:
        from serving.http import serve_token

        assert call(url, "/api/query", {"sql": "SELECT count(*) AS n FROM dlq"}, token=serve_token(lake))[0] == 200
    finally:
        stopped = down(lake)
    assert any(service.startswith("serve") for service in stopped)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
