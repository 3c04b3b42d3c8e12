"""Spark applications from anyone's Airflow: :class:`SparkJobOperator`.

It needs neither ``spark-submit`` on the caller's ``PATH`` nor a connection: the binary comes
from the installed pyspark unless the connection names another, and the ``lambdalake_spark``
connection falls back to ``LAMBDALAKE_SPARK_MASTER`` (default ``local[*]``) when it is not
defined. When Spark cannot run at all (no binary, no Java, a master that is not a master URL,
YARN without its configuration), the task fails at once with one line and is not retried;
failures of a running application are retried as usual.

Given ``lineage`` (the application's own: arguments -> tables), it tells the OpenLineage provider
which tables a submission reads and writes (docs/lineage.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

from include.spark import LOCAL_MASTER

if TYPE_CHECKING:
    from airflow.providers.openlineage.extractors import OperatorLineage

    from include.lineage import Lineage

CONN_ID = "lambdalake_spark"
MASTER = re.compile(LOCAL_MASTER.pattern + r"|spark://[^/\s]+:\d+(,[^/\s]+:\d+)*|yarn|k8s://\S+|mesos://\S+")


class SparkNotRunnable(Exception):
    """Spark cannot start here at all; retrying changes nothing."""


def installed_spark_bin() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin"


def spark_master_fallback() -> str:
    from include.config import load_settings

    return load_settings().spark_master


def check_runnable(master: str, binary: str, environ: dict[str, str]) -> None:
    """Raise :class:`SparkNotRunnable` with one line saying what to fix."""
    if shutil.which(binary, path=environ.get("PATH")) is None:
        raise SparkNotRunnable(f"Spark cannot run: '{binary}' is neither on PATH nor in pyspark's bin "
                               f"(set the connection's spark-binary to one that exists, or install pyspark)")
    java = (Path(environ["JAVA_HOME"]) / "bin" / "java" if environ.get("JAVA_HOME")
            else shutil.which("java", path=environ.get("PATH")))
    if java is None or not Path(java).exists():
        raise SparkNotRunnable("Spark cannot run: no Java (set JAVA_HOME or put java on PATH)")
    if not MASTER.fullmatch(master):
        raise SparkNotRunnable(f"Spark cannot run: master '{master}' is not local[N], spark://HOST:PORT, yarn or "
                               f"k8s://URL (connection {CONN_ID}, else LAMBDALAKE_SPARK_MASTER)")
    if master == "yarn" and not (environ.get("HADOOP_CONF_DIR") or environ.get("YARN_CONF_DIR")):
        raise SparkNotRunnable("Spark cannot run: master 'yarn' needs HADOOP_CONF_DIR or YARN_CONF_DIR")


class SparkJobOperator(SparkSubmitOperator):
    """``SparkSubmitOperator`` on the ``lambdalake_spark`` connection, runnable anywhere."""

    def __init__(self, *, lineage: Callable[[list[str]], Lineage] | None = None, **kwargs: Any) -> None:
        super().__init__(conn_id=CONN_ID, **kwargs)
        self.lineage = lineage

    def get_openlineage_facets_on_start(self) -> OperatorLineage | None:
        """The tables this submission reads and writes (the provider asks at start and end, only
        while lineage is on)."""
        if self.lineage is None:
            return None
        from include.config import load_settings
        from include.lineage import operator_lineage

        return operator_lineage(load_settings(), self.lineage(list(self.application_args or [])))

    def execute(self, context: Any) -> None:
        from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException
        from airflow.sdk import Connection

        fallback = {}
        try:
            Connection.get(CONN_ID)
        except AirflowNotFoundException:
            fallback[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = json.dumps(
                {"conn_type": "spark", "host": spark_master_fallback()}
            )
        path = os.pathsep.join([os.environ.get("PATH", ""), str(installed_spark_bin())]).lstrip(os.pathsep)
        # dag.test() runs tasks in its own process: the fallback must not outlive this task.
        with _environ(PATH=path, **fallback):
            resolved = self._get_hook()._connection  # what spark-submit will get (provider 6.3's resolved connection)
            try:
                check_runnable(resolved["master"], resolved["spark_binary"], dict(os.environ))
            except SparkNotRunnable as exc:
                raise AirflowFailException(str(exc)) from None
            if not self.jars:
                # Under spark-submit the JVM starts before the job builds its session, too early for
                # the session's spark.jars: the fetched Spark packages (delta-spark) go here.
                from include.config import load_settings
                from include.spark import session_jars

                self.jars = ",".join(session_jars(load_settings())) or None
            return super().execute(context)


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
