"""Spark as a Dagster resource: dagster-pyspark's resource with this project's settings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from dagster_pyspark import LazyPySparkResource

from backlog_dagster import extras
from backlog_dagster.spark.java import require_java
from backlog_dagster.spark.session import is_connect, spark_config, use_this_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource


def spark_resource(
    master: str = "local[*]", app_name: str = "backlog-dagster", conf: Mapping[str, str] = {}
) -> LazyPySparkResource:
    """dagster-pyspark's lazy resource for a session on ``master`` (local, a cluster, or a
    Spark Connect server), whose Python workers run this interpreter. What that needs
    installed is checked first: the connect extra for a Connect server, else Java."""
    if master.startswith("sc://"):
        extras.require("connect")
    else:
        require_java()
    use_this_python()
    return LazyPySparkResource(spark_config=spark_config(master, app_name, conf))


def session_of(
    resource: LazyPySparkResource, data_sources: Sequence[type[DataSource]] = ()
) -> SparkSession:
    """The resource's session, with ``data_sources`` registered on it."""
    session = resource.spark_session
    if is_connect(session):
        retry_often(session)
    for data_source in data_sources:
        session.dataSource.register(data_source)
    return session


def get_session(
    master: str = "local[*]",
    app_name: str = "backlog-dagster",
    conf: Mapping[str, str] = {},
    data_sources: Sequence[type[DataSource]] = (),
) -> SparkSession:
    """Get or create the session, with ``data_sources`` registered on it.

    ``master`` may be ``local[*]``, a cluster URL, or a Spark Connect URL (``sc://…``).
    The session is dagster-pyspark's (``spark_resource``), built from ``spark_config``.
    """
    return session_of(spark_resource(master, app_name, conf), data_sources)


#: The longest wait between two tries to reach a Spark Connect server (ms), and enough
#: tries to go on for the ten minutes PySpark's own policy tolerates.
CONNECT_RETRY_MAX_WAIT_MS = 5_000
CONNECT_RETRY_TRIES = 125


def retry_often(session: SparkSession) -> None:
    """A client that keeps trying an unreachable Connect server every 5 s, not every 60.

    PySpark's default policy backs off up to a minute between tries: a run whose server
    was restarted learnt that its query was gone up to a minute after the server was
    back (100 s after the kill in the switch test), and only then did the sensor start
    the next run. The same ten minutes of patience, tried more often."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    policy = DefaultPolicy(max_retries=CONNECT_RETRY_TRIES, max_backoff=CONNECT_RETRY_MAX_WAIT_MS)
    session.client.set_retry_policies([policy])
