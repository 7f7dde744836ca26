"""Kafka as a source, against librdkafka's mock cluster on loopback (its own process).

What the mock does and does not do is what these tests say: it keeps transactions'
markers (so offsets are not dense) but drops aborted records even for read_uncommitted,
answers no offsets-for-times (so the fallback search is what runs), and cannot add
partitions to a topic.
"""

from __future__ import annotations

import io
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.json as pa_json
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from backlog_dagster.archive.layout import file_path
from backlog_dagster.implementations import open_source
from backlog_dagster.kafka.mock_broker import MockBroker, mock_broker
from backlog_dagster.kafka.topic import KafkaSettings, KafkaTopic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.markers import current_generation
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.source import SourceError
from backlog_dagster.source.schema import parse_ddl
from backlog_dagster.tools.kafka_workload import ORDERS_RECORD_SCHEMA, KafkaOrders
from backlog_dagster.tools.workload import produce_backlog
from tests.pipelines import CUSTOMER_TOTALS, assert_same, customer_totals_oracle
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached


@pytest.fixture(scope="module")
def broker() -> Iterator[MockBroker]:
    with mock_broker(3) as running:
        yield running


def new_topic(broker: MockBroker, partitions: int = 4) -> str:
    name = f"orders-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, partitions)
    return name


def kafka_pipeline(
    tmp_path: Path, broker: MockBroker, topic: str, **attributes: Any
) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": "customer_totals",
            "source": {
                "kind": "kafka",
                "kafka": {"bootstrap_servers": broker.bootstrap, "topic": topic},
                "event_time": "event_time",
                "record_schema": ORDERS_RECORD_SCHEMA,
                **attributes.pop("source", {}),
            },
            "transform": CUSTOMER_TOTALS,
            "sink": {"path": str(tmp_path / "results.sqlite"), "table": "customer_totals"},
            **attributes,
        }
    )


def produce_orders(broker: MockBroker, topic: str, records: int, first: int = 0) -> None:
    produce_backlog(
        KafkaOrders(broker.bootstrap, topic), records, 1.0, first_order_id=first, seed=first + 5
    )


def records_in(broker: MockBroker, topic: str) -> pd.DataFrame:
    """Every record the topic holds now, parsed: what the oracle aggregates."""
    rows = []
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        for partition, bounds in kafka.bounds().items():
            for stored in kafka.read_records(partition, bounds.earliest, bounds.latest):
                rows += [json.loads(text) for text in stored.records.column(0).to_pylist()]
    return pd.DataFrame(rows)


def latest(broker: MockBroker, topic: str) -> dict[int, int]:
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        return kafka.latest_offsets()


