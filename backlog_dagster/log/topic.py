"""A topic: a directory of buckets sharing one record schema.

The topic's own metadata (schema, timestamp column, payload kind, the list of buckets)
lives in ``topic.sqlite`` beside the bucket files, so adding buckets is one transaction
that any reader sees on its next ``buckets()`` call: that is how readers discover them.

A topic is the embedded log's implementation of the ``Source`` contract
(``backlog_dagster.source``), plus what only the log does: append, add buckets.
"""

from __future__ import annotations

import functools
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from backlog_dagster.log.bucket import Arrivals, Bucket, BucketBounds, Records
from backlog_dagster.source.base import JSON_VALUE_COLUMN, Payload, SourceError, StoredRecords
from backlog_dagster.source.schema import TIMESTAMP, SchemaError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType

_METADATA_FILE = "topic.sqlite"


def _is_file(path: str) -> bool:
    """Run on an executor, by ``Topic.check_reachable``."""
    return Path(path).is_file()


class TopicError(SourceError):
    """A topic that is missing, already exists, or is asked for something it lacks."""


@dataclass(frozen=True)
class BucketInfo:
    """What ``describe`` reports for one bucket."""

    bucket: int
    bounds: BucketBounds
    size_bytes: int


#: The name of the log's Spark data source (``backlog_dagster.log.spark``), here so
#: that naming it needs no pyspark.
SPARK_FORMAT = "bucketlog"
#: That data source, as ``module:Class``, for a reader that opens it by name (an archive
#: in front of this source).
SPARK_DATA_SOURCE = "backlog_dagster.log.spark:BucketLogDataSource"


