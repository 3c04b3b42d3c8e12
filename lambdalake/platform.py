"""``make up`` / ``make down``: the embedded platform on one machine.

``up`` starts ``airflow standalone`` (SQLite, LocalExecutor) with this project's DAGs, examples
off and AIRFLOW_HOME under the lambdalake home; the generator in ``--follow`` mode; ``lambdalake
serve`` (SQL API, dashboard, PostgreSQL protocol); and unpauses ``speed_layer_supervisor``, which
starts the stream. ``down`` stops exactly what ``up`` started (process groups recorded in pid files) and
the stream.

Every service listens on ``LAMBDALAKE_BIND_HOST`` (default 127.0.0.1, this machine only):
Airflow's API server (``[api] host``), ``lambdalake serve``, and the Spark drivers that Airflow's
tasks start (``SPARK_LOCAL_IP``, with a local master). The scheduler and the triggerer run without
their task-log servers, which Airflow binds to every interface: on one machine the API server reads
the task logs from their files.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from include.config import Settings
from include.processes import group_alive, stop_group

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SERVICES = ("airflow", "generator", "serve")


LOOPBACK = ("127.0.0.1", "localhost", "::1")


def reachable_host(bind_host: str) -> str:
    """The address a local client uses for a service listening on ``bind_host``."""
    if bind_host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{bind_host}]" if ":" in bind_host else bind_host


def airflow_bin(settings: Settings) -> Path:
    """A folder first on ``airflow standalone``'s PATH: its ``airflow`` starts the scheduler and the
    triggerer with ``--skip-serve-logs`` (Airflow binds those log servers to every interface and
    has no setting for it) and passes everything else to the installed ``airflow``."""
    folder = settings.run_dir / "airflow-bin"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "airflow"
    script.write_text(
        "#!/bin/sh\n"
        "# Written by `lambdalake up` (lambdalake/platform.py): no task-log servers on every interface.\n"
        'case "$1" in\n'
        f'  scheduler|triggerer) exec "{BIN / "airflow"}" "$@" --skip-serve-logs ;;\n'
        "esac\n"
        f'exec "{BIN / "airflow"}" "$@"\n'
    )
    script.chmod(0o755)
    return folder


def airflow_env(settings: Settings, port: int) -> dict[str, str]:
    """Environment for Airflow and everything it runs: one lambdalake home, this project's DAGs,
    every listener on the bind host, and the ``lambdalake_airflow`` connection (the admin's
    credentials) with which the stream posts its asset events."""
    from include.airflow_events import AIRFLOW_CONN_ENV

    host = reachable_host(settings.bind_host)
    env = {
        **os.environ,
        "LAMBDALAKE_HOME": str(settings.home),
        "AIRFLOW_HOME": str(settings.airflow_home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(PROJECT / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__API__HOST": settings.bind_host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{port}/execution/",
        # `airflow standalone` starts its scheduler, API server etc. as `airflow ...` from PATH.
        "PATH": f"{airflow_bin(settings)}{os.pathsep}{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    if password_file(settings).exists():
        env[AIRFLOW_CONN_ENV] = json.dumps({"conn_type": "http", "host": host.strip("[]"), "port": port,
                                            "login": "admin", "password": admin_password(settings)})
    if settings.bind_host in LOOPBACK and settings.spark_master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # Spark drivers: not on the machine's network address
    return env


def _pid_file(settings: Settings, service: str) -> Path:
    return settings.run_dir / f"{service}.pid"


def _running(settings: Settings, service: str) -> int | None:
    path = _pid_file(settings, service)
    if not path.exists():
        return None
    pid = int(path.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def _spawn(settings: Settings, service: str, command: list[str], env: dict[str, str], **popen: object) -> int:
    """Start ``service`` in a process group of its own, logging to run/<service>.log; ``popen``:
    more of ``subprocess.Popen``'s arguments (a working folder, another user)."""
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with (settings.run_dir / f"{service}.log").open("ab") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, **popen)
    _pid_file(settings, service).write_text(str(process.pid))
    return process.pid


def start_airflow(settings: Settings, port: int = 8080, timeout: float = 300) -> str:
    """Start ``airflow standalone`` and wait until its API answers; returns the base URL."""
    if _running(settings, "airflow"):
        raise RuntimeError(f"airflow is already running for {settings.home} (make down first)")
    ensure_password_file(settings)
    _spawn(settings, "airflow", [str(BIN / "airflow"), "standalone"], airflow_env(settings, port))
    url = f"http://{reachable_host(settings.bind_host)}:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5) as response:
                if response.status == 200 and password_file(settings).exists():
                    return url
        except OSError:
            pass
        if not _running(settings, "airflow"):
            raise RuntimeError(f"airflow standalone exited; see {settings.run_dir / 'airflow.log'}")
        time.sleep(2)
    raise RuntimeError(f"airflow did not answer on {url} within {timeout:.0f}s; see {settings.run_dir / 'airflow.log'}")


