"""A streaming query's checkpoint files written without a process for each
(``jvm/LocalCheckpointFiles.java``).

Spark's file-system checkpoint manager (``session.SESSION_CONF``) writes each entry of a
query's offset and commit logs as a new file, and on a local disk without Hadoop's native
library Hadoop runs ``chmod`` for each new file and for its checksum: four processes a
micro-batch, which the query's thread waits for. Measured on a local Spark (a rate source
into a ``foreachBatch`` doing nothing, 0.2 s micro-batches, medians of 27): the two logs
took 17 to 18 ms a micro-batch with Spark's manager and 3 ms with this one; with two
other processes keeping both cores busy, 35 to 37 ms against 3 ms. On a Connect server
running two realtime queries (``spark.sample_run``) the two logs took 8 ms each a
micro-batch against 1 ms (medians over some 330 micro-batches, from the server's log),
and the server started 3 processes in 20 s against 303 (Java Flight Recordings).

The class is built on first use into a jar of its own (``spark.java_build``; it needs a
JDK), which a Spark this project launches gets on its classpath (``launch_jars``); a
query uses it when its Spark has it and the session names Spark's manager, the project's
default (``use_for_queries``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from backlog_dagster.spark import java_build

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

SOURCE = Path(__file__).with_name("jvm") / "LocalCheckpointFiles.java"
JAR_NAME = "checkpoint-files"
MANAGER = "backlogdagster.spark.LocalCheckpointFiles"
#: The session setting Spark takes a query's checkpoint manager from, as the query starts.
SETTING = "spark.sql.streaming.checkpointFileManagerClass"
#: Spark's file-system manager: the project's default for every session.
SPARK_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def launch_jars() -> list[str]:
    """The jar a Spark this project launches gets: none without a JDK to build it."""
    jar = java_build.built_on_first_use(SOURCE, JAR_NAME)
    return [] if jar is None else [str(jar)]


def use_for_queries(spark: SparkSession) -> None:
    """Have the streaming queries ``spark`` starts from now on write their checkpoints
    with this manager, when its Spark has it and the session names Spark's manager (a
    user's own choice of manager stays). On Spark Connect, round trips: the jars once per
    session (``java_build.launched_with``), then reading the setting and, the first
    time, setting it."""
    launched = java_build.launched_with(spark, java_build.jar_path(SOURCE, JAR_NAME))
    if launched and spark.conf.get(SETTING, None) == SPARK_MANAGER:
        spark.conf.set(SETTING, MANAGER)
