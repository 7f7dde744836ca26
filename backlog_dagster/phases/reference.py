"""Reference data joined to each record (``transform.join``): a Parquet or CSV file, or a
table in the sink's database.

The table is read on the driver (reference data is small: customers, products, regions)
and joined in Spark as a broadcast left join, so a record without a match keeps null in
the added columns (and goes to the dead letters if one of them is a key). Its version is
a hash of its content: each commit records the version it joined, the backlog reads the
table once per run, and realtime reads it again every ``join.refresh``. A commit is
exact for the version it joined; a record replayed after a crash joins the version read
when it is committed again.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.config import JoinConfig, PipelineConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from backlog_dagster.sink import Sink


class ReferenceError(ValueError, UserError):
    """The reference data cannot be joined: the message names the field and says why."""


@dataclass(frozen=True)
class Reference:
    """The reference table as read, its content's version, and when it was read."""

    table: pa.Table
    version: str
    read_at: float


def read_reference(config: PipelineConfig, sink: Sink) -> Reference:
    """Read ``transform.join``'s table and check it: its columns, one row per key."""
    join = config.transform.join
    assert join is not None
    wanted = [*join.on, *join.columns]
    table = _read(join, sink, wanted)
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise ReferenceError(
            f"transform.join: {join.describe()} has no column {', '.join(missing)}; its "
            f"columns: {', '.join(table.column_names)}"
        )
    # In key order: the same rows read in another order are the same version.
    table = table.select(wanted).sort_by([(c, "ascending") for c in join.on])
    counts = table.group_by(join.on).aggregate([([], "count_all")])
    repeated = counts.filter(pc.greater(counts["count_all"], 1))
    if repeated.num_rows:
        example = {c: repeated[c][0].as_py() for c in join.on}
        raise ReferenceError(
            f"transform.join.on: {join.describe()} has {repeated.num_rows:,} key(s) on more "
            f"than one row (e.g. {example}); a record would be counted once per row: keep "
            "one row per key"
        )
    return Reference(table, _version(table), time.time())


def with_reference(records: DataFrame, join: JoinConfig, reference: Reference) -> DataFrame:
    """``records`` with ``join.columns`` from the reference row of the same ``join.on``."""
    from pyspark.sql import functions as F

    right = records.sparkSession.createDataFrame(reference.table)
    return records.join(F.broadcast(right), on=list(join.on), how="left")


def _read(join: JoinConfig, sink: Sink, columns: list[str]) -> pa.Table:
    if join.table is not None:
        try:
            return sink.read_reference(join.table, columns)
        except LookupError as error:
            raise ReferenceError(f"transform.join.table: {error}") from None
    assert join.path is not None
    path = Path(join.path)
    if not path.exists():
        raise ReferenceError(f"transform.join.path: {path} does not exist")
    if path.suffix.lower() == ".csv":
        import pyarrow.csv as pa_csv

        return pa_csv.read_csv(path)
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as error:
        raise ReferenceError(
            f"transform.join.path: cannot read {path} as Parquet (or a .csv file): {error}"
        ) from None


def _version(table: pa.Table) -> str:
    """A hash of the table's content."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]
