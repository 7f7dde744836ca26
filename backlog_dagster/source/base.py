"""What every source offers: buckets of offset-ordered records, and how Spark reads them.

The phases, the switch sensor and the checks at load time depend on the ``Source``
protocol only; ``backlog_dagster.implementations.open_source`` chooses the implementation
``source.kind`` names: the embedded log (``backlog_dagster.log``) or Kafka
(``backlog_dagster.kafka``).

Offsets are positions, not record numbers: a bucket's records have increasing offsets
that may leave gaps (Kafka's transaction markers take offsets of their own), so a read
of ``[start, end)`` ends when the reader's position reaches ``end``, whatever the last
record's offset, and progress is always a position.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from typing_extensions import Self

from backlog_dagster.errors import UserError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType


class SourceError(RuntimeError, UserError):
    """A source that is missing, or asked for something it lacks."""


#: The one text column of a JSON payload.
JSON_VALUE_COLUMN = "value"


class Payload(str, Enum):
    """How a source holds its records (its value is the name stored and written in YAML;
    ``str`` gives it, as ``enum.StrEnum`` would from Python 3.11 on)."""

    #: Typed columns.
    ARROW = "arrow"
    #: One JSON text per record, parsed by the reader against the schema the pipeline
    #: declares (``source.record_schema``); records that do not parse are reported.
    JSON = "json"

    def __str__(self) -> str:
        return self.value


class Bounds(Protocol):
    """A bucket's offsets: ``earliest`` is the first one held, ``latest`` the next one."""

    @property
    def earliest(self) -> int: ...

    @property
    def latest(self) -> int: ...


@dataclass(frozen=True)
class Arrivals:
    """A bucket's appends from some moment on, for event time as of arrival."""

    #: The latest record time (µs) among records appended before the moment; None if none.
    max_time_before_us: int | None
    #: When the last append before the moment happened; None if none.
    last_append_before: float | None
    #: ``(appended at, latest record time among that append's records)``, in time order.
    appends: list[tuple[float, int]]


@dataclass(frozen=True)
class StoredRecords:
    """A batch of one bucket's records as the source holds them."""

    #: The records, in the source's ``schema``.
    records: pa.RecordBatch
    #: Each record's offset (int64, increasing, not always dense).
    offsets: pa.Array
    #: ``(record_times, appended_at)``, made when first asked: a read that does not ask
    #: for them does not pay for them (Kafka's take a Python call per record).
    times: Callable[[], tuple[pa.Array, pa.Array]]

    @functools.cached_property
    def record_times(self) -> pa.Array:
        """Each record's time as the source keeps it (TIMESTAMP): the log's timestamp
        column, Kafka's record timestamp. Readable as ``_timestamp``."""
        return self.times()[0]

    @functools.cached_property
    def appended_at(self) -> pa.Array:
        """When each record arrived (TIMESTAMP). Readable as ``_appended_at``."""
        return self.times()[1]


class Source(Protocol):
    @property
    def name(self) -> str:
        """What the source is called in messages."""

    @property
    def schema(self) -> pa.Schema:
        """The records' columns (for a JSON payload: the one text column)."""

    @property
    def timestamp_column(self) -> str | None:
        """The column the source times its records by and indexes per append, so that
        it answers ``max_record_time``, ``append_time`` and ``arrivals`` without reading
        records; None for a source without such an index (those calls are then refused)."""

    @property
    def payload(self) -> Payload: ...

    def bounds(self) -> Mapping[int, Bounds]:
        """Every bucket's earliest and latest offset, read afresh (new buckets appear)."""

    def latest_offsets(self) -> dict[int, int]: ...

    def held_from(self, bucket: int, offset: int) -> tuple[int, int | None]:
        """The first stretch of offsets the source holds at or after ``offset``: where it
        starts (``offset`` itself unless retention removed it) and where it ends (None:
        it runs on to the bucket's end). A source with one part has one stretch."""

    def held_by(self, bucket: int, offset: int) -> str:
        """Which part of the source holds ``offset``, as the UI says it: ``log``,
        ``kafka``, ``archive`` (a source in front of another has more than one part)."""

    def offset_for_time(self, bucket: int, timestamp_us: int) -> int:
        """The first offset whose record time is at or after ``timestamp_us``."""

    def record_time(self, bucket: int, offset: int) -> int:
        """The record time (µs) of the record at ``offset``."""

    def max_record_time(self, bucket: int, start: int, end: int) -> int | None:
        """The latest record time among ``[start, end)``; None if empty."""

    def last_append_time(self, bucket: int) -> float | None:
        """When the bucket was last appended to (Unix s), for idleness."""

    def append_time(self, bucket: int, offset: int) -> float | None:
        """When the record at ``offset`` was appended; None past the end."""

    def arrivals(self, bucket: int, since: float, until: float = float("inf")) -> Arrivals:
        """The bucket's appends between two moments, with their latest record times."""

    def read_records(self, bucket: int, start: int, end: int) -> Iterator[StoredRecords]:
        """The bucket's records from position ``start`` until position ``end``, in order.
        An error naming the bucket and offsets if part of the range is not held."""

    def read_batch(
        self,
        spark: SparkSession,
        schema: str | StructType | None,
        start: Mapping[int, int] | None = None,
        end: Mapping[int, int] | None = None,
        tasks: int | None = None,
    ) -> DataFrame:
        """Records ``[start, end)`` of each bucket in ``start`` as a Spark DataFrame, in
        ``schema`` (DDL with the ``_bucket`` and ``_offset`` columns; None: the source's
        own columns and those two). Without ranges: every bucket, earliest to latest.
        Read in at least ``tasks`` Spark tasks, and at least as many as Spark runs at
        once (``spark.session.read_tasks``)."""

    def stream_reader(self, spark: SparkSession) -> DataStreamReader:
        """A Spark stream reader over the source; the caller adds ``startingOffsets``
        and ``maxRecordsPerTrigger``."""

    def check_reachable(self, spark: SparkSession) -> None:
        """Raise ``SourceError``, saying what to fix, if Spark's executors cannot read the
        source (a path they do not share, servers they cannot reach): a tiny job."""

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
