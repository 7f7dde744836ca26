"""The embedded log read inside Spark's JVM, without a Python worker.

Spark reads a Python data source (format ``bucketlog``) through a Python worker per
task: Spark feeds it the partition, the worker decodes the stored Arrow IPC blobs and
hands them back, and Spark turns them into rows. On a shared Spark Connect server that
hand-over was half of a 10,000-record realtime micro-batch's job (632 ms against 326 ms
for records made in the JVM, ``bench/source_cost.py``). ``jvm/LogRangeSource.java``
reads the same blobs in the JVM: SQLite through the xerial JDBC driver (Debian's
``libxerial-sqlite-jdbc-java``), Arrow IPC with the Arrow jars Spark ships, handed to
Spark as columnar batches.

It reads given offset ranges of given buckets, nothing more: the Python side resolves
the ranges and plans the tasks (``spark.source.plan_tasks``, as the Python data source
plans them), so both readers read the same records in the same tasks. Streams, starting
offsets and JSON payloads stay with the Python data source.

The reader is built once per installation (``backlog-dagster spark log-reader``; ``make``
does it beside the class-data archive) into ``spark.home.project_folder``. A Spark this
project launches (a local driver, a Connect server) gets it on its classpath when it is
built and the JDBC driver is installed (``launch_jars``), and a read uses it when the
session's Spark has it (``on``): a Spark started elsewhere, or a machine without it,
reads through the Python data source as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from backlog_dagster.spark import java_build

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from backlog_dagster.log.topic import Topic

SOURCE = Path(__file__).with_name("jvm") / "LogRangeSource.java"
#: The data source's class: what ``spark.read.format`` names.
FORMAT = "backlogdagster.log.LogRangeSource"
#: Where Debian's ``libxerial-sqlite-jdbc-java`` puts the SQLite JDBC driver (its
#: native library goes where Debian's Java looks for JNI libraries).
SQLITE_JDBC = Path("/usr/share/java/sqlite-jdbc.jar")
#: The environment variable that points at another copy of the driver's jar.
SQLITE_JDBC_ENV = "BACKLOG_DAGSTER_SQLITE_JDBC"


def jar_path() -> Path:
    """Where the reader built from this source for this PySpark belongs."""
    return java_build.jar_path(SOURCE, "log-reader")


def sqlite_jdbc() -> Path:
    given = os.environ.get(SQLITE_JDBC_ENV)
    return Path(given) if given else SQLITE_JDBC


def launch_jars() -> list[str]:
    """The jars a Spark this project launches gets, to read the log in its JVM: none
    unless the reader is built and the JDBC driver installed."""
    jars = [jar_path(), sqlite_jdbc()]
    return [str(jar) for jar in jars] if all(jar.is_file() for jar in jars) else []


def build(log: Callable[[str], None] = print) -> Path:
    """Compile the reader against PySpark's jars and the JDBC driver, unless built;
    its path. Needs a JDK (``javac``)."""
    target = jar_path()
    if target.is_file():
        log(f"the log's JVM reader is already built: {target}")
        return target
    if not sqlite_jdbc().is_file():
        raise RuntimeError(
            f"the log's JVM reader needs the SQLite JDBC driver at {sqlite_jdbc()}: "
            f"install Debian's libxerial-sqlite-jdbc-java, or point {SQLITE_JDBC_ENV} at "
            "its jar"
        )
    java_build.build_jar(SOURCE, target, [sqlite_jdbc()])
    log(f"built the log's JVM reader: {target}")
    return target


def on(spark: SparkSession) -> bool:
    """Whether ``spark``'s Spark was launched with this reader."""
    return java_build.launched_with(spark, jar_path())


def read(
    spark: SparkSession,
    topic: Topic,
    schema: str | StructType,
    tasks: list[tuple[tuple[int, int, int], ...]],
) -> DataFrame:
    """The records of ``tasks`` (each Spark task's ``(bucket, start, end)`` ranges) of
    ``topic``, in ``schema``: checked against the topic first, with the Python data
    source's own words (a column it lacks, a type it stores otherwise)."""
    from backlog_dagster.source.base import Payload
    from backlog_dagster.spark.records import RecordLayout, check_layout
    from backlog_dagster.spark.source import arrow_schema

    layout = RecordLayout(arrow_schema(schema), Payload.ARROW, False)
    check_layout(layout, topic.schema, topic.name)
    spec = ";".join(",".join(f"{b}:{s}:{e}" for b, s, e in task) for task in tasks)
    return (
        spark.read.format(FORMAT)
        .schema(schema)
        .option("path", str(topic.path))
        .option("timestampColumn", topic.timestamp_column)
        .option("partitions", spec)
        .load()
    )
