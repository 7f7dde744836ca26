"""A Kafka topic as a ``Source``: partitions are buckets, Kafka offsets are offsets.

Kafka's offsets are positions, not record numbers. Under ``read_committed`` a
transaction's commit or abort marker takes an offset of its own and aborted records are
skipped, so a range ``[start, end)`` is read until the consumer's position reaches
``end``, never until a record at ``end - 1`` shows up (there may be none); the latest
offset is the last stable offset. A partition whose end is a marker finishes: the
consumer's end-of-partition event gives its position past it.

Record time is Kafka's record timestamp (the producer's create time, or the broker's
append time on a topic set to ``LogAppendTime``), readable as ``_timestamp``; it is
also each record's arrival (``_appended_at``). Kafka keeps no per-append index the
phases can ask without reading (``timestamp_column`` is None): lateness is judged at the
committed progress, and the backlog observes event times in its Spark job.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed
from typing_extensions import Self

from backlog_dagster.source.base import (
    JSON_VALUE_COLUMN,
    Arrivals,
    Payload,
    SourceError,
    StoredRecords,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, Message
    from confluent_kafka.admin import AdminClient
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType

TIMESTAMP = pa.timestamp("us", tz="UTC")
#: The name Spark knows Kafka topics' data source by (``backlog_dagster.kafka.spark``).
SPARK_FORMAT = "kafkabuckets"
#: That data source, as ``module:Class``, for a reader that opens it by name (an archive
#: in front of this source).
SPARK_DATA_SOURCE = "backlog_dagster.kafka.spark:KafkaDataSource"
#: The columns of a topic read with ``value_format: raw``.
RAW_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field(
            "headers",
            pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])),
        ),
        pa.field("timestamp", TIMESTAMP),
    ]
)
JSON_SCHEMA = pa.schema([pa.field(JSON_VALUE_COLUMN, pa.string())])
#: How long a read waits without any progress (a broker down, a transaction left open
#: under ``read_committed``) before it fails, naming what it waited for.
READ_PATIENCE_S = 60.0
#: How long a metadata or offsets request may take, answers saying a broker is not ready
#: (a leader moving, brokers restarting) asked again meanwhile.
REQUEST_TIMEOUT_S = 30.0
#: Errors of a broker not ready yet: asked again until ``REQUEST_TIMEOUT_S``. Against the
#: mock cluster taking its brokers down and up, an offsets request was answered at once
#: ``LEADER_NOT_AVAILABLE``, or ``_NOENT`` (librdkafka found no partition leaders), about
#: once in 500 rounds of offsets and reads.
TRANSIENT_ERRORS = frozenset(
    {
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_FOR_PARTITION",
        "BROKER_NOT_AVAILABLE",
        "REQUEST_TIMED_OUT",
        "NETWORK_EXCEPTION",
        "OFFSET_NOT_AVAILABLE",
        "_TRANSPORT",
        "_ALL_BROKERS_DOWN",
        "_NOENT",
    }
)
#: Records handed over per batch.
BATCH_RECORDS = 20_000
#: Spark option names (``kafka.<librdkafka setting>`` for the client's own settings).
OPTION_PREFIX = "kafka."


_Answer = TypeVar("_Answer")


class _NotAnswered(Exception):
    """A request the brokers answered with ``error`` (a ``KafkaError``)."""

    def __init__(self, error: Any) -> None:
        super().__init__(str(error))
        self.error = error

    @property
    def transient(self) -> bool:
        return bool(self.error.retriable()) or self.error.name() in TRANSIENT_ERRORS


@dataclass(frozen=True)
class KafkaSettings:
    """Everything a process needs to reach the topic, secrets resolved: it travels to
    Spark's workers as options (Spark redacts those whose names say password or secret)."""

    bootstrap_servers: str
    topic: str
    isolation_level: str = "read_committed"
    value_format: str = "json"
    properties: Mapping[str, str] = field(default_factory=dict)

    def client_config(self, **more: Any) -> dict[str, Any]:
        return {**self.properties, "bootstrap.servers": self.bootstrap_servers, **more}

    def to_options(self) -> dict[str, str]:
        return {
            "topic": self.topic,
            "isolationLevel": self.isolation_level,
            "valueFormat": self.value_format,
            f"{OPTION_PREFIX}bootstrap.servers": self.bootstrap_servers,
            **{f"{OPTION_PREFIX}{k}": v for k, v in self.properties.items()},
        }

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> KafkaSettings:
        """From Spark's options (keys lower-cased; librdkafka's names are lower case)."""
        lowered = {k.lower(): v for k, v in options.items()}
        client = {
            k[len(OPTION_PREFIX) :]: v for k, v in lowered.items() if k.startswith(OPTION_PREFIX)
        }
        servers = client.pop("bootstrap.servers", None)
        topic = lowered.get("topic")
        if servers is None or topic is None:
            raise ValueError("the kafka source needs options topic and kafka.bootstrap.servers")
        return cls(
            bootstrap_servers=servers,
            topic=topic,
            isolation_level=lowered.get("isolationlevel", "read_committed"),
            value_format=lowered.get("valueformat", "json"),
            properties=client,
        )


