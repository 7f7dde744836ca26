"""One bucket of a topic: an append-only, offset-addressed sequence of records.

Storage: one SQLite database per bucket, in WAL mode, holding the records as Arrow IPC
blobs of up to ``MAX_ROWS_PER_BLOB`` rows, keyed by the offset of their first record,
with the range of their record times and when they were appended (how the switch tells
an idle bucket from a busy one). Appends are stamped in offset order (a stamp is never
earlier than the one before), and each blob also keeps the latest record time of the
bucket up to and including it, so the record time as it stood at any moment is one
look-up in the arrival index, however long the bucket has been appended to.

Why SQLite and Arrow IPC, rather than a file format of our own:
- SQLite gives the durability the log promises without us writing a recovery
  procedure: an append is one transaction, committed with ``synchronous=FULL`` (the WAL
  is fsynced before the append returns), and a writer killed mid-append leaves a
  transaction that SQLite rolls back on the next open, so only the torn tail is lost
  and never an acknowledged record. WAL mode lets any number of readers in other
  processes read a consistent snapshot while the single writer appends.
- Arrow IPC keeps records typed and columnar: a read decodes a blob straight into the
  record batches Spark's Arrow reader takes, with no per-record Python work. That is
  what makes a range read run at millions of records per second.
- One file per bucket, so writers of different buckets never wait for each other.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.source.base import Arrivals

if TYPE_CHECKING:
    import pandas as pd

#: Rows per stored blob: large enough that per-blob overhead vanishes in a range read,
#: small enough that a read starting mid-blob decodes little it throws away.
MAX_ROWS_PER_BLOB = 65_536

_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS blobs (
    first_offset INTEGER PRIMARY KEY,
    record_count INTEGER NOT NULL,
    min_time_us INTEGER NOT NULL,
    max_time_us INTEGER NOT NULL,
    appended_at REAL NOT NULL,
    data BLOB NOT NULL,
    max_time_so_far_us INTEGER
);
-- Arrival order: what idleness and lateness read, without touching the blobs' data.
CREATE INDEX IF NOT EXISTS blobs_by_arrival ON blobs (appended_at, max_time_us);
CREATE TABLE IF NOT EXISTS bounds (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    earliest_offset INTEGER NOT NULL,
    next_offset INTEGER NOT NULL
);
INSERT OR IGNORE INTO bounds (id, earliest_offset, next_offset) VALUES (0, 0, 0);
"""


#: The blobs that hold offsets ``[:start, :end)``, in order. The range of the primary key
#: from the last blob starting at or before ``:start`` finds them; the condition on
#: ``first_offset + record_count`` only drops that blob where it ends at ``:start``. (That
#: condition alone cannot use the key: it visited every blob before ``:end``, so a read
#: near the end of a bucket that live appends had cut into 30,000 blobs took 10 ms.)
_OVERLAPPING = (
    "WHERE first_offset >= coalesce("
    "(SELECT max(first_offset) FROM blobs WHERE first_offset <= :start), 0) "
    "AND first_offset < :end AND first_offset + record_count > :start "
    "ORDER BY first_offset"
)


class OffsetOutOfRange(LookupError):
    """A read asked for offsets the bucket does not hold (any more, or yet)."""


@dataclass(frozen=True)
class BucketBounds:
    """The offsets a bucket holds now: ``[earliest, latest)``."""

    earliest: int
    latest: int

    @property
    def records(self) -> int:
        return self.latest - self.earliest


