"""The SparkSession the project runs on, with the log's data source registered."""

from __future__ import annotations

import os
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from backlog_dagster.errors import UserError
from backlog_dagster.spark.home import spark_home

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: SQL settings every session gets unless the caller overrides them. Arrow batches as
#: large as the log's stored blobs let the Python source hand each blob over whole
#: (Spark's default of 10,000 rows re-chunks them: about 10% slower here, measured
#: interleaved in one session over 20 million reference records). ANSI mode is off so a
#: cast or arithmetic that fails on one record gives null for it, and the record goes to
#: the dead-letter table, instead of failing the whole job (see ``phases.bad_records``).
#: The sketch aggregations (``count_distinct``, ``quantiles``) run in Spark's object hash
#: aggregate, which sorts every row instead once a task holds more than 128 groups
#: (Spark's default): region_daily's sliding windows over five days have 480, and its
#: backlog of 4,000,000 records took 10.0 s instead of 4.2 s with a row per window, and
#: 3.8 s instead of 2.0 s by panes (medians of 3). 4,096 groups of an HLL and a KLL
#: sketch (a few KB each) are tens of MB a task.
#: A streaming query's checkpoint files go through Hadoop's FileSystem API, not its
#: FileContext API (Spark's default): on a local disk without Hadoop's native library,
#: FileContext starts a ``readlink`` or ``chmod`` process for each file it creates or
#: renames (770 processes in 25 s for one query at 0.5 s micro-batches, in a Java Flight
#: Recording), and Spark's offset and commit logs took 31 ms each a micro-batch instead
#: of 8 (``bench/realtime.py``, medians of three). The FileSystem API writes each file
#: the same way (a temporary file, then a rename: atomic on a local disk). A query's
#: checkpoint is a folder of its own run on the machine where Spark runs
#: (``phases.micro_batch.batch_start``).
SESSION_CONF: Mapping[str, str] = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
    "spark.sql.objectHashAggregate.sortBased.fallbackThreshold": "4096",
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
}
#: Settings of a Spark this process starts (local or a cluster it submits to); a Spark
#: Connect server fixed them when it started. The UI is off because nothing here looks
#: at it and it costs start-up time and a port.
LAUNCH_CONF: Mapping[str, str] = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "4g",
    "spark.python.worker.reuse": "true",
}
DEFAULT_CONF: Mapping[str, str] = {**SESSION_CONF, **LAUNCH_CONF}


