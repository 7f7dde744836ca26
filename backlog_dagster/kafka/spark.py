"""The Spark data source over a Kafka topic, registered as format ``kafkabuckets``.

    spark.read.format("kafkabuckets").options(**settings.to_options()).load()

The options of the embedded log's source (``backlog_dagster.source.spark``) apply
(``startingOffsets``, ``endingOffsets``, ``maxRecordsPerTrigger``, ``buckets``, ``mode``,
availableNow), with partitions as buckets, plus ``topic``, ``isolationLevel``,
``valueFormat`` and ``kafka.<librdkafka setting>`` (``kafka.bootstrap.servers`` first).
Each Spark task reads its partitions' ranges with a consumer of its own, by position.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from backlog_dagster.kafka.topic import SPARK_FORMAT, KafkaSettings, KafkaTopic
from backlog_dagster.source.base import Source
from backlog_dagster.source.spark import SourceDataSource

FORMAT = SPARK_FORMAT


class KafkaDataSource(SourceDataSource):
    """A Kafka topic, by the options ``KafkaSettings.to_options`` writes."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    @staticmethod
    def open(options: Mapping[str, str]) -> Source:
        """One open topic per process and settings, kept across Spark's tasks and
        micro-batches: each new one costs librdkafka threads, connections and a metadata
        round trip, where a micro-batch may be a few milliseconds of work. Safe because
        a Python worker, and the planner process of a stream reader, run one thing at a
        time."""
        key = json.dumps(sorted(options.items()))
        if key not in _kept:
            _kept[key] = _KeptOpen(KafkaSettings.from_options(options))
        return _kept[key]


class _KeptOpen(KafkaTopic):
    def close(self) -> None:
        """Kept for the process's next task (closed when the process ends)."""


_kept: dict[str, KafkaTopic] = {}
