"""A Parquet archive's part of a batch read, by Spark's own Parquet reader.

Each record's bucket and start offset come from its file's name, its offset from its row
index in the file (a file holds consecutive offsets).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from backlog_dagster.archive.layout import HeldFile
from backlog_dagster.source.records import (
    APPENDED_COLUMN,
    BUCKET_COLUMN,
    CORRUPT_COLUMN,
    ERROR_COLUMN,
    OFFSET_COLUMN,
    TIMESTAMP_COLUMN,
)
from backlog_dagster.source.schema import type_name
from backlog_dagster.source.spark import arrow_schema, records_per_task
from backlog_dagster.spark.session import read_tasks

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


#: Past this many files in one read, the plan (one scan per file) grows slow to make:
#: the read goes through the Python reader instead.
MAX_FILES_PER_READ = 256


@dataclass(frozen=True)
class ArchivedColumns:
    """An archive's columns: the source's own (``schema``), what its files hold
    (``stored``), and which of them is the event time, if one is."""

    schema: pa.Schema
    stored: pa.Schema
    timestamp_column: str | None


def parquet_ranges(
    spark: SparkSession,
    archive: ArchivedColumns,
    schema: str | StructType | None,
    files: Mapping[int, list[HeldFile]],
    ranges: Mapping[int, tuple[int, int]],
    tasks: int | None = None,
) -> DataFrame:
    """Offsets ``ranges[bucket]`` from the Parquet ``files`` that hold them, in
    ``schema`` (DDL or a Spark schema, as the generic source takes; None: the archive's
    columns, bucket and offset), in the tasks ``read_tasks`` gives.

    One scan per file, its bucket and start offset constants of the plan: measured on
    16,000,000 records, taking them from each row's file name (``_metadata.file_name``)
    made the read three times slower. The stored schema is given, so no footer is read
    to infer it.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    output = arrow_schema(schema) if schema else _default_output(archive.schema)
    stored = from_arrow_schema(archive.stored, prefer_timestamp_ntz=False)
    stamp = archive.timestamp_column
    timed = F.col(stamp).cast("timestamp") if stamp else F.lit(None).cast("timestamp")
    frames = []
    for bucket, listed in files.items():
        low, high = ranges[bucket]
        for held in listed:
            scan = spark.read.schema(stored).parquet(str(held.file.path))
            offset = F.lit(held.file.start) + F.col("_metadata.row_index")
            if held.file.start < low or held.end > high:  # a range starts or ends inside
                scan = scan.where((offset >= low) & (offset < high))
            filled: dict[str, Column] = {
                BUCKET_COLUMN: F.lit(bucket),
                OFFSET_COLUMN: offset,
                TIMESTAMP_COLUMN: timed,
                APPENDED_COLUMN: timed,  # archived records arrived long ago: at their time
                CORRUPT_COLUMN: F.lit(None),  # typed columns: nothing failed to parse
                ERROR_COLUMN: F.lit(None),
            }
            frames.append(
                scan.select(
                    *(
                        (filled[f.name] if f.name in filled else F.col(f"`{f.name}`"))
                        .cast(type_name(f.type))
                        .alias(f.name)
                        for f in output
                    )
                )
            )
    whole = functools.reduce(lambda left, right: left.union(right), frames)
    records = sum(high - low for low, high in ranges.values())
    per_task = records_per_task(records, tasks=read_tasks(spark, tasks))
    return whole.coalesce(max(1, math.ceil(records / per_task)))


def _default_output(stored: pa.Schema) -> pa.Schema:
    return pa.schema(
        [
            *stored,
            pa.field(BUCKET_COLUMN, pa.int32(), nullable=False),
            pa.field(OFFSET_COLUMN, pa.int64(), nullable=False),
        ]
    )
