"""The stream's heartbeat file: written by the speed layer, read by the supervisor, the nightly
batch's readiness check and ``status``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HEARTBEAT_FILE = "stream-heartbeat.json"


def read_heartbeat(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / HEARTBEAT_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
