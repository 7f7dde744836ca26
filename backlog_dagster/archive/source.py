"""A source whose older records are in an archive and the rest in the log: each bucket's
offsets the archive holds are read from its files, the others from the log (FLIP-309's
hybrid source, bucket by bucket and offset by offset).

Each offset is read from one place: from the archive below the log's earliest offset,
from the log at and above it, so a stretch both hold is counted once and files added to
the archive while a backlog runs change nothing it reads. A stretch neither holds (the
log lost it before it was archived) is named in an error. Realtime reads past the
markers, which the log holds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from typing_extensions import Self

from backlog_dagster.archive.layout import Format, HeldFile, files, records_in
from backlog_dagster.source.base import Arrivals, Payload, Source, SourceError, StoredRecords

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader
    from pyspark.sql.types import StructType

TIMESTAMP = pa.timestamp("us", tz="UTC")
#: Records per batch handed over from an archive file.
BATCH_RECORDS = 65_536


#: The name of the Spark data source over an archive in front of a log (``archive.spark``),
#: here so that naming it needs no pyspark.
FORMAT = "archivethenlog"


def options_for(
    root: Path, fmt: Format, log_data_source: str, log_options: Mapping[str, str]
) -> dict[str, str]:
    return {
        **log_options,
        "archive.path": str(root),
        "archive.format": fmt,
        "log.data_source": log_data_source,
    }


@dataclass(frozen=True)
class HybridBounds:
    earliest: int
    latest: int


class ArchiveThenLog:
    """The archive at ``root`` (``fmt`` files of topic ``name``) in front of ``log``.

    ``log_data_source`` (the log's Spark data source, as ``module:Class``) and
    ``log_options`` say how Spark opens the log, so that Spark's tasks can open the same
    pair (``archive.spark``) without this package knowing which source the log is.
    """

    def __init__(
        self,
        root: Path,
        fmt: Format,
        log: Source,
        log_data_source: str,
        log_options: Mapping[str, str],
    ) -> None:
        self.root, self.fmt, self.log = root, fmt, log
        self.log_data_source, self.log_options = log_data_source, dict(log_options)

    # -- what it is: the log's -------------------------------------------------------

    @property
    def name(self) -> str:
        return self.log.name

    @property
    def schema(self) -> pa.Schema:
        return self.log.schema

    @property
    def timestamp_column(self) -> str | None:
        return self.log.timestamp_column

    @property
    def payload(self) -> Payload:
        return self.log.payload

    # -- offsets ---------------------------------------------------------------------

    def held(self) -> dict[int, list[HeldFile]]:
        """The archive's files, read afresh, with the offset after each one's records."""
        return {
            b: [HeldFile(f, f.start + records_in(f)) for f in fs]
            for b, fs in files(self.root, self.name).items()
        }

    def bounds(self) -> dict[int, HybridBounds]:
        archived = self.held()
        bounds = {}
        for bucket, logged in self.log.bounds().items():
            first = archived[bucket][0].file.start if archived.get(bucket) else logged.earliest
            bounds[bucket] = HybridBounds(min(first, logged.earliest), logged.latest)
        return bounds

    def latest_offsets(self) -> dict[int, int]:
        return self.log.latest_offsets()

    def _log_earliest(self, bucket: int) -> int:
        """The log's earliest offset in ``bucket``: where its held records start, asked of
        that bucket alone (every bucket's bounds for each would cost buckets² look-ups)."""
        return self.log.held_from(bucket, 0)[0]

    def held_from(self, bucket: int, offset: int) -> tuple[int, int | None]:
        """The archive's files, then the log: a stretch ends where the next file does not
        begin at its end (a hole), and runs on when it reaches into the log."""
        earliest = self._log_earliest(bucket)
        stretch: tuple[int, int] | None = None
        for held in self.held().get(bucket, []):
            if held.end <= offset or held.file.start >= earliest:
                continue
            if stretch is not None and held.file.start > stretch[1]:
                break
            first = max(offset, held.file.start)
            stretch = (first, held.end) if stretch is None else (stretch[0], held.end)
        if stretch is None:
            return max(offset, earliest), None
        return (stretch[0], None) if stretch[1] >= earliest else stretch

    def held_by(self, bucket: int, offset: int) -> str:
        if offset < self._log_earliest(bucket):
            return "archive"
        return self.log.held_by(bucket, offset)

    def offset_for_time(self, bucket: int, timestamp_us: int) -> int:
        if self.timestamp_column is None:  # the log answers, or refuses, for both
            return self.log.offset_for_time(bucket, timestamp_us)
        logged = self.log.bounds()[bucket]
        for held in self.held().get(bucket, []):
            if held.file.start >= logged.earliest:
                break
            times = self._times(held)
            later = pc.greater_equal(times, pa.scalar(timestamp_us, TIMESTAMP))
            index = pc.index(later, True).as_py()
            if index >= 0:
                return held.file.start + index
        return self.log.offset_for_time(bucket, timestamp_us)

    def record_time(self, bucket: int, offset: int) -> int:
        if offset >= self._log_earliest(bucket) or self.timestamp_column is None:
            return self.log.record_time(bucket, offset)
        held = self._holding(bucket, offset)
        return int(self._times(held).cast(pa.int64())[offset - held.file.start].as_py())

    def max_record_time(self, bucket: int, start: int, end: int) -> int | None:
        earliest = self._log_earliest(bucket)
        found = []
        if end > earliest:
            found.append(self.log.max_record_time(bucket, max(start, earliest), end))
        for held in self._covering(bucket, start, min(end, earliest)):
            found.append(self._max_time(held, max(start, held.file.start), min(end, held.end)))
        times = [t for t in found if t is not None]
        return max(times) if times else None

    def last_append_time(self, bucket: int) -> float | None:
        return self.log.last_append_time(bucket)

    def append_time(self, bucket: int, offset: int) -> float | None:
        if offset >= self._log_earliest(bucket):
            return self.log.append_time(bucket, offset)
        return self.record_time(bucket, offset) / 1_000_000  # archived: long arrived

    def arrivals(self, bucket: int, since: float, until: float = float("inf")) -> Arrivals:
        return self.log.arrivals(bucket, since, until)

    # -- records ---------------------------------------------------------------------

    def read_records(self, bucket: int, start: int, end: int) -> Iterator[StoredRecords]:
        earliest = self._log_earliest(bucket)
        yield from self._archived(bucket, start, min(end, earliest))
        if end > max(start, earliest):
            yield from self.log.read_records(bucket, max(start, earliest), end)

    def _archived(self, bucket: int, start: int, end: int) -> Iterator[StoredRecords]:
        """Records ``[start, end)`` from the archive's files; a hole is an error."""
        for held in self._covering(bucket, start, end):
            at, stop = max(start, held.file.start), min(end, held.end)
            piece = self._table(held).slice(at - held.file.start, stop - at)
            for batch in piece.to_batches(max_chunksize=BATCH_RECORDS):
                yield StoredRecords(
                    records=batch,
                    offsets=pa.arange(at, at + batch.num_rows),
                    times=functools.partial(self._batch_times, batch),
                )
                at += batch.num_rows

    def _covering(self, bucket: int, start: int, end: int) -> list[HeldFile]:
        """The files that hold ``[start, end)`` of ``bucket``, in order; a hole is an error."""
        listed = self.held().get(bucket, []) if start < end else []
        covering, at = [], start
        while at < end:
            held = next((h for h in listed if h.file.start <= at < h.end), None)
            if held is None:
                raise SourceError(
                    f"{self.name} bucket {bucket}: offsets from {at} (before {end}) are "
                    f"neither in the archive {self.root} nor in the log (its earliest offset "
                    f"is {self._log_earliest(bucket)})"
                )
            covering.append(held)
            at = held.end
        return covering

    def _holding(self, bucket: int, offset: int) -> HeldFile:
        return self._covering(bucket, offset, offset + 1)[0]

    def stored_schema(self) -> pa.Schema:
        """The archive's columns, as its first file holds them: the log's stored columns
        for an archive of the embedded log, the record's fields for Kafka Connect's."""
        first = next((fs[0] for fs in self.held().values() if fs), None)
        if first is None or first.file.format != "parquet":
            return self.schema
        import pyarrow.parquet as pq

        return pq.read_schema(first.file.path)

    def _table(self, held: HeldFile) -> pa.Table:
        if held.file.format == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(held.file.path)
        else:
            import pyarrow.json as pa_json

            options = pa_json.ParseOptions(explicit_schema=self.schema)
            table = pa_json.read_json(held.file.path, parse_options=options)
        return table.select(self.schema.names).cast(self.schema)

    def _times(self, held: HeldFile) -> pa.Array:
        """The file's record times, reading only that column where the format can."""
        column = self.timestamp_column
        if held.file.format == "parquet" and column is not None:
            import pyarrow.parquet as pq

            times = pq.read_table(held.file.path, columns=[column]).column(column)
            return times.combine_chunks().cast(TIMESTAMP)
        return self._record_times(self._table(held).combine_chunks().to_batches()[0])

    def _max_time(self, held: HeldFile, start: int, end: int) -> int | None:
        """The latest record time of ``[start, end)`` within one file: from the Parquet
        footer's statistics when the range is the whole file, else from the column."""
        column = self.timestamp_column
        if start >= end or column is None:
            return None
        whole = (start, end) == (held.file.start, held.end)
        if whole and held.file.format == "parquet":
            high = _footer_max(held.file.path, column)
            if high is not None:
                return high
        times = self._times(held).slice(start - held.file.start, end - start)
        latest = pc.max(times.cast(pa.int64())).as_py()
        return None if latest is None else int(latest)

    def _record_times(self, batch: pa.RecordBatch) -> pa.Array:
        column = self.timestamp_column
        if column is None or column not in batch.schema.names:
            return pa.nulls(batch.num_rows, TIMESTAMP)
        return batch.column(column).cast(TIMESTAMP)

    def _batch_times(self, batch: pa.RecordBatch) -> tuple[pa.Array, pa.Array]:
        """An archived record's time is also its arrival: the archive keeps no other."""
        times = self._record_times(batch)
        return times, times

    # -- Spark -------------------------------------------------------------------------

    def spark_options(self) -> dict[str, str]:
        return options_for(self.root, self.fmt, self.log_data_source, self.log_options)

    def read_batch(
        self,
        spark: SparkSession,
        schema: str | StructType | None,
        start: Mapping[int, int] | None = None,
        end: Mapping[int, int] | None = None,
        tasks: int | None = None,
    ) -> DataFrame:
        """Parquet archives are read by Spark's own Parquet reader (no hand-over through
        Python), the log's part by the log's reader; JSON archives through this source."""
        from backlog_dagster.archive.parquet import (
            MAX_FILES_PER_READ,
            ArchivedColumns,
            parquet_ranges,
        )
        from backlog_dagster.source.spark import read_ranges

        hybrid = spark.read.format(FORMAT).options(**self.spark_options())
        if start is None or self.fmt != "parquet":
            return read_ranges(spark, hybrid, schema, start, end, tasks)
        end = dict(end) if end is not None else self.latest_offsets()
        earliest = {b: v.earliest for b, v in self.log.bounds().items()}
        archived = {
            b: self._covering(b, s, min(end[b], earliest[b]))
            for b, s in start.items()
            if s < min(end[b], earliest[b])
        }
        many = sum(len(held) for held in archived.values()) > MAX_FILES_PER_READ
        if many and self.log.payload is Payload.ARROW:
            return read_ranges(spark, hybrid, schema, start, end, tasks)
        log_start = {b: min(max(s, earliest[b]), end[b]) for b, s in start.items()}
        in_log = [b for b in start if log_start[b] < end[b]]
        frames = []
        if archived:
            ranges = {b: (start[b], min(end[b], earliest[b])) for b in archived}
            frames.append(
                parquet_ranges(
                    spark,
                    ArchivedColumns(self.schema, self.stored_schema(), self.timestamp_column),
                    schema,
                    archived,
                    ranges,
                    tasks,
                )
            )
        if in_log or not frames:
            frames.append(
                self.log.read_batch(
                    spark,
                    schema,
                    {b: log_start[b] for b in in_log},
                    {b: end[b] for b in in_log},
                    tasks,
                )
            )
        return frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])

    def stream_reader(self, spark: SparkSession) -> DataStreamReader:
        return spark.readStream.format(FORMAT).options(**self.spark_options())

    def check_reachable(self, spark: SparkSession) -> None:
        from backlog_dagster.spark.session import on_an_executor

        self.log.check_reachable(spark)
        root = str(self.root)
        if not on_an_executor(spark, lambda path: Path(path).is_dir(), root, "boolean"):
            raise SourceError(
                f"archive {root}: Spark's executors do not see it at that path; it must be "
                "on a filesystem every executor shares"
            )

    def close(self) -> None:
        self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _footer_max(path: Path, column: str) -> int | None:
    """The column's largest value (µs) over the file's row groups, from its footer."""
    import pyarrow.parquet as pq

    metadata = pq.ParquetFile(path).metadata
    index = metadata.schema.to_arrow_schema().get_field_index(column)
    highs = []
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(index).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        highs.append(pa.scalar(statistics.max, TIMESTAMP).cast(pa.int64()).as_py())
    return max(highs) if highs else None
