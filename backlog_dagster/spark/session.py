"""The SparkSession the project runs on, with the log's data source registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: SQL settings every session gets unless the caller overrides them. Arrow batches as
#: large as the log's stored blobs let the Python source hand each blob over whole
#: (Spark's default of 10,000 rows re-chunks them: about 10% slower here, measured
#: interleaved in one session over 20 million reference records). ANSI mode is off so a
#: cast or arithmetic that fails on one record gives null for it, and the record goes to
#: the dead-letter table, instead of failing the whole job (see ``phases.bad_records``).
SESSION_CONF: Mapping[str, str] = {
    "spark.sql.ansi.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.execution.arrow.maxRecordsPerBatch": "65536",
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
    """Make Spark's Python workers run this interpreter, where the package is installed."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def get_session(
    master: str = "local[*]", app_name: str = "backlog-dagster", conf: Mapping[str, str] = {}
) -> SparkSession:
    """Get or create the session and register the ``bucketlog`` data source on it.

    ``master`` may be ``local[*]``, a cluster URL, or a Spark Connect URL (``sc://…``).
    """
    use_this_python()
    from pyspark.sql import SparkSession

    remote = master.startswith("sc://")
    builder = SparkSession.builder.appName(app_name)
    builder = builder.remote(master) if remote else builder.master(master)
    for key, value in {**(SESSION_CONF if remote else DEFAULT_CONF), **conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register_source(session)
    return session


def register_source(session: SparkSession) -> None:
    from backlog_dagster.spark.source import BucketLogDataSource

    session.dataSource.register(BucketLogDataSource)
