"""`lambdalake serve` and `lambdalake status` need no Spark: nothing they import, or run on a lake,
imports pyspark (the schemas they read are declarations, include/ddl.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def run_python(code: str, *args: str) -> list[str]:
    """Run ``code`` in a fresh interpreter on this checkout; its last line of output, as JSON."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("LAMBDALAKE_")}
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=PROJECT, env=env,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


SPARK_MODULES = "sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'py4j'))"


def test_serving_imports_no_pyspark():
    imported = run_python(
        "import json, sys\n"
        "import serving.http, serving.pgwire, serving.status, serving.engine, serving.history, lambdalake.cli\n"
        f"assert serving.engine.__file__.startswith({str(PROJECT)!r}), serving.engine.__file__\n"
        "assert 'pyspark' not in sys.modules\n"
        f"print(json.dumps({SPARK_MODULES}))\n"
    )
    assert imported == []


def test_status_and_the_http_api_run_without_pyspark(tmp_path):
    imported = run_python(
        "import json, sys\n"
        "from fastapi.testclient import TestClient\n"
        "from include.config import load_settings\n"
        "from lambdalake.cli import main\n"
        "from serving.http import create_app\n"
        "home = sys.argv[1]\n"
        "with TestClient(create_app(load_settings(home=home), 'token')) as client:\n"
        "    auth = {'Authorization': 'Bearer token'}\n"
        "    assert client.get('/api/status', headers=auth).status_code == 200\n"
        "    answer = client.post('/api/query', json={'sql': 'SELECT * FROM revenue_by_category_5m'}, headers=auth)\n"
        "    assert answer.status_code == 200 and answer.json() == [], answer.text\n"
        "assert main(['status', '--home', home]) == 0\n"
        "assert main(['status', '--check', '--home', home]) == 1  # the stream was never started\n"
        f"print(json.dumps({SPARK_MODULES}))\n",
        str(tmp_path / "home"),
    )
    assert imported == []