def transactions(broker: MockBroker, topic: str, first: int) -> int:
    """A committed, an aborted and a committed transaction on partition 0; returns how
    many committed records they hold."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic})
    producer.init_transactions(30)
    committed = 0
    for number, outcome in enumerate(("commit", "abort", "commit")):
        producer.begin_transaction()
        for i in range(3):
            order = {
                "order_id": first + number * 10 + i,
                "customer_id": f"T{number}",
                "region": "region-00",
                "amount": 1.5,
                "event_time": "2026-11-23T00:00:00Z",
            }
            producer.produce(topic, json.dumps(order).encode(), partition=0)
        if outcome == "commit":
            producer.commit_transaction(30)
            committed += 3
        else:
            producer.abort_transaction(30)
    return committed


def test_a_range_is_read_by_position_across_transaction_markers(broker: MockBroker) -> None:
    topic = new_topic(broker, partitions=1)
    produce_orders(broker, topic, 100)
    committed = transactions(broker, topic, first=1_000)
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        bounds = kafka.bounds()[0]
        offsets = [
            o
            for s in kafka.read_records(0, bounds.earliest, bounds.latest)
            for o in s.offsets.to_pylist()
        ]
        # The last offset is a commit marker: the read ends there all the same.
        assert len(offsets) == 100 + committed < bounds.latest - bounds.earliest
        assert offsets[-1] < bounds.latest - 1
        # A range that holds nothing but a marker is read, empty, and ends.
        assert list(kafka.read_records(0, bounds.latest - 1, bounds.latest)) == []
    customers = records_in(broker, topic)["customer_id"]
    assert set(customers[customers.str.startswith("T")]) == {"T0", "T2"}


def test_offsets_for_times_falls_back_to_a_search_where_the_broker_does_not_answer(
    broker: MockBroker,
) -> None:
    topic = new_topic(broker, partitions=2)
    produce_orders(broker, topic, 4_000)
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        for partition, bounds in kafka.bounds().items():
            times = []
            for stored in kafka.read_records(partition, bounds.earliest, bounds.latest):
                times += stored.record_times.cast("int64").to_pylist()
            for moment in (times[0] - 1, times[len(times) // 3], times[-1], times[-1] + 1):
                want = next((i for i, t in enumerate(times) if t >= moment), bounds.latest)
                assert kafka.offset_for_time(partition, moment) == want


def test_records_removed_by_retention_are_an_error_not_a_silent_jump(broker: MockBroker) -> None:
    topic = new_topic(broker, partitions=1)
    produce_orders(broker, topic, 500)
    broker.delete_records(topic, 0, 200)
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        assert kafka.bounds()[0].earliest == 200
        with pytest.raises(SourceError, match=r"partition 0: reading offsets \[100, 500\)"):
            list(kafka.read_records(0, 100, 500))


def test_a_read_waits_out_brokers_that_are_down(broker: MockBroker) -> None:
    topic = new_topic(broker, partitions=1)
    produce_orders(broker, topic, 20_000)
    got: list[int] = []
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        end = kafka.latest_offsets()[0]
        for broker_id in (1, 2, 3):
            broker.set_down(broker_id)
        threading.Timer(4, lambda: [broker.set_up(b) for b in (1, 2, 3)]).start()
        began = time.monotonic()
        for stored in kafka.read_records(0, 0, end):
            got += stored.offsets.to_pylist()
    assert got == list(range(end)) and time.monotonic() - began >= 3


class NotReadyTwice:
    """An admin client whose first two offsets requests the brokers answer "leader not
    available", as the mock cluster did while its brokers came back up."""

    def __init__(self, admin: Any, error: int) -> None:
        self.admin, self.error, self.refused = admin, error, 0

    def __getattr__(self, name: str) -> Any:  # the topic's metadata: the real client's
        return getattr(self.admin, name)

    def list_offsets(self, asked: dict[Any, Any], **options: Any) -> dict[Any, Any]:
        from concurrent.futures import Future

        from confluent_kafka import KafkaError, KafkaException

        if self.refused == 2:
            return self.admin.list_offsets(asked, **options)
        self.refused += 1
        futures = {}
        for partition in asked:
            futures[partition] = Future()
            futures[partition].set_exception(KafkaException(KafkaError(self.error)))
        return futures


def test_offsets_are_asked_again_while_a_broker_is_not_ready(broker: MockBroker) -> None:
    from confluent_kafka import KafkaError

    topic = new_topic(broker, partitions=2)
    produce_orders(broker, topic, 100)
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        expected, real = kafka.latest_offsets(), kafka._admin
        not_ready = NotReadyTwice(real, KafkaError.LEADER_NOT_AVAILABLE)
        kafka._admin = not_ready  # type: ignore[assignment]
        assert kafka.latest_offsets() == expected
        assert not_ready.refused == 2
        # Anything else is no passing state: said at once.
        kafka._admin = NotReadyTwice(real, KafkaError.TOPIC_AUTHORIZATION_FAILED)  # type: ignore[assignment]
        began = time.monotonic()
        with pytest.raises(SourceError, match=r"cannot list offsets.*TOPIC_AUTHORIZATION"):
            kafka.latest_offsets()
        assert time.monotonic() - began < 5


