"""A topic of the embedded log copied to a Kafka topic, bucket by bucket, as it grows.

``backlog-dagster kafka mirror`` uses it to move a log topic to Kafka; the demo and the
tests use it to give a pipeline on Kafka and one on the log the same records, so both
are checked against the log's oracle. A bucket's records go to the partition of the
same number (the Kafka topic needs at least as many partitions), in order, so without
transactions their offsets agree.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa

from backlog_dagster.log import Topic
from backlog_dagster.tools.kafka_workload import KafkaOrders


class LogMirror:
    """Copies what the log's buckets gained since the last ``sync``."""

    def __init__(self, topic_path: Path, bootstrap_servers: str, kafka_topic: str) -> None:
        self.topic_path = topic_path
        self.orders = KafkaOrders(bootstrap_servers, kafka_topic)
        self.copied: dict[int, int] = {}
        self._lock = threading.Lock()

    def sync(self) -> int:
        """Copy what is new; return how many records that was."""
        copied = 0
        with self._lock, Topic(self.topic_path) as log:
            for bucket, bounds in log.bounds().items():
                start = self.copied.get(bucket, bounds.earliest)
                if bounds.latest > start:
                    batches = list(log.read(bucket, start, bounds.latest))
                    self.orders.append(bucket, pa.Table.from_batches(batches))
                    self.copied[bucket] = bounds.latest
                    copied += bounds.latest - start
        return copied


@contextmanager
def mirrored(
    topic_path: Path, bootstrap_servers: str, kafka_topic: str, every_s: float = 0.5
) -> Iterator[LogMirror]:
    """The log's records copied now, and every ``every_s`` within the block."""
    mirror = LogMirror(topic_path, bootstrap_servers, kafka_topic)
    mirror.sync()
    stopping = threading.Event()

    def keep_copying() -> None:
        while not stopping.wait(every_s):
            mirror.sync()

    copier = threading.Thread(target=keep_copying, daemon=True)
    copier.start()
    try:
        yield mirror
    finally:
        stopping.set()
        copier.join(30)
