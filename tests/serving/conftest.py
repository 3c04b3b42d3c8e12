"""One batched lake and one `lambdalake serve` process (HTTP and the PostgreSQL protocol) for the
serving tests that need them; the lake is a copy, so tests that write to it stay apart from
the session's streamed lake."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from dataclasses import dataclass

import pytest
from live_server import (DAY, LAMBDALAKE, MAX_CONCURRENT_QUERIES, MAX_RESULT_ROWS, QUERY_TIMEOUT_SECONDS, TOKEN,
                         clean_env, free_port)

from include.notifier import notify


@pytest.fixture(scope="session")
def lake(streamed_lake, tmp_path_factory):
    from batch_layer.nightly import run_batch

    settings = streamed_lake.copy_to(tmp_path_factory.mktemp("serve") / "home")
    run_batch(settings, DAY)
    notify(settings, "speed_layer_supervisor", "stream stalled; restarting", "warning")
    return settings


@dataclass(frozen=True)
class Ports:
    http: int
    pg: int


@pytest.fixture(scope="session")
def ports() -> Ports:
    return Ports(free_port(), free_port())


@pytest.fixture(scope="session")
def server(lake, ports):
    """The server as a process: (its URL, the process); its PostgreSQL port is ``ports.pg``."""
    process = subprocess.Popen(
        [LAMBDALAKE, "serve", "--home", lake.home, "--port", str(ports.http), "--pg-port", str(ports.pg)],
        env=clean_env(LAMBDALAKE_SERVE_TOKEN=TOKEN, LAMBDALAKE_QUERY_TIMEOUT=f"{QUERY_TIMEOUT_SECONDS}s",
                      LAMBDALAKE_MAX_RESULT_ROWS=str(MAX_RESULT_ROWS),
                      LAMBDALAKE_MAX_CONCURRENT_QUERIES=str(MAX_CONCURRENT_QUERIES)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{ports.http}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2).close()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"lambdalake serve did not start: {process.stdout.read()}") from None
            time.sleep(0.3)
    yield url, process
    process.terminate()
    process.wait(timeout=30)
