"""Static checks of the cluster deployment (docker-compose.yml, docker/). No Docker engine runs
here and no image can be pulled, so the deployment is checked as far as this machine allows:
the file parses and `docker-compose config` accepts it, every variable it sets is one its
reader knows, every file it mounts or builds from exists, and its names agree with the code."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from include.airflow_events import AIRFLOW_CONN_ID
from include.config import Settings, load_settings
from include.schemas import TOPIC_NAMES
from include.spark_submit import CONN_ID, MASTER

PROJECT = Path(__file__).resolve().parents[2]
COMPOSE = PROJECT / "docker-compose.yml"
SECRETS = (
    "POSTGRES_PASSWORD", "AIRFLOW_FERNET_KEY", "AIRFLOW_JWT_SECRET", "AIRFLOW_ADMIN_PASSWORD", "LAMBDALAKE_SERVE_TOKEN"
)
PROJECT_IMAGE = "lambdalake:"
# Variables of the third-party images (their documentation), by image.
IMAGE_VARIABLES = {
    "postgres": {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB"},
    "apache/kafka": {"KAFKA_NODE_ID", "KAFKA_PROCESS_ROLES", "KAFKA_LISTENERS", "KAFKA_ADVERTISED_LISTENERS",
                     "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "KAFKA_CONTROLLER_LISTENER_NAMES",
                     "KAFKA_INTER_BROKER_LISTENER_NAME", "KAFKA_CONTROLLER_QUORUM_VOTERS",
                     "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
                     "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "KAFKA_NUM_PARTITIONS", "KAFKA_AUTO_CREATE_TOPICS_ENABLE",
                     "KAFKA_LOG_RETENTION_HOURS", "KAFKA_LOG_DIRS"},
}
# Read by the airflow-init command (it writes the admin password file), and by spark-class.
COMMAND_VARIABLES = {"AIRFLOW_ADMIN_PASSWORD", "SPARK_MASTER_OPTS"}


def example_env(tmp_path: Path) -> Path:
    """.env.example with its secrets filled in, as a user's .env would be."""
    text = (PROJECT / ".env.example").read_text()
    for name in SECRETS:
        text = re.sub(rf"^{name}=$", f"{name}=test-{name.lower()}", text, flags=re.M)
    env = tmp_path / ".env"
    env.write_text(text)
    return env


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())  # resolves the anchors and merge keys


@pytest.fixture(scope="module")
def services(compose) -> dict:
    return compose["services"]


def environment(service: dict) -> dict[str, str]:
    return {key: str(value) for key, value in (service.get("environment") or {}).items()}


