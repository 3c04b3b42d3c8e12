"""``lambdalake up --cluster`` (``make cluster-local-up``): what docker-compose.yml starts in
containers, started here as processes on one machine, without Docker.

The same services under the same names (:data:`SERVICES`, one-shots in :data:`ONE_SHOTS`), the same
``LAMBDALAKE_*`` settings (:func:`lambdalake_env`, compose's ``x-lambdalake-env``), the same Airflow
configuration and connections (:func:`airflow_cluster_env`, compose's ``x-airflow``) and the same
Spark packages (``include/spark_jars.py``, fetched by ``make install``); tests/deployment compares
them with compose's. Differences, because everything shares one machine: every listener is on
127.0.0.1 on ports of this machine, PostgreSQL is the server the ``pgserver`` package ships (a
root user runs it as ``nobody``, as PostgreSQL refuses root), and the lake, checkpoints and
Airflow's logs are folders of the lambdalake home rather than volumes.

Each long-running service is a process group recorded in ``run/<service>.pid``; ``down``
(``lambdalake.platform.down``) stops exactly those, and the stream the supervisor started.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import pwd
import secrets
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from include.config import Settings
from include.schemas import TOPIC_NAMES
from include.spark_submit import CONN_ID, installed_spark_bin
from lambdalake.platform import (
    BIN, _pid_file, _running, _spawn, airflow_env, ensure_password_file, password_file, start_serve,
)

# compose's service names, in start order; `down` stops them in reverse.
SERVICES = ("postgres", "kafka", "spark-master", "spark-worker", "airflow-apiserver", "airflow-scheduler",
            "airflow-dag-processor", "airflow-triggerer", "generator", "serve")
ONE_SHOTS = ("kafka-topics", "airflow-init")  # run to completion before the services that need them
# compose's KAFKA_TOPIC_PARTITIONS default (.env.example).
TOPIC_PARTITIONS = {"clicks": 6, "orders": 3, "payments": 3, "customers_cdc": 1, "sensors": 3}
# Every application gets one core unless it asks for more, so the stream (which never ends)
# leaves the nightly batch's applications a core of a two-core worker.
SPARK_MASTER_OPTS = "-Dspark.deploy.defaultCores=1"
# compose's defaults (.env.example): the worker's cores and memory, the generator's live traffic.
WORKER_CORES, WORKER_MEMORY = 2, "4g"
LIVE_TRAFFIC = ("--follow", "--seed", "42", "--orders-per-hour", "2000")
POSTGRES_USER = "airflow"
ROOT_POSTGRES_USER = "nobody"  # PostgreSQL will not run as root


@dataclass(frozen=True)
class Ports:
    airflow: int = 8080
    serve: int = 8090
    pg_serve: int = 5433
    postgres: int = 5432
    kafka: int = 9092  # the controller listens on the next one
    spark_master: int = 7077
    spark_master_ui: int = 8081
    spark_worker_ui: int = 8082

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.spark_master}"


def _secrets(settings: Settings) -> dict[str, str]:
    """Generated once per home (compose's .env secrets): PostgreSQL's password, the Fernet key,
    the JWT secret."""
    path = settings.run_dir / "cluster-secrets.json"
    if not path.exists():
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps({
            "POSTGRES_PASSWORD": secrets.token_urlsafe(24),
            "AIRFLOW_FERNET_KEY": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW_JWT_SECRET": secrets.token_urlsafe(32),
        }))
    return json.loads(path.read_text())


def lambdalake_env(settings: Settings, ports: Ports) -> dict[str, str]:
    """compose's ``x-lambdalake-env``: what every lambdalake process reads."""
    return {
        "LAMBDALAKE_HOME": str(settings.home),
        "LAMBDALAKE_SPARK_MASTER": ports.master_url,
        "LAMBDALAKE_SPARK_DRIVER_MEMORY": settings.spark_driver_memory,
        "LAMBDALAKE_SHUFFLE_PARTITIONS": str(settings.shuffle_partitions),
        "LAMBDALAKE_EVENT_SOURCE": "kafka",
        "LAMBDALAKE_KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{ports.kafka}",
        "LAMBDALAKE_KAFKA_PARTITIONS": str(settings.kafka_partitions),
        "LAMBDALAKE_ALERT_WEBHOOK_URL": settings.alert_webhook_url,
    }


def base_env(settings: Settings, ports: Ports) -> dict[str, str]:
    # Drivers, executors, master and worker all talk over loopback.
    return {**os.environ, **lambdalake_env(settings, ports), "SPARK_LOCAL_IP": "127.0.0.1"}


def airflow_cluster_env(settings: Settings, ports: Ports) -> dict[str, str]:
    """compose's ``x-airflow`` environment: LocalExecutor on PostgreSQL, the simple auth manager,
    and the connections to the Spark master and to Airflow's own API."""
    secret = _secrets(settings)
    ensure_password_file(settings)  # before airflow_env, which hands the stream the admin's connection
    spark = json.dumps({"conn_type": "spark", "host": "spark://127.0.0.1", "port": ports.spark_master,
                        "extra": {"deploy-mode": "client"}})
    return {
        **airflow_env(settings, ports.airflow),
        **lambdalake_env(settings, ports),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://{POSTGRES_USER}:{secret['POSTGRES_PASSWORD']}"
                                               f"@127.0.0.1:{ports.postgres}/airflow",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "false",
        "AIRFLOW__CORE__FERNET_KEY": secret["AIRFLOW_FERNET_KEY"],
        "AIRFLOW__API_AUTH__JWT_SECRET": secret["AIRFLOW_JWT_SECRET"],
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(password_file(settings)),
        f"AIRFLOW_CONN_{CONN_ID.upper()}": spark,
        "AIRFLOW_CONN_SPARK_DEFAULT": spark,
    }


# ---- PostgreSQL (compose: the postgres:16 image) -----------------------------------------------
def postgres_bin() -> Path:
    """The binaries of the ``pgserver`` package (PostgreSQL 16), without importing it: its module
    registers process-exit hooks that manage a server of its own."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver package is not installed (make install)")
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def postgres_data_dir(settings: Settings) -> Path:
    """In the home; as root, in the temporary folder, owned by ``nobody``: PostgreSQL refuses to
    run as root, and ``nobody`` cannot enter a home under a private folder."""
    if os.geteuid() != 0:
        return settings.home / "postgres"
    tag = hashlib.sha256(str(settings.home).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"lambdalake-postgres-{tag}"


def _as_postgres_user() -> dict:
    return {"user": ROOT_POSTGRES_USER, "group": pwd.getpwnam(ROOT_POSTGRES_USER).pw_gid} if os.geteuid() == 0 else {}


def start_postgres(settings: Settings, ports: Ports) -> None:
    data = postgres_data_dir(settings)
    password = _secrets(settings)["POSTGRES_PASSWORD"]
    if not (data / "PG_VERSION").exists():
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.geteuid() == 0:
            entry = pwd.getpwnam(ROOT_POSTGRES_USER)
            os.chown(data, entry.pw_uid, entry.pw_gid)
        with tempfile.NamedTemporaryFile("w", delete=False) as pwfile:  # initdb wants an empty folder
            pwfile.write(password)
        if os.geteuid() == 0:
            os.chown(pwfile.name, pwd.getpwnam(ROOT_POSTGRES_USER).pw_uid, -1)
        try:
            done = subprocess.run([str(postgres_bin() / "initdb"), "-D", str(data), "-U", POSTGRES_USER, "-E", "UTF8",
                                   "--auth=scram-sha-256", f"--pwfile={pwfile.name}"],
                                  capture_output=True, text=True, cwd="/", **_as_postgres_user())
        finally:
            os.unlink(pwfile.name)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()}")
    # TCP on loopback only, no Unix socket (its default folder belongs to the system's PostgreSQL).
    _spawn(settings, "postgres", [str(postgres_bin() / "postgres"), "-D", str(data), "-h", "127.0.0.1",
                                  "-p", str(ports.postgres), "-c", "unix_socket_directories="],
           dict(os.environ), cwd="/", **_as_postgres_user())
    env = {**os.environ, "PGPASSWORD": password}
    deadline = time.monotonic() + 60
    while subprocess.run([str(postgres_bin() / "pg_isready"), "-h", "127.0.0.1", "-p", str(ports.postgres)],
                         capture_output=True).returncode != 0:
        if not _running(settings, "postgres") or time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL did not start; see {settings.run_dir / 'postgres.log'}")
        time.sleep(0.5)
    server = ["-h", "127.0.0.1", "-p", str(ports.postgres), "-U", POSTGRES_USER]
    exists = subprocess.run([str(postgres_bin() / "psql"), *server, "-d", "postgres", "-tAc",
                             "SELECT 1 FROM pg_database WHERE datname='airflow'"],
                            env=env, capture_output=True, text=True, check=True).stdout.strip()
    if not exists:  # compose's POSTGRES_DB
        subprocess.run([str(postgres_bin() / "createdb"), *server, "airflow"], env=env, check=True, capture_output=True)


# ---- Kafka, Spark ------------------------------------------------------------------------------
def start_kafka(settings: Settings, ports: Ports) -> None:
    from include.generator.kafka import ensure_topics
    from include.kafka_broker import KafkaBroker

    broker = KafkaBroker(settings.home / "kafka", ports.kafka, ports.kafka + 1).start(detach=True)
    _pid_file(settings, "kafka").write_text(str(broker.process.pid))
    for topic in TOPIC_NAMES:  # kafka-topics: each topic with its partitions
        ensure_topics(broker.bootstrap_servers, [topic], TOPIC_PARTITIONS[topic])


def _wait_http(url: str, service: str, settings: Settings, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except OSError:
            if not _running(settings, service) or time.monotonic() > deadline:
                raise RuntimeError(f"{service} did not answer on {url}; see {settings.run_dir / service}.log") from None
            time.sleep(1)


def master_status(ports: Ports) -> dict:
    """The Spark master's JSON status: its workers, running and completed applications."""
    with urllib.request.urlopen(f"http://127.0.0.1:{ports.spark_master_ui}/json/", timeout=10) as response:
        return json.loads(response.read())


def start_spark(settings: Settings, ports: Ports, worker_cores: int = WORKER_CORES,
                worker_memory: str = WORKER_MEMORY) -> None:
    spark_class = str(installed_spark_bin() / "spark-class")
    env = {**base_env(settings, ports), "SPARK_MASTER_OPTS": SPARK_MASTER_OPTS}
    _spawn(settings, "spark-master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                      "--port", str(ports.spark_master), "--webui-port", str(ports.spark_master_ui)],
           env)
    _wait_http(f"http://127.0.0.1:{ports.spark_master_ui}/json/", "spark-master", settings, 60)
    work = settings.home / "spark-work"
    work.mkdir(parents=True, exist_ok=True)
    _spawn(settings, "spark-worker", [spark_class, "org.apache.spark.deploy.worker.Worker", ports.master_url,
                                      "--host", "127.0.0.1", "--cores", str(worker_cores), "--memory", worker_memory,
                                      "--webui-port", str(ports.spark_worker_ui), "--work-dir", str(work)], env)
    deadline = time.monotonic() + 60
    while not any(w["state"] == "ALIVE" for w in master_status(ports)["workers"]):
        if not _running(settings, "spark-worker") or time.monotonic() > deadline:
            raise RuntimeError(f"the Spark worker did not register; see {settings.run_dir / 'spark-worker.log'}")
        time.sleep(1)


# ---- Airflow -----------------------------------------------------------------------------------
def start_airflow_components(settings: Settings, ports: Ports, timeout: float = 300) -> str:
    """airflow-init (migrate, the admin's password file), then the four components."""
    env = airflow_cluster_env(settings, ports)
    airflow = str(BIN / "airflow")
    migrate = subprocess.run([airflow, "db", "migrate"], env=env, capture_output=True, text=True)
    if migrate.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed: {migrate.stderr.strip().splitlines()[-1:]}")
    # No task-log servers: they bind every interface; the API server reads the log files.
    for service, command in (("airflow-apiserver", ["api-server", "--port", str(ports.airflow)]),
                             ("airflow-scheduler", ["scheduler", "--skip-serve-logs"]),
                             ("airflow-dag-processor", ["dag-processor"]),
                             ("airflow-triggerer", ["triggerer", "--skip-serve-logs"])):
        _spawn(settings, service, [airflow, *command], env)
    url = f"http://127.0.0.1:{ports.airflow}"
    _wait_http(f"{url}/api/v2/monitor/health", "airflow-apiserver", settings, timeout)
    return url


def cluster_up(settings: Settings, ports: Ports = Ports(), generator_args: list[str] | None = None,
               worker_cores: int = WORKER_CORES, worker_memory: str = WORKER_MEMORY) -> str:
    """Start every service of compose's as a process; returns Airflow's URL. ``generator_args``:
    what the generator produces (default: compose's live traffic)."""
    running = [service for service in SERVICES if _running(settings, service)]
    if running:
        raise RuntimeError(f"{', '.join(running)} already running for {settings.home} (lambdalake down first)")
    start_postgres(settings, ports)
    start_kafka(settings, ports)
    start_spark(settings, ports, worker_cores, worker_memory)
    url = start_airflow_components(settings, ports)
    generator = LIVE_TRAFFIC if generator_args is None else generator_args
    _spawn(settings, "generator", [str(BIN / "lambdalake"), "generate", "--home", str(settings.home),
                                   "--sink", "kafka", *generator], base_env(settings, ports))
    # The serving API reads the same tables with delta-rs, without a Spark session (as compose's).
    start_serve(settings, ports.serve, pg_port=ports.pg_serve, env=base_env(settings, ports))
    return url

