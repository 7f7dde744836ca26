"""Spark as a Dagster resource: dagster-pyspark's resource with this project's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dagster_pyspark import LazyPySparkResource

from backlog_dagster.spark.session import register_sources, spark_config, use_this_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_resource(
    master: str = "local[*]", app_name: str = "backlog-dagster", conf: Mapping[str, str] = {}
) -> LazyPySparkResource:
    """dagster-pyspark's lazy resource for a session on ``master`` (local, a cluster, or a
    Spark Connect server), whose Python workers run this interpreter."""
    use_this_python()
    return LazyPySparkResource(spark_config=spark_config(master, app_name, conf))


def session_of(resource: LazyPySparkResource) -> SparkSession:
    """The resource's session, with the ``bucketlog`` source registered on it."""
    session = resource.spark_session
    register_sources(session)
    return session
