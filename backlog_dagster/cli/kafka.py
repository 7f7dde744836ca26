"""``backlog-dagster kafka …``: a Kafka-protocol cluster on loopback, and the workload."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from backlog_dagster.kafka.mock_broker import serve
from backlog_dagster.tools.kafka_workload import KafkaOrders
from backlog_dagster.tools.mirror import LogMirror
from backlog_dagster.tools.produce import produce_reference, workload_options


@click.group("kafka")
def kafka_group() -> None:
    """Kafka: a mock cluster to try things on, and the reference workload."""


@kafka_group.command("mock-broker")
@click.option("--brokers", type=click.IntRange(min=1), default=3, show_default=True)
def mock_broker(brokers: int) -> None:
    """Run librdkafka's mock cluster on loopback until stdin ends.

    Prints ``bootstrap <servers>``, then reads commands, one a line: ``topic NAME
    PARTITIONS``, ``down ID``, ``up ID``, ``leader TOPIC PARTITION ID``,
    ``delete-records TOPIC PARTITION OFFSET``. It keeps records in memory only, answers
    no offsets-for-times, and cannot add partitions to a topic.
    """
    serve(brokers, iter(sys.stdin), lambda text: click.echo(text))


@kafka_group.command("produce")
@click.option("--bootstrap-servers", required=True, help="host:port[,host:port…]")
@click.option("--topic", required=True, help="An existing topic; its partitions are the buckets.")
@workload_options
@click.option("--first-order-id", type=click.IntRange(min=0), default=0, show_default=True)
def produce(
    bootstrap_servers: str,
    topic: str,
    records: int,
    days: float,
    live_rate: float,
    live_seconds: float | None,
    first_order_id: int,
    seed: int,
) -> None:
    """Produce the reference ``orders`` workload as JSON values: a backlog, then a live rate.

    Read it with ``source.record_schema`` set to
    ``order_id BIGINT, customer_id STRING, region STRING, amount DOUBLE, event_time TIMESTAMP``.
    """
    orders = KafkaOrders(bootstrap_servers, topic)
    produce_reference(orders, records, days, live_rate, live_seconds, seed, first_order_id)


@kafka_group.command("mirror")
@click.argument("log_topic", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--bootstrap-servers", required=True, help="host:port[,host:port…]")
@click.option("--topic", required=True, help="An existing topic with a partition per bucket.")
@click.option("--follow", is_flag=True, help="Keep copying what is appended, until Ctrl-C.")
def mirror(log_topic: Path, bootstrap_servers: str, topic: str, follow: bool) -> None:
    """Copy a topic of the embedded log (of orders) to a Kafka topic, bucket to partition."""
    copier = LogMirror(log_topic, bootstrap_servers, topic)
    copied = copier.sync()
    click.echo(f"copied {copied:,} records to kafka topic {topic}")
    while follow:
        time.sleep(0.5)
        copier.sync()