def start_serve(settings: Settings, port: int = 8090, timeout: float = 60, pg_port: int | None = None,
                env: dict[str, str] | None = None) -> str:
    """Start ``lambdalake serve`` (unless running; ``pg_port``: its PostgreSQL port, else its
    default; ``env``: its environment, else this process's) and wait until it answers; returns its
    base URL."""
    url = f"http://{reachable_host(settings.bind_host)}:{port}"
    if not _running(settings, "serve"):
        pg = [] if pg_port is None else ["--pg-port", str(pg_port)]
        _spawn(settings, "serve", [str(BIN / "lambdalake"), "serve", "--home", str(settings.home),
                                   "--host", settings.bind_host, "--port", str(port), *pg], dict(env or os.environ))
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).close()
            return url
        except OSError:
            if not _running(settings, "serve") or time.monotonic() > deadline:
                raise RuntimeError(
                    f"lambdalake serve did not answer on {url}; see {settings.run_dir / 'serve.log'}"
                ) from None
            time.sleep(0.5)


def password_file(settings: Settings) -> Path:
    return settings.airflow_home / "simple_auth_manager_passwords.json.generated"


def ensure_password_file(settings: Settings) -> Path:
    """The admin's password, chosen before Airflow starts so that the connection the stream gets
    (``airflow_env``) can carry it."""
    if not password_file(settings).exists():
        settings.airflow_home.mkdir(parents=True, exist_ok=True)
        password_file(settings).touch(mode=0o600)
        password_file(settings).write_text(json.dumps({"admin": secrets.token_urlsafe(16)}))
    return password_file(settings)


def admin_password(settings: Settings) -> str:
    return json.loads(password_file(settings).read_text())["admin"]


def airflow_cli(settings: Settings, port: int, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "airflow"), *args], env=airflow_env(settings, port),
                          capture_output=True, text=True)


def up(settings: Settings, port: int = 8080, serve_port: int = 8090, orders_per_hour: float = 2000.0,
       pg_port: int | None = None) -> str:
    url = start_airflow(settings, port)
    if not _running(settings, "generator"):
        _spawn(settings, "generator", [str(BIN / "lambdalake"), "generate", "--home", str(settings.home), "--follow",
                                       "--orders-per-hour", str(orders_per_hour)], dict(os.environ))
    start_serve(settings, serve_port, pg_port=pg_port)
    deadline = time.monotonic() + 120  # the DAG processor needs a moment to register the DAGs
    while airflow_cli(settings, port, "dags", "unpause", "speed_layer_supervisor").returncode != 0:
        if time.monotonic() > deadline:
            raise RuntimeError("could not unpause speed_layer_supervisor; see the Airflow log")
        time.sleep(3)
    return url


def _stop_service(settings: Settings, service: str) -> str | None:
    path = _pid_file(settings, service)
    if not path.exists():
        return None
    pgid = int(path.read_text())
    alive = group_alive(pgid)
    if alive:
        stop_group(pgid)
    path.unlink()
    return f"{service} (pid {pgid})" if alive else None


def _task_groups(settings: Settings) -> set[int]:
    """The process groups of everything under the recorded services that runs in a group of its
    own: Airflow runs each task so, and a task's spark-submit driver can outlive the scheduler."""
    import psutil

    recorded = {path.stem: int(path.read_text()) for path in settings.run_dir.glob("*.pid")}
    groups = set()
    for service, pgid in recorded.items():
        # PostgreSQL makes each of its processes a group leader and stops them itself; its
        # checkpointer ignores SIGTERM, so signalled alone it was SIGKILLed (crash recovery).
        if service == "postgres":
            continue
        try:
            for child in psutil.Process(pgid).children(recursive=True):
                groups.add(os.getpgid(child.pid))
        except (psutil.Error, ProcessLookupError, ValueError):
            continue  # it ended meanwhile
    return groups - set(recorded.values())


def down(settings: Settings) -> list[str]:
    """Stop what ``up`` (or ``up --cluster``) started, and the stream the supervisor started: the
    producers and Airflow first (so nothing restarts the stream), then the stream, then what the
    stream and Airflow need. Returns what was stopped."""
    from lambdalake.cluster import SERVICES as CLUSTER_SERVICES
    from speed_layer.supervisor import stop_stream, stream_pid

    split = CLUSTER_SERVICES.index("airflow-apiserver")
    tasks = _task_groups(settings)
    stopped = [_stop_service(settings, service) for service in (*SERVICES, *reversed(CLUSTER_SERVICES[split:]))]
    if stream_pid(settings):
        stop_stream(settings)
        stopped.append("stream")
    for pgid in tasks - {stream_pid(settings)}:  # what a task left running (a spark-submit driver)
        if group_alive(pgid):
            stop_group(pgid)
            stopped.append(f"task process group {pgid}")
    stopped += [_stop_service(settings, service) for service in reversed(CLUSTER_SERVICES[:split])]
    return [name for name in stopped if name]
