"""The Spark data source over a topic of the embedded log, registered as format ``bucketlog``.

    spark.read.format("bucketlog").option("path", topic_dir).load()

The options of the generic source (``backlog_dagster.source.spark``) apply, plus ``path``:
the topic's directory.
"""

from __future__ import annotations

from collections.abc import Mapping

from backlog_dagster.log.topic import SPARK_FORMAT, Topic
from backlog_dagster.source.base import Source
from backlog_dagster.source.spark import SourceDataSource

FORMAT = SPARK_FORMAT


class BucketLogDataSource(SourceDataSource):
    """A topic of the embedded log, by its directory (option ``path``)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    @staticmethod
    def open(options: Mapping[str, str]) -> Source:
        path = {key.lower(): value for key, value in options.items()}.get("path")
        if path is None:
            raise ValueError(f"the {FORMAT} source needs option path: the topic's directory")
        return Topic(path)
