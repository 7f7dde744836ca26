"""Which implementation serves a pipeline: the one place that knows them all.

A pipeline's config names its source (the embedded log, a Kafka topic, either behind an
archive); the phases, the sensor and the checks depend on the ``Source`` contract alone
and open it here. Spark sessions come from here too, with every source's data source
registered on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from backlog_dagster.archive.source import ArchiveThenLog
from backlog_dagster.kafka import KafkaSettings, KafkaTopic
from backlog_dagster.kafka.topic import SPARK_DATA_SOURCE as KAFKA_DATA_SOURCE
from backlog_dagster.log import Topic
from backlog_dagster.log.topic import SPARK_DATA_SOURCE as LOG_DATA_SOURCE
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.secrets import resolve
from backlog_dagster.source import Source

if TYPE_CHECKING:
    from dagster_pyspark import LazyPySparkResource
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource


def open_source(config: PipelineConfig) -> Source:
    """The source ``source.kind`` names, opened; close it after use. ``SourceError`` if
    it is missing. A ``{env: NAME}`` setting is read from this process's environment."""
    log: Source
    if config.source.kafka is not None:
        settings = _kafka_settings(config)
        log, data_source, options = KafkaTopic(settings), KAFKA_DATA_SOURCE, settings.to_options()
    else:
        assert config.source.path is not None
        log, data_source = Topic(config.source.path), LOG_DATA_SOURCE
        options = {"path": config.source.path}
    archive = config.source.archive
    if archive is None:
        return log
    return ArchiveThenLog(Path(archive.path), archive.format, log, data_source, options)


def for_other_processes(config: PipelineConfig) -> PipelineConfig:
    """``config`` with the source's ``{env: NAME}`` settings read now, for code that opens
    the source in a process without this one's environment (a Spark Connect server)."""
    kafka = config.source.kafka
    if kafka is None:
        return config
    settings = _kafka_settings(config)
    resolved = kafka.model_copy(
        update={"bootstrap_servers": settings.bootstrap_servers, "properties": settings.properties}
    )
    return config.model_copy(
        update={"source": config.source.model_copy(update={"kafka": resolved})}
    )


def data_sources() -> list[type[DataSource]]:
    """Every source's Spark data source, to register in a session."""
    from backlog_dagster.archive.spark import ArchiveDataSource
    from backlog_dagster.kafka.spark import KafkaDataSource
    from backlog_dagster.log.spark import BucketLogDataSource

    return [BucketLogDataSource, KafkaDataSource, ArchiveDataSource]


def open_session(
    master: str = "local[*]", app_name: str = "backlog-dagster", conf: Mapping[str, str] = {}
) -> SparkSession:
    """A Spark session on ``master`` (local, a cluster, or ``sc://…``) that reads every
    source: dagster-pyspark's resource (``spark.resource``) with their data sources."""
    from backlog_dagster.spark import resource

    return resource.get_session(master, app_name, conf, data_sources())


def session_of(spark: LazyPySparkResource) -> SparkSession:
    """The session of a resource ``spark.resource.spark_resource`` made, reading every
    source."""
    from backlog_dagster.spark import resource

    return resource.session_of(spark, data_sources())


def _kafka_settings(config: PipelineConfig) -> KafkaSettings:
    kafka = config.source.kafka
    assert kafka is not None
    return KafkaSettings(
        bootstrap_servers=resolve(kafka.bootstrap_servers, "source.kafka.bootstrap_servers"),
        topic=kafka.topic,
        isolation_level=kafka.isolation_level,
        value_format=kafka.value_format,
        properties={
            key: resolve(value, f"source.kafka.properties.{key}")
            for key, value in kafka.properties.items()
        },
    )