class Topic:
    """An open topic. Bucket handles are opened on demand and cached per instance."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        metadata = self.path / _METADATA_FILE
        if not metadata.exists():
            raise TopicError(f"no topic at {self.path} (expected {_METADATA_FILE} there)")
        with closing(sqlite3.connect(metadata, timeout=60)) as db:
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        self.schema: pa.Schema = pa.ipc.read_schema(pa.py_buffer(meta["schema"]))
        self.timestamp_column: str = meta["timestamp_column"].decode()
        self.payload = Payload(meta["payload"].decode())
        compression = meta["compression"].decode()
        self.compression: str | None = compression or None
        self._buckets: dict[int, Bucket] = {}
        #: Bucket ids as last read from the metadata.
        self._known: set[int] = set()

    @property
    def name(self) -> str:
        return self.path.name

    def buckets(self) -> list[int]:
        """The bucket ids, read afresh: buckets added by another process appear here."""
        with closing(sqlite3.connect(self.path / _METADATA_FILE, timeout=60)) as db:
            return [row[0] for row in db.execute("SELECT id FROM buckets ORDER BY id")]

    def bucket(self, bucket_id: int) -> Bucket:
        if bucket_id not in self._buckets:
            # Buckets are only ever added: the ids read once answer until one is new.
            if bucket_id not in self._known and bucket_id not in self._read_known():
                raise TopicError(f"topic {self.name} has no bucket {bucket_id}")
            self._buckets[bucket_id] = Bucket(
                self.path / _bucket_file(bucket_id),
                bucket_id,
                self.schema,
                self.timestamp_column,
                self.compression,
            )
        return self._buckets[bucket_id]

    def _read_known(self) -> set[int]:
        self._known = set(self.buckets())
        return self._known

    def bounds(self) -> dict[int, BucketBounds]:
        """Earliest and latest offset of every bucket."""
        return {b: self.bucket(b).bounds() for b in self.buckets()}

    def latest_offsets(self) -> dict[int, int]:
        return {b: bounds.latest for b, bounds in self.bounds().items()}

    def held_from(self, bucket: int, offset: int) -> tuple[int, int | None]:
        # The one bucket's bounds: asked of every bucket before each backlog job, all
        # buckets' bounds each time would cost buckets² look-ups.
        return max(offset, self.bucket(bucket).bounds().earliest), None

    def held_by(self, bucket: int, offset: int) -> str:
        return "log"

    def describe(self) -> list[BucketInfo]:
        return [
            BucketInfo(b, self.bucket(b).bounds(), self.bucket(b).size_bytes())
            for b in self.buckets()
        ]

    def read(self, bucket_id: int, start: int, end: int) -> Iterator[pa.RecordBatch]:
        return self.bucket(bucket_id).read(start, end)

    def read_records(self, bucket_id: int, start: int, end: int) -> Iterator[StoredRecords]:
        offset = start
        for stored, appended_at in self.bucket(bucket_id).read_arrivals(start, end):
            rows = stored.num_rows
            yield StoredRecords(
                records=stored,
                offsets=pa.arange(offset, offset + rows),
                times=functools.partial(self._times, stored, appended_at),
            )
            offset += rows

    def _times(self, stored: pa.RecordBatch, appended_at: float) -> tuple[pa.Array, pa.Array]:
        """A batch's record times, and its append's time for each record."""
        at = pa.scalar(round(appended_at * 1_000_000), TIMESTAMP)
        return stored.column(self.timestamp_column), pa.repeat(at, stored.num_rows)

    def arrivals(self, bucket_id: int, since: float, until: float = float("inf")) -> Arrivals:
        return self.bucket(bucket_id).arrivals(since, until)

    def append_time(self, bucket_id: int, offset: int) -> float | None:
        return self.bucket(bucket_id).append_time(offset)

    def append(self, bucket_id: int, records: Records) -> tuple[int, int]:
        """Append records (an Arrow table or batch, or a pandas DataFrame) to a bucket.

        They must have the topic's columns (others are ignored) in types that cast to
        its schema; timestamps finer than microseconds are refused. Returns the offsets
        they got, ``[first, next)``, once they are on disk.
        """
        return self.bucket(bucket_id).append(records)

    def offset_for_time(self, bucket_id: int, timestamp_us: int) -> int:
        return self.bucket(bucket_id).offset_for_time(timestamp_us)

    def record_time(self, bucket_id: int, offset: int) -> int:
        return self.bucket(bucket_id).record_time(offset)

    def max_record_time(self, bucket_id: int, start: int, end: int) -> int | None:
        return self.bucket(bucket_id).max_record_time(start, end)

    def append_times(self, bucket_id: int, start: int, end: int) -> list[tuple[int, int, float]]:
        return self.bucket(bucket_id).append_times(start, end)

    def last_append_time(self, bucket_id: int) -> float | None:
        return self.bucket(bucket_id).last_append_time()

    def add_buckets(self, count: int) -> list[int]:
        """Add ``count`` empty buckets; return their ids."""
        if count < 1:
            raise TopicError(f"add at least one bucket, not {count}")
        with closing(sqlite3.connect(self.path / _METADATA_FILE, timeout=60)) as db, db:
            (top,) = db.execute("SELECT coalesce(max(id), -1) FROM buckets").fetchone()
            new_ids = list(range(top + 1, top + 1 + count))
            for bucket_id in new_ids:
                # The bucket file exists before readers can learn its id.
                Bucket(
                    self.path / _bucket_file(bucket_id),
                    bucket_id,
                    self.schema,
                    self.timestamp_column,
                    self.compression,
                    create=True,
                ).close()
                db.execute(
                    "INSERT INTO buckets (id, created_at) VALUES (?, ?)", (bucket_id, time.time())
                )
        return new_ids

    def read_batch(
        self,
        spark: SparkSession,
        schema: str | StructType | None,
        start: Mapping[int, int] | None = None,
        end: Mapping[int, int] | None = None,
        tasks: int | None = None,
    ) -> DataFrame:
        from backlog_dagster.source.spark import read_ranges

        reader = spark.read.format(SPARK_FORMAT).option("path", str(self.path))
        return read_ranges(spark, reader, schema, start, end, tasks)

    def stream_reader(self, spark: SparkSession) -> DataStreamReader:
        return spark.readStream.format(SPARK_FORMAT).option("path", str(self.path))

    def check_reachable(self, spark: SparkSession) -> None:
        """One one-task job: does an executor see the topic at the same path?"""
        from backlog_dagster.spark.session import on_an_executor

        if not on_an_executor(spark, _is_file, str(self.path / _METADATA_FILE), "boolean"):
            raise TopicError(
                f"topic {self.path}: Spark's executors do not see it at that path; the "
                "embedded log must be on a filesystem the executors share (the same path on "
                "every machine), or run Spark on this machine"
            )

    def close(self) -> None:
        for bucket in self._buckets.values():
            bucket.close()
        self._buckets.clear()

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_topic(
    path: Path | str,
    schema: pa.Schema,
    *,
    timestamp_column: str,
    buckets: int,
    payload: Payload = Payload.ARROW,
    compression: str | None = None,
) -> Topic:
    """Create a topic directory with ``buckets`` empty buckets.

    For a JSON payload, ``schema`` is ignored beyond its timestamp column: the topic
    stores ``(timestamp_column, value)`` and readers declare the schema of the value.
    """
    path = Path(path)
    if (path / _METADATA_FILE).exists():
        raise TopicError(f"a topic already exists at {path}")
    if buckets < 1:
        raise TopicError(f"a topic needs at least one bucket, not {buckets}")
    if payload is Payload.JSON:
        schema = pa.schema(
            [
                pa.field(timestamp_column, TIMESTAMP, nullable=False),
                pa.field(JSON_VALUE_COLUMN, pa.string()),
            ]
        )
    if timestamp_column not in schema.names:
        raise SchemaError(
            f"the timestamp column {timestamp_column!r} is not in the schema "
            f"(columns: {', '.join(schema.names)})"
        )
    if schema.field(timestamp_column).type != TIMESTAMP:
        raise SchemaError(f"the timestamp column {timestamp_column!r} must be a TIMESTAMP")
    path.mkdir(parents=True, exist_ok=True)
    staging = path / (_METADATA_FILE + ".new")
    staging.unlink(missing_ok=True)
    with closing(sqlite3.connect(staging)) as db, db:
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL)")
        db.execute("CREATE TABLE buckets (id INTEGER PRIMARY KEY, created_at REAL NOT NULL)")
        db.executemany(
            "INSERT INTO meta VALUES (?, ?)",
            [
                ("schema", schema.serialize().to_pybytes()),
                ("timestamp_column", timestamp_column.encode()),
                ("payload", payload.value.encode()),
                ("compression", (compression or "").encode()),
            ],
        )
    # The metadata file appears whole or not at all.
    staging.rename(path / _METADATA_FILE)
    topic = Topic(path)
    topic.add_buckets(buckets)
    return topic


def _bucket_file(bucket_id: int) -> str:
    return f"bucket-{bucket_id:05d}.sqlite"
