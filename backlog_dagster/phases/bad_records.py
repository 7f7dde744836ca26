"""Bad records: found in the same Spark job as the results, kept in the dead-letter table.

A record is bad when it does not parse against the declared schema (a JSON payload that
is not JSON, or a value of the wrong type), or when a value the transform needs is
missing: a key, the event time, a derived column, or the input of a sum, min, max or
avg. A failing expression counts as missing: the session runs with ANSI mode off, so a
cast or arithmetic that fails gives null instead of stopping the job, and that null is
caught here with its reason. (Write ``coalesce(x, default)`` where a missing value is
fine.)

Each bad record becomes a result row of its own: the aggregation groups by the keys
plus a ``_dead_letter`` column that is null for good records and, for a bad one, holds
its bucket, offset, payload and reason. So the results and the dead letters come out of
one pass over the data and commit in the same sink transaction as the progress: a crash
can neither lose a dead letter nor write it twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import DEAD_LETTER_COLUMNS
from backlog_dagster.spark.records import (
    BUCKET_COLUMN,
    CORRUPT_COLUMN,
    ERROR_COLUMN,
    OFFSET_COLUMN,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

DEAD_LETTER = "_dead_letter"
#: How much of a bad record's payload an error message quotes.
QUOTED_PAYLOAD = 200


class BadRecord(ValueError):
    """A bad record, with ``source.on_bad_record: fail``."""


@dataclass(frozen=True)
class Aggregated:
    """One Spark job's partial results and the bad records it set aside."""

    results: pa.Table
    dead_letters: pa.Table


def parse_problem(records: DataFrame) -> Column | None:
    """Why each record did not parse (null if it did); None for typed topics."""
    from pyspark.sql import functions as F

    if CORRUPT_COLUMN not in records.columns:
        return None
    error = F.col(ERROR_COLUMN) if ERROR_COLUMN in records.columns else F.lit("bad record")
    return F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.concat(F.lit("does not parse: "), error))


def dead_letter(
    records: DataFrame, config: PipelineConfig, parsed: Column | None, payload: list[str]
) -> Column:
    """The ``_dead_letter`` grouping column: null for good records, a struct for bad ones.

    ``payload``: the record's own columns (as the function left them, before a join)."""
    from pyspark.sql import functions as F

    transform = config.transform
    derived = transform.columns
    checks: list[Column] = [] if parsed is None else [parsed]

    def missing(column: Column, what: str) -> None:
        checks.append(F.when(column.isNull(), F.lit(what)))

    joined = set() if transform.join is None else set(transform.join.columns)
    for key in transform.keys:
        if key in joined:
            assert transform.join is not None
            missing(F.col(key), f"key {key} is null: no row of {transform.join.describe()} matches")
        else:
            missing(F.col(key), _missing("key", key, derived))
    missing(
        F.col(config.source.event_time), _missing("event time", config.source.event_time, derived)
    )
    for aggregation in transform.aggregations:
        if aggregation.function != "count" and aggregation.column is not None:
            column = aggregation.column
            missing(
                F.expr(column),
                _missing(f"{aggregation.function} input of {aggregation.name}", column, derived),
            )
    reason = F.coalesce(*checks)
    as_json = F.to_json(F.struct(*[F.col(c) for c in payload if c not in derived]))
    if CORRUPT_COLUMN in records.columns:
        as_json = F.coalesce(F.col(CORRUPT_COLUMN), as_json)
    bad = reason.isNotNull()
    # Each field under the same condition: nullable, as Arrow needs for the struct's nulls.
    letter = F.struct(
        F.when(bad, F.col(BUCKET_COLUMN)).alias("bucket"),
        F.when(bad, F.col(OFFSET_COLUMN)).alias("offset"),
        as_json.alias("payload"),
        reason.alias("reason"),
    )
    return F.when(bad, letter).alias(DEAD_LETTER)


def _missing(role: str, column: str, derived: dict[str, str]) -> str:
    if column in derived:
        return (
            f"{role} {column} = {derived[column]} is null: an input is missing or the "
            "expression failed"
        )
    return f"{role} {column} is missing or null"


def collect(partials: DataFrame) -> Aggregated:
    """Run the job; split its rows into partial results and dead letters."""
    table = partials.toArrow()
    letters = table.column(DEAD_LETTER)
    bad = pc.is_valid(letters)
    results = table.filter(pc.invert(bad)).drop_columns([DEAD_LETTER])
    if not pc.any(bad).as_py():
        return Aggregated(results, empty_dead_letters())
    chosen = table.filter(bad).column(DEAD_LETTER).combine_chunks()
    dead = pa.Table.from_arrays(
        [chosen.field(name) for name in DEAD_LETTER_COLUMNS], names=list(DEAD_LETTER_COLUMNS)
    )
    return Aggregated(results, dead.sort_by([("bucket", "ascending"), ("offset", "ascending")]))


def empty_dead_letters() -> pa.Table:
    return pa.table(
        {
            "bucket": pa.array([], pa.int32()),
            "offset": pa.array([], pa.int64()),
            "payload": pa.array([], pa.string()),
            "reason": pa.array([], pa.string()),
        }
    )


def refuse_bad_records(config: PipelineConfig, dead: pa.Table) -> None:
    """With ``on_bad_record: fail``, stop at the first bad record, naming it."""
    if config.source.on_bad_record != "fail" or dead.num_rows == 0:
        return
    first = dead.slice(0, 1).to_pylist()[0]
    payload = first["payload"] or ""
    quoted = payload[:QUOTED_PAYLOAD] + ("…" if len(payload) > QUOTED_PAYLOAD else "")
    raise BadRecord(
        f"pipeline {config.name}: bad record at bucket {first['bucket']} offset "
        f"{first['offset']}: {first['reason']} (record: {quoted!r}); {dead.num_rows} bad "
        f"record(s) in this batch, nothing of it committed. Fix the records or the "
        f"schema, or set source.on_bad_record: dead_letter to keep bad records in "
        f"{config.sink.table}_dead_letters and go on."
    )
