"""The Spark packages the platform needs beyond pyspark, and the folder they are fetched into.

One list, used everywhere: ``make install`` fetches it into ``$LAMBDALAKE_SPARK_JARS_DIR``
(default ``<venv>/spark-jars``), the image (``docker/Dockerfile``) into its ``pyspark/jars``, and
:func:`include.spark.get_spark` puts the fetched jars on ``spark.jars``. Spark resolves them
itself (``spark.jars.packages`` through its Ivy), with their dependencies.

Runs as a script too (the image builds before the project is installed), so it imports nothing
of the project::

    python include/spark_jars.py --into DIR [--merge] [--offline-ok]
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

# Delta's artifact for Spark 4.2 (what delta-spark's configure_spark_with_delta_pip names); Maven
# Central has 4.4.0, the PyPI package's 4.4.1 is not published there. The Kafka connector is
# Spark's own, of pyspark's version.
SPARK_PACKAGES = (
    "io.delta:delta-spark_4.2_2.13:4.4.0",
    "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0",
)
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
PACKAGES_STAMP = ".packages"  # the list a folder holds, written once all its jars are in place
ARTIFACT = re.compile(r"(.+?)-\d")  # `lz4-java-1.8.0.jar` → `lz4-java`


def default_jars_dir() -> Path:
    """Where ``make install`` puts the jars: beside the virtual environment running this."""
    return Path(sys.prefix) / "spark-jars"


def cached_jars(folder: Path) -> list[Path]:
    """The jars of a completed fetch into ``folder`` (none while a fetch is under way or failed)."""
    if not (folder / PACKAGES_STAMP).is_file():
        return []
    return sorted(folder.glob("*.jar"))


def cached_packages(folder: Path) -> list[str]:
    """The packages a completed fetch put in ``folder``."""
    stamp = folder / PACKAGES_STAMP
    return stamp.read_text().split() if stamp.is_file() else []


def maven_unreachable_reason(package: str, timeout: float = 10.0) -> str | None:
    """None when Maven Central serves ``package``'s POM; otherwise why not."""
    group, artifact, version = package.split(":")
    url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.pom"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError as exc:
        return f"Maven Central has no {package} (HTTP {exc.code})"
    except (OSError, ValueError) as exc:
        return f"Maven Central is unreachable ({getattr(exc, 'reason', exc)})"


def _resolve(packages: list[str], ivy: Path, log: Path) -> list[Path]:
    """Spark's own resolution in a JVM of its own; its chatter goes to ``log``."""
    program = (
        "import sys\n"
        "from pyspark.sql import SparkSession\n"
        "SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false')"
        ".config('spark.jars.packages', sys.argv[1]).config('spark.jars.ivy', sys.argv[2])"
        ".getOrCreate().stop()\n"
    )
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-c", program, ",".join(packages), str(ivy)],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    fetched = sorted((ivy / "jars").glob("*.jar"))
    if done.returncode != 0 or not fetched:
        lines = log.read_text().strip().splitlines()
        ivy_errors = [line.strip() for line in lines if re.search(r"UNRESOLVED|FAILED|download failed|not found", line)]
        tail = " | ".join(ivy_errors[:5] or lines[-5:])  # Ivy's own complaint, else the traceback's end
        raise RuntimeError(f"Spark could not resolve {','.join(packages)}: {tail}")
    return fetched


def _spark_artifacts() -> set[str]:
    import pyspark

    return {_artifact(jar.name) for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def _artifact(name: str) -> str:
    match = ARTIFACT.match(name)
    return match.group(1) if match else name


def fetch(into: Path, packages: list[str] | tuple[str, ...] = SPARK_PACKAGES, merge: bool = False) -> list[Path]:
    """Resolve ``packages`` and their dependencies into ``into``; the jars it then holds.

    A dependency pyspark ships already (lz4, snappy, slf4j, …) is left out: Spark's own copy wins.
    Without ``merge`` the folder is this cache alone, replaced whole (nothing half-fetched is
    ever seen); with ``merge`` the jars join what is there (an image's ``pyspark/jars``)."""
    packages, into = list(packages), into.resolve()  # Spark takes only an absolute Ivy folder
    if not packages:
        raise ValueError("no Spark packages to fetch")
    if not merge and cached_packages(into) == packages and cached_jars(into):
        return cached_jars(into)
    into.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".fetching-", dir=into.parent))
    try:
        fetched = _resolve(packages, work / "ivy", work / "resolve.log")
        spark_has = _spark_artifacts()
        target = into if merge else work / "jars"
        target.mkdir(parents=True, exist_ok=True)
        for jar in fetched:
            name = jar.name.split("_", 1)[1]  # Ivy names them ORG_ARTIFACT-VERSION.jar
            if _artifact(name) not in spark_has:
                shutil.copy2(jar, target / name)
        if merge:
            return sorted(target.glob("*.jar"))
        (target / PACKAGES_STAMP).write_text("\n".join(packages) + "\n")
        if into.exists():
            shutil.rmtree(into)
        target.rename(into)
        return cached_jars(into)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch the platform's Spark packages with Spark's own resolution.")
    parser.add_argument("--into", type=Path, default=default_jars_dir(), help="target folder (default: %(default)s)")
    parser.add_argument("--merge", action="store_true", help="add to the folder's jars instead of replacing them")
    parser.add_argument("--offline-ok", action="store_true",
                        help="when Maven Central cannot be reached, say so in one line and exit 0")
    args = parser.parse_args(argv)
    if not args.merge and cached_packages(args.into) == list(SPARK_PACKAGES):
        (args.into / PACKAGES_STAMP).touch()  # newer than this file: make sees it up to date
        print(f"Spark packages: up to date in {args.into}")
        return 0
    reason = maven_unreachable_reason(SPARK_PACKAGES[0])
    if reason is not None:
        if args.offline_ok:
            print(f"Spark packages: not fetched, so Spark cannot write the lakehouse (delta-spark) nor read "
                  f"Kafka: {reason}; `make install` fetches them once Maven Central is reachable")
            return 0
        print(f"Spark packages: {reason}", file=sys.stderr)
        return 1
    try:
        jars = fetch(args.into, merge=args.merge)
    except RuntimeError as exc:
        print(f"Spark packages: {exc}", file=sys.stderr)
        return 1
    print(f"Spark packages: {len(jars)} jars in {args.into} ({', '.join(SPARK_PACKAGES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
