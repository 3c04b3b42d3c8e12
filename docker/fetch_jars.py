"""Image build step: resolve Spark packages (with their dependencies) into pyspark/jars.

Usage: python docker/fetch_jars.py GROUP:ARTIFACT:VERSION[,...]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pyspark
from pyspark.sql import SparkSession


def main(packages: str) -> None:
    ivy = Path(tempfile.mkdtemp(prefix="ivy-"))
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.jars.packages", packages)
        .config("spark.jars.ivy", str(ivy))
        .getOrCreate()
    )
    spark.stop()
    target = Path(pyspark.__file__).parent / "jars"
    present = {jar.name for jar in target.glob("*.jar")}
    fetched = sorted((ivy / "jars").glob("*.jar"))
    if not fetched:
        raise SystemExit(f"no jars resolved for {packages}")
    for jar in fetched:
        if jar.name not in present:  # Spark's own copy of a shared dependency wins
            shutil.copy2(jar, target / jar.name)
            print(f"added {jar.name}")
    shutil.rmtree(ivy)


if __name__ == "__main__":
    main(sys.argv[1])
