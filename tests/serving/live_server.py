"""A real `lambdalake serve` process for the serving tests, and what they call it with."""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.error
import urllib.request
from datetime import date
from pathlib import Path

DAY = date(2026, 11, 20)
TOKEN = "test-token-0123456789"
LAMBDALAKE = Path(sys.executable).parent / "lambdalake"
# The limits the served process runs with: small, so that tests reach them cheaply.
QUERY_TIMEOUT_SECONDS = 5
MAX_RESULT_ROWS = 1000
MAX_CONCURRENT_QUERIES = 2


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAMBDALAKE_")}
    return {**env, **extra}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def call(url: str, path: str, body: dict | bytes | None = None, token: str | None = TOKEN,
         scheme: str = "Bearer") -> tuple[int, str]:
    status, _, answer = call_with_headers(url, path, body, token, scheme)
    return status, answer.decode()


def call_with_headers(url: str, path: str, body: dict | bytes | None = None, token: str | None = TOKEN,
                      scheme: str = "Bearer") -> tuple[int, dict[str, str], bytes]:
    """Status, headers (names in lower case), body."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    headers = {"Authorization": f"{scheme} {token}"} if token is not None else {}
    request = urllib.request.Request(url + path, data=data, headers=headers,
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as error:
        return error.code, {k.lower(): v for k, v in error.headers.items()}, error.read()
