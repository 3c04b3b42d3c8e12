"""JVM helpers that ship as source and are compiled on first use (javac from the JDK Spark runs on).

``FastLocalFileSystem.java``: Hadoop's local file system without a forked process per file
operation (see the class comment); it cut the speed layer's JVM CPU by about a sixth here.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("FastLocalFileSystem.java")
FILE_SYSTEM_CLASS = "lambdalake.hadoop.FastLocalFileSystem"
ABSTRACT_FILE_SYSTEM_CLASS = "lambdalake.hadoop.FastLocalFileSystem$Fs"


def cache_dir(name: str) -> Path:
    """The folder, kept per machine, for what the project fetches or builds once (jars, tools)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lambdalake" / name


def jdk_tool(name: str) -> str | None:
    """A JDK program (java, javac, jar): $JAVA_HOME's, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / name).is_file():
        return str(Path(java_home) / "bin" / name)
    return shutil.which(name)


def fast_local_fs_jar() -> Path | None:
    """The compiled jar (built once per source version), or None where no JDK compiler exists."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    jar = cache_dir("jvm") / f"fast-local-fs-{digest}.jar"
    if jar.is_file():
        return jar
    javac, jar_tool = jdk_tool("javac"), jdk_tool("jar")
    if not (javac and jar_tool):
        log.warning("no javac/jar found: Spark uses Hadoop's local file system, which forks a process per file")
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    classpath = os.pathsep.join(str(p) for p in jars.glob("hadoop-client-api-*.jar"))
    jar.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar.parent) as build:
        classes = Path(build) / "classes"
        subprocess.run([javac, "-nowarn", "-d", str(classes), "-cp", classpath, str(SOURCE)],
                       check=True, capture_output=True)
        built = Path(build) / jar.name
        subprocess.run([jar_tool, "cf", str(built), "-C", str(classes), "."], check=True, capture_output=True)
        os.replace(built, jar)  # atomic: a concurrent build writes the same bytes
    return jar
