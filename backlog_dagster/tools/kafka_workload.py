"""The reference workload into a Kafka topic: the same orders as the embedded log gets
(``tools.workload``), as JSON values, partitioned by customer like a keyed producer.

Each record's Kafka timestamp is its arrival: the latest event time of its partition so
far, so timestamps never decrease within a partition, as a producer stamping the
current time makes them (and as Kafka's offsets-for-times assumes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from confluent_kafka import Producer

#: ``source.record_schema`` of a pipeline reading these orders.
ORDERS_RECORD_SCHEMA = (
    "order_id BIGINT, customer_id STRING, region STRING, amount DOUBLE, event_time TIMESTAMP"
)


@dataclass
class KafkaOrders:
    """A producer of orders to ``topic``, which must exist with its partitions."""

    bootstrap_servers: str
    topic: str
    _producer: Producer | None = None
    _latest_ms: dict[int, int] = field(default_factory=dict)

    def buckets(self) -> list[int]:
        metadata = self._client().list_topics(self.topic, timeout=30)
        found = metadata.topics.get(self.topic)
        if found is None or found.error is not None or not found.partitions:
            raise RuntimeError(f"kafka topic {self.topic} at {self.bootstrap_servers} not found")
        return sorted(found.partitions)

    def append(self, bucket: int, records: pa.Table) -> None:
        producer = self._client()
        frame = records.to_pandas()
        texts = frame.to_json(orient="records", lines=True, date_format="iso", date_unit="us")
        event_ms = records.column("event_time").cast(pa.int64()).to_numpy() // 1000
        arrival = np.maximum.accumulate(
            np.maximum(event_ms, self._latest_ms.get(bucket, np.iinfo(np.int64).min))
        )
        for text, at in zip(texts.splitlines(), arrival.tolist(), strict=True):
            while True:
                try:
                    producer.produce(self.topic, text.encode(), partition=bucket, timestamp=at)
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.1)
            producer.poll(0)
        if len(arrival):
            self._latest_ms[bucket] = int(arrival[-1])
        self.flush()

    def flush(self) -> None:
        left = self._client().flush(60)
        if left:
            raise RuntimeError(f"kafka topic {self.topic}: {left} records not delivered in 60 s")

    def _client(self) -> Producer:
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer(
                {
                    "bootstrap.servers": self.bootstrap_servers,
                    "linger.ms": 50,
                    "batch.size": 1_000_000,
                    # As producers of JSON commonly do; it also lets librdkafka's mock
                    # cluster, which keeps 5 MB a partition, hold about 150,000 orders a
                    # partition instead of about 35,000.
                    "compression.type": "zstd",
                    "enable.idempotence": True,
                    "queue.buffering.max.messages": 1_000_000,
                }
            )
        return self._producer
