"""Build the JVM connector's jar (``jvm/`` in the source tree) with plain ``javac``.

The connector is Java 17 against Spark's Java DataSource V2 interfaces only (no Scala
classes), so one jar serves Spark 4.x. It is compiled with ``javac --release 17`` against the
jars of the installed pyspark and zipped with its ``META-INF/services`` file into
``pylog/spark/pylog-spark.jar`` (package data). ``setup.py`` calls :func:`build` when ``javac``
and pyspark's jars are found; without them nothing is built and Spark uses the Python source.
By hand: ``python -m pylog.spark.jvm_build`` (or ``python pylog/spark/jvm_build.py``).

This module imports nothing from pylog (``setup.py`` loads it by path, before pylog is built).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: the jar, beside this module
JAR_NAME = "pylog-spark.jar"
#: the Java sources and resources, in the source tree
SOURCE_DIR = Path(__file__).resolve().parent.parent.parent / "jvm"


def spark_jars_dir() -> Path | None:
    """The ``jars`` folder of the installed pyspark (or ``$SPARK_HOME/jars``), None if neither."""
    home = os.environ.get("SPARK_HOME")
    candidates = [Path(home) / "jars"] if home else []
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "jars" for p in spec.submodule_search_locations]
    return next((c for c in candidates if (c / "").is_dir() and any(c.glob("spark-sql_*.jar"))), None)


def _sources(src: Path) -> list[Path]:
    return sorted((src / "src").rglob("*.java"))


def stale(jar: Path, src: Path = SOURCE_DIR) -> bool:
    """Whether ``jar`` is missing or older than a source or resource file."""
    if not jar.is_file():
        return True
    newest = max((p.stat().st_mtime for p in src.rglob("*") if p.is_file()), default=0.0)
    return newest > jar.stat().st_mtime


def build(out: Path | None = None, src: Path = SOURCE_DIR, *, quiet: bool = False) -> Path | None:
    """Compile ``src`` into the jar ``out`` (default: beside this module); returns its path,
    or None (with a line on stderr unless ``quiet``) when there is no ``javac``, no pyspark
    jars or no sources. A failed compile raises CalledProcessError."""
    out = Path(__file__).resolve().parent / JAR_NAME if out is None else out

    def skip(why: str) -> None:
        if not quiet:
            print(f"pylog: not building the JVM connector: {why}", file=sys.stderr)

    javac = shutil.which("javac")
    jars = spark_jars_dir()
    if not (src / "src").is_dir():
        skip(f"no Java sources in {src}")
        return None
    if javac is None:
        skip("no javac (install a JDK 17+)")
        return None
    if jars is None:
        skip("pyspark's jars not found (install pyspark or set SPARK_HOME)")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        classes = Path(tmp) / "classes"
        subprocess.run([javac, "--release", "17", "-nowarn", "-encoding", "UTF-8", "-cp", str(jars / "*"),
                        "-d", str(classes), *map(str, _sources(src))], check=True)
        part = out.with_name(out.name + ".tmp")
        with zipfile.ZipFile(part, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: pylog jvm_build\r\n\r\n")
            for root in (classes, src / "resources"):
                for p in sorted(root.rglob("*")):
                    if p.is_file():
                        z.write(p, p.relative_to(root).as_posix())
        os.replace(part, out)
    return out


if __name__ == "__main__":
    path = build()
    print(path if path is not None else "not built")
    sys.exit(0 if path is not None else 1)
