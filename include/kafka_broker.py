"""Apache Kafka's own broker as a local process: the broker docker-compose.yml runs, without Docker.

One node in KRaft mode, broker and controller combined, configured as the compose service is
(``KAFKA_*`` there, ``server.properties`` here). Its jars come from Maven Central through the
project's ``include/jvm/kafka-broker.pom.xml`` (``mvn dependency:copy-dependencies``), fetched
once into ``~/.cache/lambdalake/kafka-<version>``. The tests start one per session; a person
runs ``lambdalake kafka up`` / ``lambdalake kafka down``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from include.jvm import cache_dir, jdk_tool
from include.processes import process_alive

POM = Path(__file__).with_name("jvm") / "kafka-broker.pom.xml"
KAFKA_VERSION = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text()).group(1)
BROKER_CLASS = "kafka.Kafka"
STORAGE_TOOL_CLASS = "kafka.tools.StorageTool"
HEAP = "-Xmx512m"
START_SECONDS = 90
STOP_SECONDS = 30
# The broker's own messages at WARN and above, to its log file.
LOG_CONFIG = """\
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.clients.name = org.apache.kafka
logger.clients.level = WARN
"""


class BrokerUnavailable(RuntimeError):
    """The broker's jars could not be fetched, or it did not start."""


def _cache_dir() -> Path:
    return cache_dir(f"kafka-{KAFKA_VERSION}")


def broker_unavailable_reason() -> str | None:
    """None when the broker can run here (its jars fetched, or Java and Maven to fetch them)."""
    if not jdk_tool("java"):
        return "no java on PATH or in $JAVA_HOME"
    if (_cache_dir() / ".complete").is_file():
        return None
    if not shutil.which("mvn"):
        return f"Apache Kafka {KAFKA_VERSION} is not fetched yet and Maven (mvn) is not installed to fetch it"
    return None


def broker_jars() -> Path:
    """The folder of the broker's jars, fetched from Maven Central the first time."""
    folder = _cache_dir()
    if (folder / ".complete").is_file():
        return folder
    reason = broker_unavailable_reason()
    if reason:
        raise BrokerUnavailable(reason)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetching-", dir=folder.parent))
    try:
        done = subprocess.run(
            ["mvn", "-q", "-B", "-f", str(POM), "dependency:copy-dependencies", "-DincludeScope=runtime",
             f"-DoutputDirectory={work / 'jars'}"],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0 or not list((work / "jars").glob("kafka_2.13-*.jar")):
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-5:])
            raise BrokerUnavailable(f"Maven could not fetch Apache Kafka {KAFKA_VERSION}: {tail}")
        (work / "jars" / ".complete").write_text(KAFKA_VERSION + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        (work / "jars").rename(folder)  # whole or not at all: a concurrent fetch finds it complete
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_properties(data_dir: Path, port: int, controller_port: int, partitions: int = 3) -> dict[str, str]:
    """compose's ``KAFKA_*`` environment of the kafka service, for one node on 127.0.0.1."""
    return {
        "node.id": "1",
        "process.roles": "broker,controller",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "num.partitions": str(partitions),
        "auto.create.topics.enable": "false",
        "log.retention.hours": "168",
        "log.dirs": str(data_dir / "log"),
        # One node: a consumer group need not wait for others to join.
        "group.initial.rebalance.delay.ms": "0",
    }


class KafkaBroker:
    """One KRaft node whose log lives in ``data_dir``; it keeps its ports (and its topics) across
    :meth:`stop` and :meth:`start`, as a restarted broker does."""

    def __init__(self, data_dir: Path, port: int | None = None, controller_port: int | None = None) -> None:
        self.data_dir = Path(data_dir)
        self.port = port or free_port()
        self.controller_port = controller_port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "broker.log"

    def _java(self, main: str, *args: str) -> list[str]:
        return [jdk_tool("java"), HEAP, f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                "-cp", str(broker_jars() / "*"), main, *args]

    def _configure(self) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "server.properties"
        properties = server_properties(self.data_dir, self.port, self.controller_port)
        config.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))
        (self.data_dir / "log4j2.properties").write_text(LOG_CONFIG)
        if not (self.data_dir / "log" / "meta.properties").is_file():  # `kafka-storage format`, once
            cluster_id = uuid.uuid4().hex[:22]
            done = subprocess.run(self._java(STORAGE_TOOL_CLASS, "format", "-t", cluster_id, "-c", str(config)),
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise BrokerUnavailable(f"kafka-storage format failed: {(done.stdout + done.stderr).strip()}")
        return config

    def start(self, detach: bool = False) -> KafkaBroker:
        """Start the broker and wait until it answers metadata requests. ``detach``: in a session
        of its own, so it outlives this process (``lambdalake kafka up``)."""
        config = self._configure()
        with self.log_file.open("a") as out:
            self.process = subprocess.Popen(self._java(BROKER_CLASS, str(config)), stdout=out,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=detach)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_SECONDS) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerUnavailable(f"the Kafka broker exited ({self.process.returncode}): {self._log_tail()}")
            try:
                if admin.list_topics(timeout=2).brokers:
                    return
            except Exception:  # noqa: BLE001 - any failure here means "not yet"
                pass
            if time.monotonic() > deadline:
                raise BrokerUnavailable(f"the Kafka broker did not answer within {timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.3)

    def _log_tail(self) -> str:
        return " | ".join(self.log_file.read_text(errors="replace").strip().splitlines()[-5:]) \
            if self.log_file.exists() else "no log"

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """A controlled shutdown (SIGTERM: the broker flushes its log), SIGKILL if it hangs."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


# ---- `lambdalake kafka up` / `down`: a broker that outlives the command ------------------------
STATE_FILE = "kafka.json"  # in the home's run/ folder: the broker's pid and ports


def _state(run_dir: Path) -> dict | None:
    import json

    path = run_dir / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def broker_up(home: Path, run_dir: Path, port: int = 9092) -> tuple[str, bool]:
    """Start a detached broker with its log in ``home/kafka`` (its topics survive ``down``);
    returns its address and whether it was started now (False: it was running already)."""
    import json

    state = _state(run_dir)
    if state and process_alive(state["pid"]):
        return f"127.0.0.1:{state['port']}", False
    broker = KafkaBroker(home / "kafka", port, port + 1)
    broker.start(detach=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / STATE_FILE).write_text(json.dumps({"pid": broker.process.pid, "port": broker.port,
                                                  "controller_port": broker.controller_port}))
    return broker.bootstrap_servers, True


def broker_down(run_dir: Path, timeout: float = STOP_SECONDS) -> bool:
    """Stop the broker ``broker_up`` started (SIGTERM, then SIGKILL); False when none ran."""
    state = _state(run_dir)
    (run_dir / STATE_FILE).unlink(missing_ok=True)
    if not state or not process_alive(state["pid"]):
        return False
    os.kill(state["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while process_alive(state["pid"]) and time.monotonic() < deadline:
        with_child_reaped(state["pid"])
        time.sleep(0.2)
    if process_alive(state["pid"]):
        os.kill(state["pid"], signal.SIGKILL)
    return True


def with_child_reaped(pid: int) -> None:
    """Collect the broker's exit status if this process started it (else it stays a zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
