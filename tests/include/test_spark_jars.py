"""The Spark packages: one list for `make install` and the image, matching pyspark, fetched into a
cache that sessions use, and a clear reason (with the fix) where they are missing."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from include import spark_jars
from include.spark import (
    cached_spark_jars,
    delta_spark_unavailable_reason,
    session_jars,
)
from include.spark_jars import SPARK_PACKAGES, cached_packages
from speed_layer.sources import kafka_unavailable_reason

ROOT = Path(__file__).resolve().parents[2]
COORDINATES = re.compile(r"[\w.-]+:[\w.-]+_2\.1[23]:\d[\w.-]*")  # group:artifact_SCALA:version


def test_make_install_and_the_image_fetch_the_same_list() -> None:
    """Both run include/spark_jars.py, and neither names a package of its own."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"RUN python include/spark_jars\.py --into \"\$SPARK_HOME/jars\" --merge", dockerfile)
    assert "COPY include/spark_jars.py include/spark_jars.py" in dockerfile
    assert re.search(r"\t\$\(BIN\)/python include/spark_jars\.py --into \$\(SPARK_JARS\) --offline-ok", makefile)
    assert re.search(r"^install: .*\$\(SPARK_JARS\)/\.packages", makefile, re.MULTILINE)
    assert COORDINATES.findall(dockerfile) == COORDINATES.findall(makefile) == []
    assert all(COORDINATES.fullmatch(package) for package in SPARK_PACKAGES)


def test_the_packages_match_the_pinned_pyspark_and_delta() -> None:
    from importlib.metadata import version

    spark_minor = ".".join(pyspark.__version__.split(".")[:2])
    delta = next(p for p in SPARK_PACKAGES if p.startswith("io.delta:"))
    kafka = next(p for p in SPARK_PACKAGES if ":spark-sql-kafka-0-10_" in p)
    assert delta.split(":")[1] == f"delta-spark_{spark_minor}_2.13"  # Delta's build for this Spark
    assert delta.split(":")[2].split(".")[:2] == version("delta-spark").split(".")[:2]  # its Python API's release
    assert kafka.split(":")[2] == pyspark.__version__


def test_offline_the_fetch_says_why_in_one_line_and_leaves_no_cache(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(spark_jars, "MAVEN_CENTRAL", "http://127.0.0.1:9/maven2")  # nothing listens
    assert spark_jars.main(["--into", str(tmp_path / "jars"), "--offline-ok"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and ("not fetched, so Spark cannot write the lakehouse (delta-spark) nor read Kafka: "
                              "Maven Central is unreachable") in out[0]
    assert spark_jars.cached_jars(tmp_path / "jars") == [] and not (tmp_path / "jars").exists()
    assert spark_jars.main(["--into", str(tmp_path / "jars")]) == 1  # without --offline-ok it fails


def test_without_the_cache_the_reasons_name_the_folder_and_the_command(settings) -> None:
    empty = settings.model_copy(update={"spark_jars_dir": settings.home / "no-jars"})
    for reason in (delta_spark_unavailable_reason(empty), kafka_unavailable_reason(empty)):
        assert reason is not None and str(empty.spark_jars_dir) in reason and "`make install`" in reason
        assert "unreachable" not in reason


def test_the_fetched_cache_puts_delta_and_kafka_on_the_session(spark, settings) -> None:
    if not cached_spark_jars(settings):
        print(f"SKIP fetched Spark packages: none in {settings.spark_jars_dir} (Maven Central unreachable)")
        pytest.skip(f"fetched Spark packages: none in {settings.spark_jars_dir}")
    assert cached_packages(settings.spark_jars_dir) == list(SPARK_PACKAGES)
    assert delta_spark_unavailable_reason(settings) is None and kafka_unavailable_reason(settings) is None
    assert set(spark.conf.get("spark.jars").split(",")) >= set(session_jars(settings))
    jvm = spark._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    for name in ("io.delta.tables.DeltaTable", "org.apache.spark.sql.kafka010.KafkaSourceProvider"):
        assert jvm.java.lang.Class.forName(name, False, loader).getName() == name
