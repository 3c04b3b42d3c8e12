"""Headless Chromium driven over the DevTools protocol: a websocket and JSON, no driver binary;
for the dashboard's tests, from ``lambdalake serve`` and inside Airflow's UI."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect

BINARIES = ("chromium", "chromium-browser", "google-chrome")
PANELS = ("revenue", "freshness", "losses", "reconciliation", "alerts")  # serving/dashboard/index.html


def chromium_binary() -> str:
    """The browser on PATH; the test skips, saying why, without one."""
    binary = next((path for path in map(shutil.which, BINARIES) if path), None)
    if binary is None:
        pytest.skip(f"no Chromium binary ({', '.join(BINARIES)}) on PATH; Debian: apt-get install chromium")
    return binary


def panel_states(document: str = "document") -> str:
    """JavaScript: once the dashboard in ``document`` has drawn every panel, each panel's state
    (``data``, ``empty`` or ``error``) by id; false until then."""
    panels = f"[...({document}?.querySelectorAll('.panel') ?? [])]"
    return (f"{panels}.length > 0 && {panels}.every(p => p.dataset.state !== 'loading')"
            f" && Object.fromEntries({panels}.map(p => [p.id, p.dataset.state]))")


class Chromium:
    """One headless browser tab; ``evaluate`` runs JavaScript in the page and returns its value."""

    def __init__(self, binary: str, profile: Path, width: int = 1366, height: int = 1000) -> None:
        self.process = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--hide-scrollbars", f"--window-size={width},{height}", "--remote-debugging-port=0",
             f"--user-data-dir={profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"  # Chromium writes the port it chose here
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError(f"{binary} did not start its DevTools endpoint")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as response:
            page = next(target for target in json.load(response) if target["type"] == "page")
        self._closing = ExitStack()
        self.socket = self._closing.enter_context(connect(page["webSocketDebuggerUrl"], max_size=None))
        self._ids = itertools.count(1)

    def send(self, method: str, **params: Any) -> dict:
        message_id = next(self._ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:  # events arrive in between; skip them
            message = json.loads(self.socket.recv(timeout=60))
            if message.get("id") == message_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message["result"]

    def open(self, url: str) -> None:
        self.send("Page.enable")
        self.send("Page.navigate", url=url)

    def type_into(self, selector: str, text: str) -> None:
        """Type into a field as a person does, so that the page's framework sees the input."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} raised {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout:.0f}s")
            time.sleep(0.25)

    def screenshot(self, path: Path) -> Path:
        """The whole page, not just the window."""
        size = self.send("Page.getLayoutMetrics")["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.send("Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        if hasattr(self, "_closing"):
            self._closing.close()
        self.process.terminate()
        self.process.wait(timeout=10)
