from __future__ import annotations

import json
from pathlib import Path

import pytest

from include.generator.landing import LandingZone


@pytest.fixture
def land(settings):
    """Write one landing file per call: land("orders", "0001", [record, ...])."""
    zone = LandingZone(settings.landing_dir)

    def write(topic: str, name: str, records: list) -> Path:
        return zone.write(topic, name, (r if isinstance(r, str) else json.dumps(r) for r in records))

    return write
