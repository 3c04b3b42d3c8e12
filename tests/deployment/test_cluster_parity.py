"""One design with compose: `lambdalake up --cluster` (lambdalake/cluster.py) runs the services,
settings, connections and Spark packages docker-compose.yml and docker/Dockerfile run. Both are
read here; neither list is copied into the test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from include.config import load_settings
from include.spark_jars import SPARK_PACKAGES, cached_packages
from include.spark_submit import CONN_ID
from lambdalake.cluster import (
    LIVE_TRAFFIC, ONE_SHOTS, SERVICES, SPARK_MASTER_OPTS, TOPIC_PARTITIONS, WORKER_CORES, WORKER_MEMORY, Ports,
    airflow_cluster_env, lambdalake_env,
)

PROJECT = Path(__file__).resolve().parents[2]


def interpolated(value: str) -> str:
    """``${NAME:-default}`` → default (what compose uses when .env leaves it unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load((PROJECT / "docker-compose.yml").read_text())["services"]


@pytest.fixture
def harness(settings) -> dict[str, dict[str, str]]:
    ports = Ports()
    return {"lambdalake": lambdalake_env(settings, ports), "airflow": airflow_cluster_env(settings, ports)}


def test_the_same_services(services):
    assert set(SERVICES) | set(ONE_SHOTS) == set(services)
    assert not set(SERVICES) & set(ONE_SHOTS)
    assert {name for name, s in services.items() if s.get("restart") == "no"} == set(ONE_SHOTS)


def test_the_same_settings_names(services, harness):
    for name in ("generator", "serve", "airflow-scheduler"):
        compose = {key for key in services[name]["environment"] if key.startswith("LAMBDALAKE_")}
        compose -= {"LAMBDALAKE_SERVE_TOKEN"}  # serve's own secret; the harness's serve generates one
        assert compose == set(harness["lambdalake"]), name
    for key in ("LAMBDALAKE_EVENT_SOURCE",):
        assert harness["lambdalake"][key] == services["generator"]["environment"][key]


def test_the_same_airflow_configuration_and_connections(services, harness):
    compose = services["airflow-scheduler"]["environment"]
    names = {key for key in compose if key.startswith(("AIRFLOW__", "AIRFLOW_CONN_"))}
    assert names <= set(harness["airflow"]), names - set(harness["airflow"])
    for key in ("AIRFLOW__CORE__EXECUTOR", "AIRFLOW__CORE__LOAD_EXAMPLES",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"):
        assert harness["airflow"][key].lower() == str(compose[key]).lower(), key
    assert compose["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].split("://")[0] == \
        harness["airflow"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].split("://")[0] == "postgresql+psycopg2"
    assert harness["airflow"]["AIRFLOW__CORE__DAGS_FOLDER"] == str(PROJECT / "dags")
    for conn in (CONN_ID, "spark_default"):
        key = f"AIRFLOW_CONN_{conn.upper()}"
        ours, theirs = json.loads(harness["airflow"][key]), json.loads(compose[key])
        assert (ours["conn_type"], ours["extra"]) == (theirs["conn_type"], theirs["extra"]), conn
        # Each points at its own deployment's master, the one its stream uses.
        for env, conn_ in ((harness["lambdalake"], ours), (compose, theirs)):
            assert f"{conn_['host']}:{conn_['port']}" == env["LAMBDALAKE_SPARK_MASTER"], conn


def test_the_same_spark_cluster_and_kafka_topics(services):
    worker = [interpolated(str(arg)) for arg in services["spark-worker"]["command"]]
    assert worker[worker.index("--cores") + 1] == str(WORKER_CORES)
    assert worker[worker.index("--memory") + 1] == WORKER_MEMORY
    assert services["spark-master"]["environment"]["SPARK_MASTER_OPTS"] == SPARK_MASTER_OPTS
    script = services["kafka-topics"]["command"][0]
    default = re.search(r"for topic in \$\{KAFKA_TOPIC_PARTITIONS:-([^}]+)\};", script).group(1)
    assert {topic: int(n) for topic, n in (item.split("=") for item in default.split())} == TOPIC_PARTITIONS
    generator = [interpolated(str(arg)) for arg in services["generator"]["command"]]
    assert generator[:4] == ["lambdalake", "generate", "--sink", "kafka"] and tuple(generator[4:]) == LIVE_TRAFFIC


def test_the_same_spark_packages(monkeypatch):
    """The image bakes include/spark_jars.py's packages into pyspark/jars; the harness's drivers
    load the same list from the folder `make install` fetched it into (the session fixture fetches
    it too), and executors get them from the drivers."""
    dockerfile = (PROJECT / "docker" / "Dockerfile").read_text()
    assert re.search(r"^RUN python include/spark_jars.py --into \"\$SPARK_HOME/jars\"", dockerfile, flags=re.M)
    for key in ("LAMBDALAKE_SPARK_JARS", "LAMBDALAKE_SPARK_JARS_PACKAGES", "LAMBDALAKE_SPARK_JARS_DIR"):
        monkeypatch.delenv(key, raising=False)
    folder = load_settings().spark_jars_dir
    if not cached_packages(folder):
        print(f"SKIP Spark packages: not fetched into {folder} (make install)")
        pytest.skip(f"Spark packages not fetched into {folder}")
    assert cached_packages(folder) == list(SPARK_PACKAGES)
