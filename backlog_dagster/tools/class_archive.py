"""Writing the class-data archive that local Spark drivers start from (``spark.class_archive``).

A Spark driver of its own runs small pipelines, backlog then realtime
(``tools.sample_run``), so the classes of both phases are loaded, and dumps them as it
exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from backlog_dagster.implementations import open_session
from backlog_dagster.spark.class_archive import DRIVER_JAVA_OPTIONS, archive_path
from backlog_dagster.tools.sample_run import run_sample


def write_archive(log: Callable[[str], None] = print) -> Path:
    """Write the archive, unless it is there already; its path.

    A driver of its own (another process) runs ``_load_classes`` and writes the archive
    to a file of its own as it exits; that file takes the archive's name only once whole,
    so a driver starting meanwhile never maps half an archive.
    """
    path = archive_path()
    if path.is_file():
        log(f"class-data archive already there: {path}")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    log(f"writing the class-data archive of a local Spark driver to {path} (about a minute)")
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", __name__, str(partial)], capture_output=True, text=True
    )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(
            f"the Spark driver writing the class-data archive failed (exit {done.returncode}):"
            f"\n{done.stderr[-3000:]}"
        )
    partial.replace(path)
    size_mb = path.stat().st_size / 2**20
    log(f"class-data archive written in {time.monotonic() - started:.0f} s ({size_mb:.0f} MiB)")
    return path


def _load_classes(target: Path) -> None:
    """In a process of its own: a local driver that loads what runs load, writes them to
    ``target`` as it exits, and is waited for (the dump takes seconds after the session
    stops)."""
    spark = open_session(
        "local[*]", "class-archive", {DRIVER_JAVA_OPTIONS: f"-XX:ArchiveClassesAtExit={target}"}
    )
    gateway = spark.sparkContext._gateway
    assert gateway is not None, "a local Spark has a py4j gateway to its JVM"
    jvm = gateway.proc  # the JVM's process, which PySpark started
    with tempfile.TemporaryDirectory(prefix="class-archive-") as folder:
        run_sample(spark, Path(folder), backlog_records=20_000, live_rate=2_000, realtime_s=8)
    spark.stop()
    jvm.stdin.close()  # the gateway exits on end of input: then the JVM dumps the archive
    jvm.wait(300)


if __name__ == "__main__":
    _load_classes(Path(sys.argv[1]))
