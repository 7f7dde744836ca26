"""The shape of a pipeline's results table, and how two partial results merge.

The backlog aggregates its input in chunks (one chunk when ``checkpoint_interval`` is
0), and later phases add micro-batches: each produces a *partial* result per key that
the sink merges into what it holds. So every aggregation is stored as partial columns
with a merge rule (count and sum add, min and max keep the extreme), and aggregations
that are not mergeable as such (avg) are derived from their partials. A new aggregate
function only has to say its partials and, if needed, its derivation.

A stateless pipeline (no keys, no aggregations) has nothing to merge: each record is a
row, appended. Its columns are the records' as the transform leaves them, known only
from the data, so a sink makes its table at the first commit; each row keeps its
record's bucket and offset (``RECORD_ID``), and the view leaves out every column whose
name begins with an underscore. Exactly once needs no key: a commit appends a chunk's
rows in the same transaction that moves the progress past it, and the sink refuses a
commit that does not start where its progress stands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import pyarrow as pa

from backlog_dagster.pipeline import sketches
from backlog_dagster.pipeline.config import Aggregation, TransformConfig
from backlog_dagster.source.records import BUCKET_COLUMN, OFFSET_COLUMN

#: ``sketch``: a HyperLogLog or KLL sketch, merged by a union in Python
#: (``pipeline.sketches``) before the sink writes it, as SQL cannot.
Merge = Literal["add", "min", "max", "sketch"]

WINDOW_START = "window_start"
WINDOW_END = "window_end"
#: Where a stateless pipeline's row came from: its record's bucket and offset.
RECORD_ID = (BUCKET_COLUMN, OFFSET_COLUMN)


@dataclass(frozen=True)
class Partial:
    """A stored column: ``function`` over ``column`` per key and chunk, merged by ``merge``."""

    name: str
    function: Literal["count", "sum", "min", "max", "hll", "kll"]
    column: str | None
    merge: Merge


@dataclass(frozen=True)
class Estimate:
    """A column read from a sketch after each merge: the distinct count (``quantile``
    None) or one quantile. Stored, so any reader of the table sees it."""

    name: str
    sketch: str
    quantile: float | None = None


@dataclass(frozen=True)
class Derived:
    """A column computed from partials, as an SQL expression over stored columns (their
    names quoted, so that it reads the same in every sink's SQL)."""

    name: str
    expression: str


@dataclass(frozen=True)
class ResultLayout:
    keys: tuple[str, ...]
    partials: tuple[Partial, ...]
    derived: tuple[Derived, ...]
    #: The declared aggregations' result columns, in the order declared.
    outputs: tuple[str, ...]
    estimates: tuple[Estimate, ...] = ()

    @property
    def stateless(self) -> bool:
        """Each record a row: nothing to merge, the columns are the data's."""
        return not self.partials

    @property
    def windowed(self) -> bool:
        return WINDOW_START in self.keys

    @property
    def stored_columns(self) -> tuple[str, ...]:
        return (*self.keys, *(p.name for p in self.partials), *(e.name for e in self.estimates))

    @property
    def sketches(self) -> tuple[Partial, ...]:
        return tuple(p for p in self.partials if p.merge == "sketch")

    @property
    def visible_columns(self) -> tuple[str, ...]:
        """What a user reads: the keys (and window bounds), then each aggregation."""
        return (*self.keys, *self.outputs)


_MERGE: dict[str, Merge] = {"count": "add", "sum": "add", "min": "min", "max": "max"}
#: Arrow's grouped aggregation for each merge rule (a sketch's parts are listed, then
#: unioned).
_ARROW_MERGE = {"add": "sum", "min": "min", "max": "max", "sketch": "list"}


def merge_partials(tables: Sequence[pa.Table], layout: ResultLayout) -> pa.Table:
    """The partial results of Spark jobs over consecutive records (``tables``, one or
    more, as Spark made them), as one job over all those records would have made them:
    a row per key with its partials merged by their rules. A stateless pipeline's rows
    are all kept."""
    table = pa.concat_tables(tables)
    if len(tables) == 1 or layout.stateless:
        return table
    keys = list(layout.keys)
    grouped = table.group_by(keys, use_threads=False).aggregate(
        [(p.name, _ARROW_MERGE[p.merge]) for p in layout.partials]
    )
    # Arrow puts the keys first, then the aggregations in the order asked.
    merged = {name: grouped.column(i) for i, name in enumerate(keys)}
    for i, partial in enumerate(layout.partials, start=len(keys)):
        column = grouped.column(i)
        if partial.merge == "sketch":
            unions = [
                sketches.merged_sketch(partial.function, parts) for parts in column.to_pylist()
            ]
            column = pa.chunked_array([pa.array(unions, pa.binary())])
        merged[partial.name] = column.cast(table.schema.field(partial.name).type)
    return pa.table([merged[name] for name in table.column_names], schema=table.schema)


def visible_record_columns(columns: list[str]) -> list[str]:
    """What a stateless pipeline's view shows: every column but the internal ones."""
    return [c for c in columns if not c.startswith("_")]


def layout_of(transform: TransformConfig) -> ResultLayout:
    keys = tuple(transform.keys) + ((WINDOW_START, WINDOW_END) if transform.window else ())
    partials: list[Partial] = []
    derived: list[Derived] = []
    estimates: list[Estimate] = []
    for aggregation in transform.aggregations:
        if aggregation.function in ("count_distinct", "quantiles"):
            sketch = _sketch(aggregation)
            partials.append(sketch)
            estimates += _estimates(aggregation, sketch)
            continue
        partials_of, derived_of = _split(aggregation)
        partials += partials_of
        derived += derived_of
    outputs = tuple(o for a in transform.aggregations for o in a.outputs)
    return ResultLayout(keys, tuple(partials), tuple(derived), outputs, tuple(estimates))


def _sketch(aggregation: Aggregation) -> Partial:
    kind: Literal["hll", "kll"] = "hll" if aggregation.function == "count_distinct" else "kll"
    return Partial(f"_{aggregation.name}_{kind}", kind, aggregation.column, "sketch")


def _estimates(aggregation: Aggregation, sketch: Partial) -> list[Estimate]:
    if aggregation.quantiles is None:
        return [Estimate(aggregation.name, sketch.name)]
    return [
        Estimate(output, sketch.name, quantile)
        for output, quantile in zip(aggregation.outputs, aggregation.quantiles, strict=True)
    ]


def _split(aggregation: Aggregation) -> tuple[list[Partial], list[Derived]]:
    name, function, column = aggregation.name, aggregation.function, aggregation.column
    if function == "avg":
        total, count = f"_{name}_sum", f"_{name}_count"
        return (
            [Partial(total, "sum", column, "add"), Partial(count, "count", column, "add")],
            [Derived(name, f'CASE WHEN "{count}" > 0 THEN "{total}" * 1.0 / "{count}" END')],
        )
    assert function in ("count", "sum", "min", "max")
    return [Partial(name, function, column, _MERGE[function])], []


KeyValues = Callable[[pa.ChunkedArray], list[object]]


def merge_sketches(
    new: pa.Table, held: pa.Table, layout: ResultLayout, values_of: KeyValues | None = None
) -> pa.Table:
    """``new`` partial results (as Spark made them) with each sketch unioned with
    ``held``'s for the same key (``held`` has the keys and sketch columns of the rows the
    sink already holds), and every estimate column added, filled from the union.
    ``values_of`` turns a key column into the Python values the sink stores, for both
    tables to match (as is, by default)."""
    keys = list(layout.keys)
    convert = values_of or _as_is
    index = {key: row for row, key in enumerate(_key_tuples(held, keys, _as_is))}
    rows = [index.get(key) for key in _key_tuples(new, keys, convert)]
    for partial in layout.sketches:
        mine = held.column(partial.name).to_pylist() if held.num_rows else []
        theirs = new.column(partial.name).to_pylist()
        merged: list[bytes | None] = []
        estimates = [e for e in layout.estimates if e.sketch == partial.name]
        values: dict[str, list[float | None]] = {e.name: [] for e in estimates}
        for row, fresh in zip(rows, theirs, strict=True):
            old = None if row is None else mine[row]
            parts = [bytes(b) for b in (old, fresh) if b is not None]
            if not parts:
                merged.append(None)
                for estimate in estimates:
                    values[estimate.name].append(None)
                continue
            sketch = sketches.union(partial.function, parts)
            merged.append(sketches.serialized(sketch))
            for estimate in estimates:
                values[estimate.name].append(sketches.estimate(sketch, estimate.quantile))
        new = _replace(new, partial.name, pa.array(merged, pa.binary()))
        for estimate in estimates:
            kind = pa.int64() if estimate.quantile is None else pa.float64()
            new = _replace(new, estimate.name, pa.array(values[estimate.name], kind))
    return new


def _replace(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    """``table`` with column ``name`` set to ``values``, added at the end if it had none."""
    if name not in table.column_names:
        return table.append_column(name, values)
    return table.set_column(table.column_names.index(name), name, values)


def _as_is(column: pa.ChunkedArray) -> list[object]:
    return column.to_pylist()


def _key_tuples(
    table: pa.Table, keys: Sequence[str], convert: KeyValues
) -> list[tuple[object, ...]]:
    if table.num_rows == 0:
        return []
    return list(zip(*(convert(table.column(k)) for k in keys), strict=True))