@dataclass(frozen=True)
class KafkaBounds:
    earliest: int
    latest: int


class KafkaTopic:
    """An open Kafka topic: an admin client for offsets, a consumer for records (made on
    first use). It commits nothing to Kafka: progress lives in the sink."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._admin_client: AdminClient | None = None
        self._consumer: Consumer | None = None

    @property
    def _admin(self) -> AdminClient:
        """The admin client, made on first use: what the topic is (its name, schema,
        payload) needs no broker, so Dagster loading a pipeline connects to none."""
        if self._admin_client is None:
            from confluent_kafka.admin import AdminClient

            self._admin_client = AdminClient(self.settings.client_config())
        return self._admin_client

    @_admin.setter
    def _admin(self, client: AdminClient) -> None:
        self._admin_client = client

    # -- what it is --------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.settings.topic

    @property
    def schema(self) -> pa.Schema:
        return JSON_SCHEMA if self.payload is Payload.JSON else RAW_SCHEMA

    @property
    def timestamp_column(self) -> str | None:
        return None

    @property
    def payload(self) -> Payload:
        return Payload.JSON if self.settings.value_format == "json" else Payload.ARROW

    # -- offsets -----------------------------------------------------------------------

    def partitions(self) -> list[int]:
        """The partition ids, read afresh: partitions added to the topic appear here."""
        from confluent_kafka import KafkaException

        def ask() -> list[int]:
            try:
                metadata = self._admin.list_topics(self.name, timeout=REQUEST_TIMEOUT_S)
            except KafkaException as error:
                raise _NotAnswered(error.args[0]) from error
            topic = metadata.topics.get(self.name)
            if topic is not None and topic.error is not None:
                raise _NotAnswered(topic.error)
            if topic is None:
                raise SourceError(
                    f"kafka topic {self.name} at {self.settings.bootstrap_servers}: "
                    "it does not exist"
                )
            return sorted(topic.partitions)

        return self._until_answered(ask, "cannot read the topic's metadata")

    def bounds(self) -> dict[int, KafkaBounds]:
        from confluent_kafka.admin import OffsetSpec

        partitions = self.partitions()
        earliest = self._list_offsets(dict.fromkeys(partitions, OffsetSpec.earliest()))
        latest = self._list_offsets(dict.fromkeys(partitions, OffsetSpec.latest()))
        return {p: KafkaBounds(earliest[p], latest[p]) for p in partitions}

    def _bounds_of(self, bucket: int) -> KafkaBounds:
        """One partition's bounds: two offsets requests for it alone."""
        from confluent_kafka.admin import OffsetSpec

        earliest = self._earliest_of(bucket)  # first: the latest is then at least it
        return KafkaBounds(earliest, self._list_offsets({bucket: OffsetSpec.latest()})[bucket])

    def _earliest_of(self, bucket: int) -> int:
        """One partition's earliest offset: one request for it alone."""
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets({bucket: OffsetSpec.earliest()})[bucket]

    def held_from(self, bucket: int, offset: int) -> tuple[int, int | None]:
        # Asked of every partition before each backlog job: one request, not all of bounds'.
        return max(offset, self._earliest_of(bucket)), None

    def held_by(self, bucket: int, offset: int) -> str:
        return "kafka"

    def latest_offsets(self) -> dict[int, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list_offsets(dict.fromkeys(self.partitions(), OffsetSpec.latest()))

    def offset_for_time(self, bucket: int, timestamp_us: int) -> int:
        """Kafka's offsets-for-times; where the broker does not answer it (it says -1, no
        such record, while the partition holds a later one), a binary search over record
        timestamps, which assumes they do not decrease within the partition."""
        from confluent_kafka.admin import OffsetSpec

        millis = -(-timestamp_us // 1000)  # the first millisecond at or after the moment
        answer = self._list_offsets({bucket: OffsetSpec.for_timestamp(millis)})[bucket]
        bounds = self._bounds_of(bucket)
        if answer >= 0:
            return answer
        last = self._last_record(bucket, bounds)
        if last is None or last[1] < timestamp_us:
            return bounds.latest  # no record at or after the moment
        answer, low, high = last[0], bounds.earliest, last[0]  # search [low, high)
        while low < high:
            middle = (low + high) // 2
            found = self._first_record_at(bucket, middle, high)
            if found is None:  # no record in [middle, high)
                high = middle
            elif found[1] >= timestamp_us:  # none in [middle, found) either
                answer, high = found[0], middle
            else:
                low = found[0] + 1
        return answer

    def record_time(self, bucket: int, offset: int) -> int:
        found = self._first_record_at(bucket, offset, self._bounds_of(bucket).latest)
        if found is None:
            raise SourceError(f"kafka topic {self.name} partition {bucket}: no record at {offset}")
        return found[1]

    def last_append_time(self, bucket: int) -> float | None:
        last = self._last_record(bucket, self._bounds_of(bucket))
        return None if last is None else last[1] / 1_000_000

    def max_record_time(self, bucket: int, start: int, end: int) -> int | None:
        raise self._no_index()

    def append_time(self, bucket: int, offset: int) -> float | None:
        raise self._no_index()

    def arrivals(self, bucket: int, since: float, until: float = float("inf")) -> Arrivals:
        raise self._no_index()

    # -- records -----------------------------------------------------------------------

    def read_records(self, bucket: int, start: int, end: int) -> Iterator[StoredRecords]:
        from confluent_kafka import KafkaError, Message, TopicPartition

        if start > end:
            raise SourceError(f"partition {bucket}: range [{start}, {end}) is reversed")
        if start == end:
            return
        consumer = self._reader()
        consumer.assign([TopicPartition(self.name, bucket, start)])
        position = start
        progress_at = time.monotonic()
        try:
            while position < end:
                # Ask no more than the range can hold: consume returns when it has them.
                wanted = max(1, min(BATCH_RECORDS, end - position))
                rows = consumer.consume(wanted, timeout=1.0)
                if any(map(Message.error, rows)):  # an end of partition, or a failure
                    events, rows = rows, []
                    for message in events:
                        error = message.error()
                        if error is None:
                            rows.append(message)
                        elif error.code() == KafkaError._PARTITION_EOF:
                            position = max(position, message.offset() or 0)
                        else:
                            raise self._read_error(bucket, start, end, error.str())
                # Offsets increase: records past the range can only be at the tail.
                while rows and (rows[-1].offset() or 0) >= end:
                    rows.pop()
                    position = max(position, end)
                if rows:
                    position = max(position, (rows[-1].offset() or 0) + 1)
                    yield self._stored(rows)
                if position >= end:
                    break
                moved = consumer.position([TopicPartition(self.name, bucket)])[0].offset
                advanced = bool(rows) or moved > position
                position = max(position, moved)
                if position >= end:
                    break
                if advanced:
                    progress_at = time.monotonic()
                elif time.monotonic() - progress_at > READ_PATIENCE_S:
                    raise self._read_error(
                        bucket,
                        start,
                        end,
                        f"no progress for {READ_PATIENCE_S:g} s at offset {position} (brokers "
                        "down, or a transaction left open under read_committed)",
                    )
        finally:
            consumer.unassign()

    def _stored(self, rows: list[Message]) -> StoredRecords:
        """One batch of a partition's messages, with a Python call per message only for
        what the batch holds (each ``Message`` getter is one): values, and offsets where
        markers or gaps leave them not dense; record times only when asked."""
        from confluent_kafka import Message

        values = pa.array(list(map(Message.value, rows)), pa.binary())
        times = functools.cache(functools.partial(_record_times, rows))
        if self.payload is Payload.JSON:
            try:
                texts = values.cast(pa.string())  # checks the UTF-8 natively
            except pa.ArrowInvalid:
                texts = pa.array([_text(m.value()) for m in rows], pa.string())
            records = pa.record_batch([texts], schema=JSON_SCHEMA)
        else:
            headers = [[{"key": k, "value": v} for k, v in _header_pairs(m)] for m in rows]
            records = pa.record_batch(
                [
                    pa.array(list(map(Message.key, rows)), pa.binary()),
                    values,
                    pa.array(headers, RAW_SCHEMA.field("headers").type),
                    times()[0],
                ],
                schema=RAW_SCHEMA,
            )
        return StoredRecords(records=records, offsets=_offsets(rows), times=times)

    # -- Spark -------------------------------------------------------------------------

    def read_batch(
        self,
        spark: SparkSession,
        schema: str | StructType | None,
        start: Mapping[int, int] | None = None,
        end: Mapping[int, int] | None = None,
        tasks: int | None = None,
    ) -> DataFrame:
        from backlog_dagster.source.spark import read_ranges

        reader = spark.read.format(SPARK_FORMAT).options(**self.settings.to_options())
        return read_ranges(spark, reader, schema, start, end, tasks)

    def stream_reader(self, spark: SparkSession) -> DataStreamReader:
        return spark.readStream.format(SPARK_FORMAT).options(**self.settings.to_options())

    def check_reachable(self, spark: SparkSession) -> None:
        """One one-task job: can an executor list the topic's partitions?"""
        from backlog_dagster.spark.session import on_an_executor

        settings = self.settings

        def reach(_: str) -> str | None:
            try:
                with KafkaTopic(settings) as topic:
                    topic.partitions()
            except Exception as error:  # what the executor saw, to say it here
                return f"{type(error).__name__}: {error}"
            return None

        seen = on_an_executor(spark, reach, "", "string")
        if seen is not None:
            raise SourceError(
                f"kafka topic {self.name}: Spark's executors cannot reach it at "
                f"{settings.bootstrap_servers} ({seen}); the brokers must be reachable "
                "from every machine that runs an executor"
            )

    # -- helpers -----------------------------------------------------------------------

    def _list_offsets(self, specs: Mapping[int, Any]) -> dict[int, int]:
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

        level = (
            IsolationLevel.READ_COMMITTED
            if self.settings.isolation_level == "read_committed"
            else IsolationLevel.READ_UNCOMMITTED
        )
        asked = {TopicPartition(self.name, p): spec for p, spec in specs.items()}

        def ask() -> dict[int, int]:
            futures = self._admin.list_offsets(
                asked, isolation_level=level, request_timeout=REQUEST_TIMEOUT_S
            )
            try:
                return {tp.partition: future.result().offset for tp, future in futures.items()}
            except KafkaException as error:
                raise _NotAnswered(error.args[0]) from error

        return self._until_answered(ask, "cannot list offsets")

    def _until_answered(self, ask: Callable[[], _Answer], failing: str) -> _Answer:
        """``ask()``, asked again while the brokers say they are not ready, for up to
        ``REQUEST_TIMEOUT_S``; a ``SourceError`` saying ``failing`` and why if never."""
        retrying = Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, _NotAnswered) and e.transient),
            wait=wait_fixed(0.2),
            stop=stop_after_delay(REQUEST_TIMEOUT_S),
            reraise=True,
        )
        try:
            return retrying(ask)
        except _NotAnswered as error:
            raise SourceError(
                f"kafka topic {self.name} at {self.settings.bootstrap_servers}: {failing} "
                f"({error.error})"
            ) from error

    def _reader(self) -> Consumer:
        from confluent_kafka import Consumer

        if self._consumer is None:
            self._consumer = Consumer(
                # Ranges are read only where records are known to be: a broker need not
                # hold a fetch open waiting for more (librdkafka's 500 ms default made
                # each new range wait half a second). A pipeline's properties may say
                # otherwise.
                {"fetch.wait.max.ms": 10}
                | self.settings.client_config(
                    **{
                        # Never used to commit: a group id only because librdkafka asks one.
                        "group.id": f"backlog-dagster-{uuid.uuid4().hex[:8]}",
                        "enable.auto.commit": False,
                        "enable.auto.offset.store": False,
                        "enable.partition.eof": True,
                        "isolation.level": self.settings.isolation_level,
                        # Below the earliest offset is an error, never a silent jump.
                        "auto.offset.reset": "error",
                    }
                )
            )
        return self._consumer

    def _first_record_at(self, bucket: int, offset: int, end: int) -> tuple[int, int] | None:
        """``(offset, record time µs)`` of the first record at or after ``offset``,
        before ``end``; None if there is none."""
        for stored in self.read_records(bucket, offset, end):
            if stored.offsets:
                time_us = stored.record_times.cast(pa.int64())[0].as_py()
                return stored.offsets[0].as_py(), time_us if time_us is not None else 0
        return None

    def _last_record(self, bucket: int, bounds: KafkaBounds) -> tuple[int, int] | None:
        """``(offset, record time µs)`` of the partition's last record: read back from
        the end, further each time, past any markers there."""
        back = 16
        while True:
            start = max(bounds.earliest, bounds.latest - back)
            last = None
            for stored in self.read_records(bucket, start, bounds.latest):
                if stored.offsets:
                    times = stored.record_times.cast(pa.int64())
                    last = stored.offsets[-1].as_py(), times[-1].as_py() or 0
            if last is not None or start == bounds.earliest:
                return last
            back *= 16

    def _read_error(self, bucket: int, start: int, end: int, reason: str) -> SourceError:
        return SourceError(
            f"kafka topic {self.name} partition {bucket}: reading offsets [{start}, {end}) "
            f"failed: {reason}"
        )

    def _no_index(self) -> SourceError:
        return SourceError(
            f"kafka topic {self.name} keeps no per-append index of record times; this "
            "pipeline needs one (the embedded log has it)"
        )

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _offsets(rows: list[Message]) -> pa.Array:
    """The messages' offsets (int64). A partition's offsets increase, so a first and a
    last that far apart are every offset between: no call per message then."""
    first, last = rows[0].offset() or 0, rows[-1].offset() or 0
    if last - first == len(rows) - 1:
        return pa.arange(first, last + 1)
    return pa.array([m.offset() for m in rows], pa.int64())


def _record_times(rows: list[Message]) -> tuple[pa.Array, pa.Array]:
    """The messages' Kafka timestamps (TIMESTAMP, null where the broker has none), which
    are both their record time and their arrival."""
    from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

    stamps = (m.timestamp() for m in rows)
    millis = [None if kind == TIMESTAMP_NOT_AVAILABLE else at for kind, at in stamps]
    times = pa.array(millis, pa.timestamp("ms", tz="UTC")).cast(TIMESTAMP)
    return times, times


def _header_pairs(message: Message) -> list[tuple[str, bytes | None]]:
    return list(message.headers() or [])  # type: ignore[arg-type]  # pairs, typed loosely


def _text(value: bytes | None) -> str | None:
    """A value as text; bytes that are not UTF-8 become replacement characters (a
    tombstone, None, goes to the dead letters as not JSON)."""
    return None if value is None else value.decode("utf-8", errors="replace")
