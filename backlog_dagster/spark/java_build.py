"""The project's own Java classes, each source compiled against PySpark's jars into a
jar of its own, once per source and PySpark (in ``spark.home.project_folder``); the
jars a Spark is launched with, and whether a session's Spark has one."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@functools.cache
def jar_path(source: Path, name: str) -> Path:
    """Where ``source`` built for this PySpark belongs: ``name`` and a digest of both
    (worked out once a process: a read asks for every micro-batch)."""
    import pyspark

    from backlog_dagster.spark.home import project_folder

    digest = hashlib.sha256(source.read_bytes() + pyspark.__version__.encode()).hexdigest()
    return project_folder() / f"{name}-{digest[:16]}.jar"


def built_on_first_use(source: Path, name: str) -> Path | None:
    """``source``'s jar (``jar_path``), built now if it is not yet; None without a JDK."""
    target = jar_path(source, name)
    if not target.is_file():
        if javac() is None:
            return None
        build_jar(source, target)
    return target


def with_jars(settings: Mapping[str, str], jars: Sequence[str]) -> dict[str, str]:
    """``settings`` with ``jars`` added to ``spark.jars`` (the user's kept)."""
    if not jars:
        return dict(settings)
    given = [jar for jar in settings.get("spark.jars", "").split(",") if jar]
    return {**settings, "spark.jars": ",".join([*given, *jars])}


#: Per session, the jars its Spark was launched with (``spark.jars``).
_launch_jars: weakref.WeakKeyDictionary[SparkSession, str] = weakref.WeakKeyDictionary()


def launched_with(spark: SparkSession, jar: Path) -> bool:
    """Whether ``spark``'s Spark was launched with ``jar`` (one look-up a session: on
    Spark Connect a round trip)."""
    if spark not in _launch_jars:
        _launch_jars[spark] = spark.conf.get("spark.jars", "") or ""
    return jar.name in _launch_jars[spark]


def javac() -> str | None:
    """The JDK's compiler, if there is one."""
    return shutil.which("javac")


def build_jar(source: Path, target: Path, classpath: Sequence[Path] = ()) -> None:
    """Compile ``source`` against PySpark's jars (and ``classpath``) into ``target``.
    Needs a JDK; RuntimeError with javac's words when it fails. Processes building the
    same jar at once each write their own file and move it into place."""
    from backlog_dagster.spark.home import installed_home

    compiler = javac()
    if compiler is None:
        raise RuntimeError(f"{source.name} needs a JDK to build it: javac is not found")
    path = os.pathsep.join([f"{installed_home() / 'jars'}/*", *map(str, classpath)])
    with tempfile.TemporaryDirectory(prefix=f"{target.stem}-") as folder:
        classes = Path(folder) / "classes"
        done = subprocess.run(
            [compiler, "-nowarn", "--release", "17", "-d", str(classes), "-cp", path, str(source)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"javac failed on {source.name}:\n{done.stderr[-3000:]}")
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        with zipfile.ZipFile(partial, "w") as jar:
            for compiled in sorted(classes.rglob("*.class")):
                jar.write(compiled, compiled.relative_to(classes).as_posix())
        partial.replace(target)
