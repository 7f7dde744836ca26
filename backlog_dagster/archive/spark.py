"""How Spark reads an archive in front of a log.

- ``parquet_ranges``: a Parquet archive's part of a batch read, by Spark's own Parquet
  reader: each record's bucket and start offset come from its file's name, its offset
  from its row index in the file (a file holds consecutive offsets).
- The data source ``archivethenlog`` reads through ``ArchiveThenLog`` in Python (JSON
  archives, and the streaming reads, which are the log's). Its options are the log's
  own (for the log's data source, named by ``log.format``) plus ``archive.path`` and
  ``archive.format``; the rest is the generic source's (``backlog_dagster.spark.source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from backlog_dagster.archive.layout import Format
from backlog_dagster.archive.source import ArchiveThenLog
from backlog_dagster.log.schema import parse_ddl, type_name
from backlog_dagster.source.base import Source
from backlog_dagster.spark.records import (
    APPENDED_COLUMN,
    BUCKET_COLUMN,
    OFFSET_COLUMN,
    TIMESTAMP_COLUMN,
)
from backlog_dagster.spark.source import SourceDataSource

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from backlog_dagster.archive.source import _Held

FORMAT = "archivethenlog"
#: ``<topic>+<bucket>+<start offset>.parquet``
_FILE_NAME = r"\+(\d+)\+(\d+)\.parquet$"


def parquet_ranges(
    spark: SparkSession,
    archive: ArchiveThenLog,
    schema: str | None,
    files: Mapping[int, list[_Held]],
    ranges: Mapping[int, tuple[int, int]],
) -> DataFrame:
    """Offsets ``ranges[bucket]`` from the Parquet ``files`` that hold them, in
    ``schema`` (the DDL the generic source takes; None: the archive's columns, bucket
    and offset)."""
    from pyspark.sql import functions as F

    output = parse_ddl(schema) if schema else _default_output(archive.schema)
    paths = sorted({str(h.file.path) for listed in files.values() for h in listed})
    frame = spark.read.parquet(*paths)
    name = F.col("_metadata.file_name")
    bucket = F.regexp_extract(name, _FILE_NAME, 1).cast("int")
    offset = F.regexp_extract(name, _FILE_NAME, 2).cast("bigint") + F.col("_metadata.row_index")
    wanted = [(bucket == b) & (offset >= s) & (offset < e) for b, (s, e) in ranges.items()]
    kept = wanted[0]
    for condition in wanted[1:]:
        kept = kept | condition
    stamp = archive.timestamp_column
    timed: Column = F.col(stamp).cast("timestamp") if stamp else F.lit(None).cast("timestamp")
    filled = {
        BUCKET_COLUMN: bucket,
        OFFSET_COLUMN: offset,
        TIMESTAMP_COLUMN: timed,
        APPENDED_COLUMN: timed,  # archived records arrived long ago: at their record time
    }
    columns = [
        (filled[f.name] if f.name in filled else F.col(f"`{f.name}`"))
        .cast(type_name(f.type))
        .alias(f.name)
        for f in output
    ]
    return frame.where(kept).select(*columns)


def _default_output(stored: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            *stored,
            pa.field(BUCKET_COLUMN, pa.int32(), nullable=False),
            pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
        ]
    )


def options_for(
    root: Path, fmt: Format, log_format: str, log_options: Mapping[str, str]
) -> dict[str, str]:
    return {
        **log_options,
        "archive.path": str(root),
        "archive.format": fmt,
        "log.format": log_format,
    }


class ArchiveDataSource(SourceDataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    @staticmethod
    def open(options: Mapping[str, str]) -> Source:
        from backlog_dagster.source import data_sources

        lowered = {k.lower(): v for k, v in options.items()}
        by_name = {source.name(): source for source in data_sources()}
        log_format = lowered.get("log.format", "")
        if log_format not in by_name or "archive.path" not in lowered:
            raise ValueError(f"the {FORMAT} source needs options archive.path and log.format")
        log_options = {
            k: v
            for k, v in lowered.items()
            if k not in ("archive.path", "archive.format", "log.format")
        }
        log = by_name[log_format].open(log_options)  # type: ignore[attr-defined]
        fmt: Format = "json" if lowered.get("archive.format") == "json" else "parquet"
        return ArchiveThenLog(Path(lowered["archive.path"]), fmt, log, log_format, log_options)
