"""Where records come from: the ``Source`` contract and its implementations.

Only this package knows which implementation a pipeline's source names; the rest of the
code opens a source with ``open_source`` and depends on ``Source`` alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from backlog_dagster.source.base import (
    JSON_VALUE_COLUMN,
    Arrivals,
    Bounds,
    Payload,
    Source,
    SourceError,
    StoredRecords,
)

if TYPE_CHECKING:
    from pyspark.sql.datasource import DataSource

    from backlog_dagster.kafka import KafkaSettings
    from backlog_dagster.pipeline.config import PipelineConfig


def open_source(config: PipelineConfig) -> Source:
    """The source ``source.kind`` names, opened; close it after use. ``SourceError`` if
    it is missing. A ``{env: NAME}`` setting is read from this process's environment."""
    log: Source
    if config.source.kafka is not None:
        from backlog_dagster.kafka import KafkaTopic
        from backlog_dagster.kafka.topic import SPARK_FORMAT as KAFKA_FORMAT

        settings = _kafka_settings(config)
        log, log_format, log_options = KafkaTopic(settings), KAFKA_FORMAT, settings.to_options()
    else:
        from backlog_dagster.log import Topic
        from backlog_dagster.log.topic import SPARK_FORMAT

        assert config.source.path is not None
        log, log_format = Topic(config.source.path), SPARK_FORMAT
        log_options = {"path": config.source.path}
    archive = config.source.archive
    if archive is None:
        return log
    from backlog_dagster.archive.source import ArchiveThenLog

    return ArchiveThenLog(Path(archive.path), archive.format, log, log_format, log_options)


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
    from backlog_dagster.spark.source import BucketLogDataSource

    return [BucketLogDataSource, KafkaDataSource, ArchiveDataSource]


def _kafka_settings(config: PipelineConfig) -> KafkaSettings:
    from backlog_dagster.kafka import KafkaSettings
    from backlog_dagster.pipeline.secrets import resolve

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


__all__ = [
    "JSON_VALUE_COLUMN",
    "Arrivals",
    "Bounds",
    "Payload",
    "Source",
    "SourceError",
    "StoredRecords",
    "data_sources",
    "for_other_processes",
    "open_source",
]
