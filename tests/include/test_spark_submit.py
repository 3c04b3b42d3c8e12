"""What makes Spark unable to run at all: each a one-line reason (the task then fails without retry)."""

from __future__ import annotations

import os

import pytest

from include.spark_submit import SparkNotRunnable, check_runnable, installed_spark_bin

JAVA_ENV = {"JAVA_HOME": os.environ.get("JAVA_HOME", ""), "PATH": os.environ.get("PATH", "")}


def test_pyspark_ships_the_spark_submit_the_dags_use():
    assert (installed_spark_bin() / "spark-submit").exists()


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,2]", "spark://spark-master:7077",
                                    "spark://a:7077,b:7077", "k8s://https://10.0.0.1:6443"])
def test_master_urls_spark_accepts(master):
    check_runnable(master, "spark-submit",
                   {**JAVA_ENV, "PATH": f"{installed_spark_bin()}{os.pathsep}{JAVA_ENV['PATH']}"})


@pytest.mark.parametrize("master, binary, env, reason", [
    ("local[2]", "spark3-submit", {}, "'spark3-submit' is neither on PATH nor in pyspark's bin"),
    ("yarm", "spark-submit", {}, "master 'yarm' is not local[N], spark://HOST:PORT, yarn or k8s://URL"),
    ("spark://spark-master", "spark-submit", {}, "master 'spark://spark-master' is not"),
    ("yarn", "spark-submit", {}, "master 'yarn' needs HADOOP_CONF_DIR or YARN_CONF_DIR"),
    ("local[2]", "spark-submit", {"JAVA_HOME": "/nonexistent"}, "no Java"),
])
def test_spark_that_cannot_run_says_why_in_one_line(master, binary, env, reason):
    environ = {**JAVA_ENV, "PATH": f"{installed_spark_bin()}{os.pathsep}{JAVA_ENV['PATH']}", **env}
    with pytest.raises(SparkNotRunnable) as refused:
        check_runnable(master, binary, environ)
    assert reason in str(refused.value) and "\n" not in str(refused.value)