def test_backlog_then_realtime_on_kafka_equal_the_oracle(
    spark: SparkSession, broker: MockBroker, tmp_path: Path
) -> None:
    """Transactions (markers at a partition's end), retention under on_truncation: skip,
    and brokers down for a while during realtime: nothing lost or doubled."""
    topic = new_topic(broker)
    produce_orders(broker, topic, 30_000)
    config = kafka_pipeline(
        tmp_path,
        broker,
        topic,
        source={"on_truncation": "skip"},
        backlog={"checkpoint_interval": 0.1},
        realtime={"checkpoint_interval": 0.5},
    )
    with open_sink(config) as sink, open_source(config) as kafka:
        current_generation(sink, kafka, config, print)  # markers from offset 0...
        broker.delete_records(topic, 1, 100)  # ...and retention takes some: skipped
        run_backlog(spark, config, sink, log=print)
        assert sink.current_generation().buckets[1].start == 0
    assert reached(config) == latest(broker, topic)
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    produce_orders(broker, topic, 5_000, first=100_000)
    transactions(broker, topic, first=200_000)  # partition 0 ends on a marker
    for broker_id in (1, 2, 3):
        broker.set_down(broker_id)
    time.sleep(4)
    for broker_id in (1, 2, 3):
        broker.set_up(broker_id)
    produce_orders(broker, topic, 5_000, first=300_000)
    wait_for(lambda: reached(config) == latest(broker, topic), timeout=180)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_in(broker, topic))
    assert_same(results, oracle, ["customer_id"])