class Bucket:
    """A handle on one bucket's file. Cheap to open; not shared between threads."""

    def __init__(
        self,
        path: Path,
        bucket_id: int,
        schema: pa.Schema,
        timestamp_column: str,
        compression: str | None = None,
        *,
        create: bool = False,
    ) -> None:
        if not create and not path.exists():
            raise FileNotFoundError(f"bucket {bucket_id}: no file at {path}")
        self.path = path
        self.id = bucket_id
        self.schema = schema
        self.timestamp_column = timestamp_column
        self._write_options = pa.ipc.IpcWriteOptions(compression=compression)
        self._db = sqlite3.connect(path, timeout=60, isolation_level=None)
        #: Whether the blobs table is known to have ``max_time_so_far_us``.
        self._has_time_so_far = create
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        if create:
            self._db.executescript(_SCHEMA_SQL)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Bucket:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- offsets ---------------------------------------------------------------

    def bounds(self) -> BucketBounds:
        earliest, latest = self._db.execute(
            "SELECT earliest_offset, next_offset FROM bounds"
        ).fetchone()
        return BucketBounds(earliest, latest)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*"))

    def offset_for_time(self, timestamp_us: int) -> int:
        """The first offset whose record time is at or after ``timestamp_us``.

        The latest offset if no record is that late (Kafka's ``offsetsForTimes``).
        Record times may be out of order; a blob's ``max_time_us`` bounds every record
        in it, so the first blob reaching the time holds the answer.
        """
        bounds = self.bounds()
        row = self._db.execute(
            "SELECT first_offset, data FROM blobs WHERE max_time_us >= ? "
            "AND first_offset + record_count > ? ORDER BY first_offset LIMIT 1",
            (timestamp_us, bounds.earliest),
        ).fetchone()
        if row is None:
            return bounds.latest
        first_offset, data = row
        times = _decode(data).column(self.timestamp_column).cast(pa.int64())
        for index, value in enumerate(times.to_pylist()):
            offset = first_offset + index
            if offset >= bounds.earliest and value is not None and value >= timestamp_us:
                return offset
        return bounds.latest  # unreachable while max_time_us is exact

    def record_time(self, offset: int) -> int:
        """The record time (the timestamp column, in µs) of the record at ``offset``."""
        row = self._db.execute(
            "SELECT first_offset, data FROM blobs WHERE first_offset <= ? "
            "ORDER BY first_offset DESC LIMIT 1",
            (offset,),
        ).fetchone()
        bounds = self.bounds()
        if row is None or not bounds.earliest <= offset < bounds.latest:
            raise OffsetOutOfRange(
                f"bucket {self.id}: no record at offset {offset} "
                f"(it holds [{bounds.earliest}, {bounds.latest}))"
            )
        first_offset, data = row
        times = _decode(data).column(self.timestamp_column).cast(pa.int64())
        return int(times[offset - first_offset].as_py())

    def max_record_time(self, start: int, end: int) -> int | None:
        """The latest record time (µs) among offsets ``[start, end)``; None if empty.

        Blobs wholly inside the range answer from their stored ``max_time_us``; only the
        (at most two) blobs cut by the range's ends are decoded.
        """
        latest = None
        for first_offset, count, max_time in self._db.execute(
            "SELECT first_offset, record_count, max_time_us FROM blobs " + _OVERLAPPING,
            {"start": start, "end": end},
        ).fetchall():
            if first_offset < start or first_offset + count > end:
                (data,) = self._db.execute(
                    "SELECT data FROM blobs WHERE first_offset = ?", (first_offset,)
                ).fetchone()
                low, high = max(start, first_offset), min(end, first_offset + count)
                times = _decode(data).column(self.timestamp_column).cast(pa.int64())
                max_time = pc.max(times.slice(low - first_offset, high - low)).as_py()
            if max_time is not None and (latest is None or max_time > latest):
                latest = max_time
        return latest

    def append_times(self, start: int, end: int) -> list[tuple[int, int, float]]:
        """``(first offset, records, appended at)`` of each stored blob overlapping [start, end)."""
        return self._db.execute(
            "SELECT first_offset, record_count, appended_at FROM blobs " + _OVERLAPPING,
            {"start": start, "end": end},
        ).fetchall()

    def arrivals(self, since: float, until: float = float("inf")) -> Arrivals:
        """How the bucket's record times grew with its appends, from ``since`` to ``until``.

        The lateness of a realtime record is judged against the watermark as it stood
        when the record was appended (``phases.watermark``): this is what that needs,
        read from the blob index alone.
        """
        before, last = self._before(since)
        appends = self._db.execute(
            "SELECT appended_at, max(max_time_us) FROM blobs WHERE appended_at >= ? "
            "AND appended_at <= ? GROUP BY appended_at ORDER BY appended_at",
            (since, until),
        ).fetchall()
        return Arrivals(before, last, [(float(at), int(high)) for at, high in appends])

    def _before(self, since: float) -> tuple[int | None, float | None]:
        """The latest record time among blobs appended before ``since``, and when the
        last of them was: from the last such blob's time so far, two index look-ups.
        Blobs written before that was kept are read whole (a scan of the arrival index
        up to ``since``). Records retention removed still count where the time so far
        was kept: the watermark as it stood then had seen them."""
        (last,) = self._db.execute(
            "SELECT max(appended_at) FROM blobs WHERE appended_at < ?", (since,)
        ).fetchone()
        if last is None:
            return None, None
        try:
            (so_far,) = self._db.execute(
                "SELECT max(max_time_so_far_us) FROM blobs WHERE appended_at = ?", (last,)
            ).fetchone()
        except sqlite3.OperationalError:  # a bucket written before the column
            so_far = None
        if so_far is None:
            (so_far,) = self._db.execute(
                "SELECT max(max_time_us) FROM blobs WHERE appended_at < ?", (since,)
            ).fetchone()
        return so_far, last

    def append_time(self, offset: int) -> float | None:
        """When the record at ``offset`` was appended; None if the bucket does not hold it."""
        row = self._db.execute(
            "SELECT appended_at FROM blobs WHERE first_offset <= ? AND "
            "first_offset + record_count > ? ORDER BY first_offset DESC LIMIT 1",
            (offset, offset),
        ).fetchone()
        return None if row is None else float(row[0])

    def last_append_time(self) -> float | None:
        """When (Unix seconds) the latest record was appended; None if the bucket is empty."""
        row = self._db.execute(
            "SELECT appended_at FROM blobs ORDER BY first_offset DESC LIMIT 1"
        ).fetchone()
        return None if row is None else float(row[0])

    # -- writing ---------------------------------------------------------------

    def append(self, records: Records) -> tuple[int, int]:
        """Append records durably; return the offsets they got, ``[first, next)``.

        Returns only after the records are on disk. Either every record of the call is
        stored or, if the process dies first, none is.
        """
        table = self._conform(records)
        if table.num_rows == 0:
            latest = self.bounds().latest
            return latest, latest
        times = table.column(self.timestamp_column).cast(pa.int64())
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._keep_time_so_far()
            (first,) = self._db.execute("SELECT next_offset FROM bounds").fetchone()
            appended_at, so_far = self._after_last_blob(time.time())
            offset = first
            for batch in table.to_batches(max_chunksize=MAX_ROWS_PER_BLOB):
                batch_times = times.slice(offset - first, batch.num_rows)
                latest = pc.max(batch_times).as_py()
                so_far = latest if so_far is None else max(so_far, latest)
                self._db.execute(
                    "INSERT INTO blobs VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        offset,
                        batch.num_rows,
                        pc.min(batch_times).as_py(),
                        latest,
                        appended_at,
                        self._encode(batch),
                        so_far,
                    ),
                )
                offset += batch.num_rows
            self._db.execute("UPDATE bounds SET next_offset = ?", (offset,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return first, offset

    def _keep_time_so_far(self) -> None:
        """A bucket written before blobs kept the record time so far gets the column
        (its older blobs leave it empty; ``arrivals`` reads those the slow way)."""
        if self._has_time_so_far:
            return
        columns = [row[1] for row in self._db.execute("PRAGMA table_info(blobs)")]
        if "max_time_so_far_us" not in columns:
            self._db.execute("ALTER TABLE blobs ADD COLUMN max_time_so_far_us INTEGER")
        self._has_time_so_far = True

    def _after_last_blob(self, now: float) -> tuple[float, int | None]:
        """The stamp for an append at ``now`` (never before the last blob's: two writers
        racing, or the clock set back, must not put a later offset earlier in arrival
        order) and the latest record time before it (None for an empty bucket)."""
        row = self._db.execute(
            "SELECT appended_at, max_time_so_far_us FROM blobs ORDER BY first_offset DESC LIMIT 1"
        ).fetchone()
        if row is None:
            return now, None
        appended_at, so_far = row
        if so_far is None:  # the bucket's blobs before the column: once, the slow way
            (so_far,) = self._db.execute("SELECT max(max_time_us) FROM blobs").fetchone()
        return max(now, appended_at), so_far

    def truncate_before(self, offset: int) -> BucketBounds:
        """Retention: drop records below ``offset``; the earliest offset moves there."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            earliest, latest = self._db.execute(
                "SELECT earliest_offset, next_offset FROM bounds"
            ).fetchone()
            new_earliest = max(earliest, min(offset, latest))
            self._db.execute(
                "DELETE FROM blobs WHERE first_offset + record_count <= ?", (new_earliest,)
            )
            self._db.execute("UPDATE bounds SET earliest_offset = ?", (new_earliest,))
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return BucketBounds(new_earliest, latest)

    def _conform(self, records: Records) -> pa.Table:
        table = as_table(records)
        missing = [name for name in self.schema.names if name not in table.column_names]
        if missing:
            raise ValueError(f"bucket {self.id}: records lack the column(s) {', '.join(missing)}")
        table = table.select(self.schema.names)
        for field in self.schema:
            if pa.types.is_timestamp(field.type):
                _check_precision(self.id, field.name, table.column(field.name))
        try:
            table = table.cast(self.schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ValueError(
                f"bucket {self.id}: records do not fit the topic schema: {error}"
            ) from error
        if table.column(self.timestamp_column).null_count:
            raise ValueError(
                f"bucket {self.id}: the timestamp column {self.timestamp_column!r} has nulls"
            )
        return table

    def _encode(self, batch: pa.RecordBatch) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema, options=self._write_options) as writer:
            writer.write_batch(batch)
        return sink.getvalue().to_pybytes()

    # -- reading ---------------------------------------------------------------

    def read(self, start: int, end: int) -> Iterator[pa.RecordBatch]:
        """Yield the records at offsets ``[start, end)`` as record batches, in order.

        See ``read_arrivals`` for the errors.
        """
        for batch, _ in self.read_arrivals(start, end):
            yield batch

    def read_arrivals(self, start: int, end: int) -> Iterator[tuple[pa.RecordBatch, float]]:
        """Yield the records at offsets ``[start, end)`` with when they were appended.

        Raises ``OffsetOutOfRange`` naming the bucket and offsets when the range is not
        all held: below the earliest offset (retention removed it) or past the latest.
        """
        bounds = self.bounds()
        if start > end:
            raise OffsetOutOfRange(f"bucket {self.id}: empty range [{start}, {end}) is reversed")
        if start < bounds.earliest:
            raise OffsetOutOfRange(
                f"bucket {self.id}: offset {start} is below the earliest offset "
                f"{bounds.earliest}; retention removed offsets [{start}, {bounds.earliest})"
            )
        if end > bounds.latest:
            raise OffsetOutOfRange(
                f"bucket {self.id}: offset {end} is past the latest offset {bounds.latest}"
            )
        if start == end:
            return
        rows = self._db.execute(
            "SELECT first_offset, record_count, appended_at, data FROM blobs " + _OVERLAPPING,
            {"start": start, "end": end},
        )
        expected = start
        for first_offset, record_count, appended_at, data in rows:
            low = max(start, first_offset)
            high = min(end, first_offset + record_count)
            if low != expected:
                raise OffsetOutOfRange(
                    f"bucket {self.id}: offsets [{expected}, {low}) were removed while reading"
                )
            batch = _decode(data)
            yield batch.slice(low - first_offset, high - low), appended_at
            expected = high
        if expected != end:
            raise OffsetOutOfRange(
                f"bucket {self.id}: offsets [{expected}, {end}) were removed while reading"
            )


#: What ``append`` takes: Arrow data, or a pandas DataFrame.
Records = Union[pa.Table, pa.RecordBatch, "pd.DataFrame"]


def as_table(records: Records) -> pa.Table:
    if isinstance(records, pa.RecordBatch):
        return pa.Table.from_batches([records])
    if isinstance(records, pa.Table):
        return records
    return pa.Table.from_pandas(records, preserve_index=False)


def _check_precision(bucket: int, name: str, column: pa.ChunkedArray) -> None:
    """Refuse timestamps finer than the log's microseconds, rather than cut them.

    pandas times are nanoseconds: those that are whole microseconds (most data) are
    kept exactly; a value with nanoseconds in it would change, so it is refused.
    """
    if not pa.types.is_timestamp(column.type) or column.type.unit != "ns":
        return
    ticks = column.cast(pa.int64())
    # ticks - ticks // 1000 * 1000: Arrow's integer division (``remainder`` is newer than
    # the pyarrow the oldest Python gets).
    nanos = pc.subtract(ticks, pc.multiply(pc.divide(ticks, 1000), 1000))
    finer = pc.filter(column, pc.not_equal(nanos, 0))
    if len(finer):
        raise ValueError(
            f"bucket {bucket}: column {name!r} has {len(finer):,} timestamp(s) with "
            f"nanoseconds (e.g. {finer[0]}), and the log keeps microseconds; round them "
            f"first, e.g. df[{name!r}] = df[{name!r}].dt.floor('us')"
        )


def _decode(data: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(data))
    return reader.read_next_batch()
