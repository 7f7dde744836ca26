"""Kafka as a source: a topic's partitions are the buckets (``KafkaTopic``), read by
Spark through ``kafkabuckets``; and a Kafka-protocol cluster on loopback for tests and
the demo (``mock_broker``)."""

from backlog_dagster.kafka.topic import KafkaSettings, KafkaTopic

__all__ = ["KafkaSettings", "KafkaTopic"]