def test_an_archive_in_kafka_connects_layout_then_the_topic_equal_the_oracle(
    spark: SparkSession, broker: MockBroker, tmp_path: Path
) -> None:
    """FLIP-309's first example: the older half of each partition only in Parquet files as
    Kafka Connect's S3 sink writes them (ParquetFormat: the record's fields as columns),
    retention having taken it from the topic; the backlog reads both, realtime the topic."""
    topic = new_topic(broker, partitions=3)
    produce_orders(broker, topic, 12_000)
    root = tmp_path / "archive"
    archived = []
    with KafkaTopic(KafkaSettings(broker.bootstrap, topic)) as kafka:
        for partition, bounds in kafka.bounds().items():
            cut = bounds.latest // 2
            for first in range(0, cut, 1_500):
                texts = [
                    text
                    for stored in kafka.read_records(partition, first, min(first + 1_500, cut))
                    for text in stored.records.column(0).to_pylist()
                ]
                table = pa_json.read_json(
                    io.BytesIO("\n".join(texts).encode()),
                    parse_options=pa_json.ParseOptions(
                        explicit_schema=parse_ddl(ORDERS_RECORD_SCHEMA)
                    ),
                )
                path = file_path(root, topic, partition, first, "parquet")
                path.parent.mkdir(parents=True, exist_ok=True)
                pq.write_table(table, path)
                archived.append(table.to_pandas())
            broker.delete_records(topic, partition, cut)
    config = kafka_pipeline(
        tmp_path,
        broker,
        topic,
        source={"archive": {"path": str(root), "format": "parquet"}},
        realtime={"checkpoint_interval": 0.5},
    )
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=print)
        assert all(b.start == 0 for b in sink.current_generation().buckets.values())  # type: ignore[union-attr]
    assert set(report.read_from.values()) == {"archive, kafka"}
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    produce_orders(broker, topic, 3_000, first=100_000)
    wait_for(lambda: reached(config) == latest(broker, topic), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    everything = pd.concat([*archived, records_in(broker, topic)], ignore_index=True)
    assert_same(results, customer_totals_oracle(everything), ["customer_id"])


def test_a_backlog_run_waits_out_brokers_that_are_down(
    spark: SparkSession, broker: MockBroker, tmp_path: Path
) -> None:
    topic = new_topic(broker)
    produce_orders(broker, topic, 40_000)
    config = kafka_pipeline(tmp_path, broker, topic, backlog={"checkpoint_interval": 0.5})
    failed: list[BaseException] = []

    def backlog() -> None:
        try:
            with open_sink(config) as sink:
                run_backlog(spark, config, sink, log=print)
        except BaseException as error:  # reported below
            failed.append(error)

    with open_sink(config) as sink, open_source(config) as kafka:
        current_generation(sink, kafka, config, print)  # the markers
    runner = threading.Thread(target=backlog)
    for broker_id in (1, 2, 3):
        broker.set_down(broker_id)
    runner.start()  # it finds the brokers down, and they come back while it waits
    time.sleep(4)
    for broker_id in (1, 2, 3):
        broker.set_up(broker_id)
    runner.join(300)
    assert not failed and not runner.is_alive()
    assert reached(config) == latest(broker, topic)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(results, customer_totals_oracle(records_in(broker, topic)), ["customer_id"])


def test_raw_values_are_parsed_by_the_pipeline_and_timed_by_kafka(
    spark: SparkSession, broker: MockBroker, tmp_path: Path
) -> None:
    """``value_format: raw``: key, value, headers and timestamp columns; the pipeline
    parses the value in ``transform.columns`` and takes Kafka's timestamp as event time."""
    topic = new_topic(broker, partitions=2)
    produce_orders(broker, topic, 5_000)
    value = "CAST(value AS STRING)"
    config = PipelineConfig.model_validate(
        {
            "name": "customer_totals",
            "source": {
                "kind": "kafka",
                "kafka": {
                    "bootstrap_servers": broker.bootstrap,
                    "topic": topic,
                    "value_format": "raw",
                },
                "event_time": "timestamp",
            },
            "transform": {
                **CUSTOMER_TOTALS,
                "columns": {
                    "customer_id": f"get_json_object({value}, '$.customer_id')",
                    "amount": f"CAST(get_json_object({value}, '$.amount') AS DOUBLE)",
                },
            },
            "sink": {"path": str(tmp_path / "results.sqlite"), "table": "customer_totals"},
        }
    )
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
        buckets = sink.current_generation().buckets.values()  # type: ignore[union-attr]
    assert all(b.event_time_us is not None for b in buckets)
    assert_same(results, customer_totals_oracle(records_in(broker, topic)), ["customer_id"])


@pytest.mark.parametrize(
    ("kafka", "error"),
    [
        ({"properties": {"sasl.password": "hunter2"}}, "holds a secret"),
        ({"properties": {"group.id": "mine"}}, "set by backlog-dagster itself"),
        ({"bootstrap_servers": "sasl://user:hunter2@host:9092"}, "holds a secret"),
    ],
)
def test_kafka_settings_are_checked_and_secrets_never_shown(
    tmp_path: Path, kafka: dict[str, Any], error: str
) -> None:
    source = {
        "kind": "kafka",
        "kafka": {"bootstrap_servers": "127.0.0.1:9092", "topic": "orders", **kafka},
        "event_time": "event_time",
    }
    with pytest.raises(ValueError, match=error) as raised:
        PipelineConfig.model_validate(
            {
                "name": "p",
                "source": source,
                "transform": CUSTOMER_TOTALS,
                "sink": {"path": str(tmp_path / "r.sqlite"), "table": "p"},
            }
        )
    assert "hunter2" not in str(raised.value)


def test_a_source_names_what_its_kind_needs(tmp_path: Path) -> None:
    base = {
        "name": "p",
        "transform": CUSTOMER_TOTALS,
        "sink": {"path": str(tmp_path / "r.sqlite"), "table": "p"},
    }
    with pytest.raises(ValueError, match=r"source\.kafka is required"):
        PipelineConfig.model_validate({**base, "source": {"kind": "kafka", "event_time": "t"}})
    with pytest.raises(ValueError, match=r"source\.path is required"):
        PipelineConfig.model_validate({**base, "source": {"event_time": "t"}})
    env = {"bootstrap_servers": {"env": "BROKERS"}, "topic": "orders"}
    config = PipelineConfig.model_validate(
        {**base, "source": {"kind": "kafka", "kafka": env, "event_time": "t"}}
    )
    assert config.source.describe() == "kafka topic orders at $BROKERS"
    json_archive = {"path": str(tmp_path / "archive"), "format": "json"}
    with pytest.raises(ValueError, match=r"in front of a kafka topic must be parquet"):
        PipelineConfig.model_validate(
            {
                **base,
                "source": {
                    "kind": "kafka",
                    "kafka": env,
                    "event_time": "t",
                    "archive": json_archive,
                },
            }
        )