def interpolated(value: str) -> str:
    """``${NAME:-default}`` → default (what compose uses when .env leaves it unset)."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", value)


def test_the_deployment_has_every_service_the_architecture_names(services):
    assert {"kafka", "kafka-topics", "spark-master", "spark-worker", "postgres", "airflow-init", "airflow-apiserver",
            "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer", "generator", "serve"} <= set(services)
    for name, service in services.items():
        assert service.get("restart") in ("unless-stopped", "no"), name
        if service.get("restart") == "unless-stopped":  # long-running: limited and (but the generator) health-checked
            assert "mem_limit" in service and "cpus" in service, name
            assert "healthcheck" in service or name == "generator", name


def test_docker_compose_config_accepts_it_and_refuses_to_start_without_secrets(tmp_path):
    cli = shutil.which("docker-compose")
    if cli is None:
        reason = "docker-compose is not installed (Debian: apt-get install docker-compose; it needs no daemon)"
        print(f"SKIP docker-compose config: {reason}")
        pytest.skip(reason)
    env = example_env(tmp_path)
    ok = subprocess.run(
        [cli, "--project-directory", str(PROJECT), "--env-file", str(env), "-f", str(COMPOSE), "config"],
        capture_output=True, text=True,
    )
    assert ok.returncode == 0, ok.stderr
    resolved = yaml.safe_load(ok.stdout)
    assert resolved["services"]["serve"]["environment"]["LAMBDALAKE_SERVE_TOKEN"] == "test-lambdalake_serve_token"

    missing = subprocess.run([cli, "--project-directory", str(PROJECT), "--env-file", str(PROJECT / ".env.example"),
                              "-f", str(COMPOSE), "config"], capture_output=True, text=True)
    assert missing.returncode != 0 and "in .env" in missing.stderr


def test_no_secret_is_committed():
    example = dict(line.split("=", 1) for line in (PROJECT / ".env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert all(example[name] == "" for name in SECRETS)
    text = COMPOSE.read_text()
    for name in SECRETS:
        assert re.search(rf"\$\{{{name}:\?", text), f"{name} must come from .env, with no default"
    assert ".env" in (PROJECT / ".gitignore").read_text().split()
    assert ".env" in (PROJECT / ".dockerignore").read_text().split()


def test_every_variable_is_one_its_reader_knows(services):
    from airflow.configuration import conf

    airflow_options = conf.configuration_description
    for name, service in services.items():
        image = service.get("image", "")
        for key in environment(service):
            if image.startswith(PROJECT_IMAGE):
                if key.startswith("LAMBDALAKE_"):
                    assert key.removeprefix("LAMBDALAKE_").lower() in Settings.model_fields, f"{name}: {key}"
                elif key.startswith("AIRFLOW__"):
                    section, option = key.removeprefix("AIRFLOW__").lower().split("__")
                    assert option in airflow_options[section]["options"], f"{name}: {key}"
                elif key.startswith("AIRFLOW_CONN_"):
                    assert key.removeprefix("AIRFLOW_CONN_").lower() in (CONN_ID, "spark_default", AIRFLOW_CONN_ID), \
                        f"{name}: {key}"
                else:
                    assert key in COMMAND_VARIABLES, f"{name}: {key}"
            else:
                known = next(v for prefix, v in IMAGE_VARIABLES.items() if image.startswith(prefix))
                assert key in known, f"{name}: {key}"


def test_the_lambdalake_settings_load(services, monkeypatch):
    for name in ("generator", "serve", "airflow-scheduler"):
        values = {k: interpolated(v) for k, v in environment(services[name]).items() if k.startswith("LAMBDALAKE_")}
        values = {k: v for k, v in values.items() if v and "${" not in v}
        for key, value in values.items():
            monkeypatch.setenv(key, value)
        settings = load_settings()
        assert str(settings.home) == "/lakehouse"
        for key in values:
            monkeypatch.delenv(key)


def test_every_file_it_mounts_or_builds_from_exists(services):
    ignored = (PROJECT / ".dockerignore").read_text().split()
    for name, service in services.items():
        if "build" in service:
            assert (PROJECT / service["build"]["context"] / service["build"]["dockerfile"]).is_file(), name
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (PROJECT / source).exists(), f"{name}: {volume}"
    dockerfile = (PROJECT / "docker" / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", dockerfile, flags=re.M):
        *sources, _ = line.split()
        for source in sources:
            assert (PROJECT / source).exists(), source
            assert source.split("/")[0] not in ignored, f"{source} is in .dockerignore"



def test_the_image_installs_every_package_of_the_project():
    """The ``lambdalake`` command and the Airflow plugin (both in ``lambdalake/``) too."""
    pyproject = tomllib.loads((PROJECT / "pyproject.toml").read_text())
    packages = [name.rstrip("*") for name in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {line.split()[0] for line in re.findall(r"^COPY (.+)$", (PROJECT / "docker" / "Dockerfile").read_text(),
                                                      flags=re.M)}
    assert set(packages) <= copied, set(packages) - copied

def test_airflow_runs_the_dags_of_this_project_on_the_cluster_master(services, monkeypatch):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    scheduler = services["airflow-scheduler"]
    env = environment(scheduler)
    mounts = dict(reversed(v.split(":")[:2]) for v in scheduler["volumes"])
    assert mounts[env["AIRFLOW__CORE__DAGS_FOLDER"]] == "./dags"
    dockerfile = (PROJECT / "docker" / "Dockerfile").read_text()
    workdir = re.search(r"^WORKDIR (\S+)", dockerfile, flags=re.M).group(1)
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == f"{workdir}/dags"
    assert re.search(r"^COPY dags dags$", dockerfile, flags=re.M)

    # What the nightly DAG's spark-submit resolves from the connection is the stream's master.
    for conn_id in (CONN_ID, "spark_default"):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", env[f"AIRFLOW_CONN_{conn_id.upper()}"])
        master = SparkSubmitHook(conn_id=conn_id)._connection["master"]
        assert master == env["LAMBDALAKE_SPARK_MASTER"] and MASTER.fullmatch(master), conn_id
    command = services["spark-master"]["command"]
    host, port = command[command.index("--host") + 1], command[command.index("--port") + 1]
    assert master == f"spark://{host}:{port}" == services["spark-worker"]["command"][2]
    assert services["spark-master"]["hostname"] == host

    for name in ("airflow-scheduler", "spark-worker", "serve"):  # drivers, executors and readers share one lakehouse
        assert "lakehouse:/lakehouse" in services[name]["volumes"], name
    assert json.loads(env[f"AIRFLOW_CONN_{CONN_ID.upper()}"])["conn_type"] == "spark"


def test_kafka_topics_and_bootstrap_servers_agree_with_the_code(services):
    kafka = environment(services["kafka"])
    advertised = dict(item.split("://") for item in kafka["KAFKA_ADVERTISED_LISTENERS"].split(","))
    for name in ("generator", "airflow-scheduler"):
        assert environment(services[name])["LAMBDALAKE_KAFKA_BOOTSTRAP_SERVERS"] == advertised["PLAINTEXT"]
        assert environment(services[name])["LAMBDALAKE_EVENT_SOURCE"] == "kafka"
    assert kafka["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # so the topics are the ones created below
    script = services["kafka-topics"]["command"][0]
    default = re.search(r"for topic in \$\{KAFKA_TOPIC_PARTITIONS:-([^}]+)\};", script).group(1)
    example = re.search(r"^KAFKA_TOPIC_PARTITIONS=(.+)$", (PROJECT / ".env.example").read_text(), flags=re.M).group(1)
    for partitions in (default, example):
        topics = dict(item.split("=") for item in partitions.split())
        assert tuple(topics) == TOPIC_NAMES and all(int(n) >= 1 for n in topics.values())
    generator = services["generator"]["command"]
    assert generator[:4] == ["lambdalake", "generate", "--sink", "kafka"]
    assert "kafka-topics" in services["generator"]["depends_on"]


def test_every_command_is_one_the_cli_accepts(services):
    from lambdalake.cli import build_parser

    parser = build_parser()
    for name in ("generator", "serve"):
        args = [interpolated(a) for a in services[name]["command"]]
        assert args[0] == "lambdalake"
        parser.parse_args(args[1:])  # exits on an unknown option
    init = services["airflow-init"]["command"]
    assert "airflow db migrate" in init[-1] and shlex.split(init[-1].splitlines()[1])[0] == "airflow"


def test_serve_answers_postgres_clients_and_is_health_checked_on_its_health_endpoint(services):
    serve = services["serve"]
    pg_port = serve["command"][serve["command"].index("--pg-port") + 1]
    assert f"{pg_port}:{pg_port}" in serve["ports"]
    assert serve["healthcheck"]["test"][-1].endswith("http://localhost:8090/health")
