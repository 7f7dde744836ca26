"""A class-data archive that local Spark drivers start from: a third less CPU a start.

A local Spark's JVM loads some 20,000 classes from the PySpark installation's jars before
its first job. Java's application class-data sharing (AppCDS) maps them from an archive
that a JVM wrote when it exited, instead of reading, checking and linking them one by
one. Measured here (2 cores, a fresh process, medians of three, alternating): a session
and a one-row job took 9.3 s and 14.1 CPU seconds without the archive, 6.2 s and 9.4
with it; customer_totals' backlog of 4,000,000 records from process start 17.6 s and
13.6 s. Every backlog, standby and realtime run on its own Spark starts a
driver, several at once under ``dagster dev``, and so does every restart after a crash.

An archive fits one JDK and one set of jars. Its file name carries a fingerprint of both,
a driver starts from it only when it is there (``driver_java_option``), and a JVM given an
archive that does not fit says so in one line and starts as usual. ``backlog-dagster
spark class-archive`` writes it (``tools.class_archive``; ``make`` does, when it sets up
``.venv``). It lives in the virtual
environment when there is one (gone with it), else in the user's cache
(``spark.home.project_folder``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from backlog_dagster.spark.home import project_folder, spark_home

#: The driver's own classpath: a driver that adds to it cannot use the archive.
EXTRA_CLASSPATH = "spark.driver.extraClassPath"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"


def archive_path() -> Path:
    """Where the archive for this Python's PySpark and this machine's Java belongs."""
    return project_folder() / f"spark-driver-{_fingerprint()}.jsa"


def driver_java_option(conf: Mapping[str, str]) -> str | None:
    """The JVM option that starts a driver with ``conf`` from the archive, if it can."""
    if EXTRA_CLASSPATH in conf:
        return None
    path = archive_path()
    return f"-XX:SharedArchiveFile={path}" if path.is_file() else None


def _fingerprint() -> str:
    """What an archive must match: PySpark's jars, by the path a driver loads them from
    (``spark.home``), and the Java that Spark starts (as ``spark-class`` finds it:
    ``JAVA_HOME``, else ``java`` on the path)."""
    import pyspark

    jars = spark_home() / "jars"
    parts = [pyspark.__version__, str(jars), *sorted(p.name for p in jars.glob("*.jar"))]
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is not None and Path(java).exists():
        real = Path(java).resolve()
        stat = real.stat()
        parts += [str(real), str(stat.st_size), str(stat.st_mtime_ns)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