def use_this_python() -> None:
    """Make Spark's Python workers run this interpreter, where the package is installed,
    and import its installed PySpark (``spark.home``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ["SPARK_HOME"] = str(spark_home())


class SparkSettingRefused(ValueError, UserError):
    """A launch setting asked of a Spark that was launched already (a Connect server)."""


def spark_config(master: str, app_name: str, conf: Mapping[str, str] = {}) -> dict[str, str]:
    """Every setting of a session on ``master``: this project's defaults, then ``conf``.

    A Spark Connect server (``sc://``) takes session (``spark.sql.*``) settings only; a
    launch setting for it is refused, naming it, rather than silently not applied.
    """
    if not master.startswith("sc://"):
        return {"spark.master": master, "spark.app.name": app_name, **DEFAULT_CONF, **conf}
    fixed = sorted(key for key in conf if not key.startswith("spark.sql."))
    if fixed:
        raise SparkSettingRefused(
            f"spark_conf: {', '.join(fixed)} cannot be set per run on a Spark Connect "
            "server (it fixed them when it started); give them to the server instead "
            "(backlog-dagster spark connect-server --conf KEY=VALUE), or drop them"
        )
    return {"spark.remote": master, **SESSION_CONF, **conf}


def sql_settings_after(
    master: str, before: Mapping[str, str], conf: Mapping[str, str]
) -> dict[str, str | None]:
    """The SQL settings that make a session on which ``before`` was set look like a new
    session with ``conf``: each key of ``before`` back to a new session's value, or unset
    (None), then ``conf``'s own."""
    fresh = spark_config(master, "backlog-dagster", conf)
    settings: dict[str, str | None] = {
        key: fresh.get(key) for key in before if key.startswith("spark.sql.")
    }
    settings |= {key: value for key, value in conf.items() if key.startswith("spark.sql.")}
    return settings


def apply_sql_settings(spark: SparkSession, settings: Mapping[str, str | None]) -> None:
    """Set each setting on the session, or unset it where its value is None."""
    for key, value in settings.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


def is_connect(spark: SparkSession) -> bool:
    """Whether the session is a Spark Connect client (no SparkContext here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_session_closed(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect session whose client has closed: stopped, or
    told by a server that started again that its session is gone."""
    return is_connect(spark) and bool(spark.is_stopped)  # type: ignore[attr-defined]


def server_restarted(spark: SparkSession, error: BaseException) -> bool:
    """Whether ``error`` says that the Spark Connect server of ``spark`` started again
    (a new server knows none of the old one's sessions): the client then closes the
    session, or the server names the session's handle as gone. A server that stays
    unreachable is not this: the client keeps trying it (``retry_often``), then fails."""
    if not is_connect(spark):
        return False
    return connect_session_closed(spark) or "INVALID_HANDLE.SESSION" in str(error)


#: A new session like the one a phase runs on, for when its Spark Connect server
#: started again under it (``server_restarted``).
Reopen = Callable[[], "SparkSession"]


@contextmanager
def stopping_reopened(reopen: Reopen | None) -> Iterator[Reopen | None]:
    """``reopen``, keeping the sessions it opens in the block, which stop as it ends
    (one the phase replaced is stopped already: stopping it again does nothing)."""
    if reopen is None:
        yield None
        return
    opened: list[SparkSession] = []

    def reopened() -> SparkSession:
        opened.append(reopen())
        return opened[-1]

    try:
        yield reopened
    finally:
        for session in opened:
            session.stop()


def reopened_after_restart(
    spark: SparkSession,
    error: BaseException,
    reopen: Reopen | None,
    log: Callable[[str], None],
    phase: str,
) -> SparkSession | None:
    """A new session in place of ``spark`` when ``error`` says that its Spark Connect
    server started again (``server_restarted``) and ``reopen`` is given, said in the
    log; otherwise None, for the caller to raise ``error``. ``spark`` is closed first
    (that never raises), so that the new session is not the old one handed back, and
    nothing asks the new server for it."""
    if reopen is None or not server_restarted(spark, error):
        return None
    said = (str(error).strip().splitlines() or [type(error).__name__])[0]
    log(
        f"{phase}: the Spark Connect server started again under this run ({said}); "
        "going on in a new session from the sink's progress"
    )
    spark.stop()
    return reopen()


def on_an_executor(
    spark: SparkSession, function: Callable[[str], object], argument: str, return_type: str
) -> object:
    """``function(argument)`` run in a one-task job on one of Spark's executors, for a
    source to check what the executors see (``Source.check_reachable``); None if the job
    gave no row. ``useArrow`` is said, not inferred: on Spark Connect a UDF without it has
    its type hints inspected, and a plain function made Spark warn on every call."""
    from pyspark.sql import functions as F

    answer = F.udf(function, return_type, useArrow=False)
    row = spark.range(1).select(answer(F.lit(argument)).alias("answer")).first()
    return None if row is None else row["answer"]


#: Per Spark Connect client session, the tasks its server runs at once.
_slots_of_clients: weakref.WeakKeyDictionary[SparkSession, int] = weakref.WeakKeyDictionary()


def task_slots(spark: SparkSession) -> int:
    """How many tasks Spark runs at once: its default parallelism (a local Spark's cores,
    a cluster's executor cores). A Spark Connect client has no SparkContext to ask, so
    the server answers with the partitions it splits a range into by default: one tiny
    job, once per client session."""
    if not is_connect(spark):
        return int(spark.sparkContext.defaultParallelism)
    if spark not in _slots_of_clients:
        from pyspark.sql import functions as F

        parts = spark.range(1 << 16).select(F.spark_partition_id().alias("part"))
        row = parts.agg(F.max("part").alias("last")).first()
        _slots_of_clients[spark] = 1 + int(row["last"]) if row is not None else 1
    return _slots_of_clients[spark]


def read_tasks(spark: SparkSession, at_least: int | None = None) -> int:
    """The tasks a read takes (records allowing): ``at_least``, and at least one per
    task Spark runs at once, so that every core reads."""
    return max(task_slots(spark), at_least or 1)


def runs_elsewhere(spark: SparkSession) -> bool:
    """Whether the session's executors may be on other machines (Spark Connect, a
    cluster) rather than in this process's local Spark."""
    if is_connect(spark):
        return True
    return not (spark.sparkContext.master or "").startswith("local")
