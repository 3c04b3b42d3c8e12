"""`lambdalake serve` stops cleanly on SIGTERM and SIGINT: the queries in flight over HTTP and
the PostgreSQL protocol are answered (here: cancelled at the query time limit), the PostgreSQL
listener closes, and the process exits 0, as a supervisor or systemd expects of a requested stop."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request

import psycopg
import pytest
from live_server import LAMBDALAKE, QUERY_TIMEOUT_SECONDS, TOKEN, call, clean_env, free_port

RUNAWAY = "SELECT sum(a.range * b.range) FROM range(100000000) a, range(100000000) b"


def start_serve(home, http_port: int, pg_port: int) -> subprocess.Popen:
    process = subprocess.Popen(
        [LAMBDALAKE, "serve", "--home", str(home), "--port", str(http_port), "--pg-port", str(pg_port)],
        env=clean_env(LAMBDALAKE_SERVE_TOKEN=TOKEN, LAMBDALAKE_QUERY_TIMEOUT=f"{QUERY_TIMEOUT_SECONDS}s"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=2).close()
            return process
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"lambdalake serve did not start: {process.communicate()[0]}") from None
            time.sleep(0.2)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_serve_stops_cleanly_answering_the_queries_in_flight(tmp_path, stop):
    http_port, pg_port = free_port(), free_port()
    process = start_serve(tmp_path / "home", http_port, pg_port)
    url = f"http://127.0.0.1:{http_port}"
    answers: dict[str, object] = {}

    def over_http() -> None:
        answers["http"] = call(url, "/api/query", {"sql": RUNAWAY})

    def over_pg() -> None:
        with psycopg.connect(host="127.0.0.1", port=pg_port, user="analyst", password=TOKEN, dbname="lambdalake",
                             autocommit=True, connect_timeout=10) as connection:
            try:
                connection.execute(RUNAWAY).fetchall()
                answers["pg"] = "rows"
            except psycopg.Error as error:
                answers["pg"] = error.sqlstate

    # An idle PostgreSQL client too: it must not hold the stop up.
    idle = psycopg.connect(host="127.0.0.1", port=pg_port, user="analyst", password=TOKEN, dbname="lambdalake",
                           autocommit=True, connect_timeout=10)
    clients = [threading.Thread(target=over_http), threading.Thread(target=over_pg)]
    try:
        for client in clients:
            client.start()
        time.sleep(1.5)  # both queries are running now
        stopped_at = time.monotonic()
        process.send_signal(stop)
        output, _ = process.communicate(timeout=QUERY_TIMEOUT_SECONDS + 30)
        took = time.monotonic() - stopped_at
        for client in clients:
            client.join(timeout=30)
    finally:
        idle.close()
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    assert took < QUERY_TIMEOUT_SECONDS + 10, f"took {took:.1f} s to stop"
    status, body = answers["http"]
    assert status == 504 and "time limit" in json.loads(body)["error"]
    assert answers["pg"] == "57014"  # query_canceled: at the time limit, and answered before the close
    for port in (pg_port, http_port):  # both listeners are closed
        with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert "Traceback" not in output


@pytest.mark.parametrize("taken", ["http", "pg"])
def test_a_taken_port_exits_1_saying_which(tmp_path, taken):
    http_port, pg_port = free_port(), free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", http_port if taken == "http" else pg_port))
        holder.listen()
        done = subprocess.run(
            [LAMBDALAKE, "serve", "--home", str(tmp_path / "home"), "--port", str(http_port),
             "--pg-port", str(pg_port)],
            env=clean_env(LAMBDALAKE_SERVE_TOKEN=TOKEN), capture_output=True, text=True, timeout=120)
    protocol = "HTTP" if taken == "http" else "PostgreSQL clients"
    port = http_port if taken == "http" else pg_port
    assert done.returncode == 1, done.stderr
    assert f"lambdalake: error: cannot listen for {protocol} on 127.0.0.1:{port}: Address already in use" in done.stderr
