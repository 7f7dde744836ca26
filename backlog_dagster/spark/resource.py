"""Spark as a Dagster resource: dagster-pyspark's resource with this project's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dagster_pyspark import PySparkResource

from backlog_dagster.spark.session import DEFAULT_CONF, register_source, use_this_python

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def spark_resource(master: str = "local[*]", conf: Mapping[str, str] = {}) -> PySparkResource:
    """A ``PySparkResource`` whose sessions run this interpreter's Python workers."""
    use_this_python()
    return PySparkResource(spark_config={"spark.master": master, **DEFAULT_CONF, **conf})


def session_of(resource: PySparkResource) -> SparkSession:
    """The resource's session, with the ``bucketlog`` source registered on it."""
    session = resource.spark_session
    register_source(session)
    return session
