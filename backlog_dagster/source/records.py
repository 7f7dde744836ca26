"""Turn stored log records into the Arrow batches a Spark reader yields.

Runs inside Spark's Python workers, so it imports only pyarrow and the sources.

A reader declares its output columns. Each is either a payload column (stored typed
for an ``arrow`` topic, parsed from the JSON text for a ``json`` topic) or one of the
metadata columns below, filled by the reader.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from backlog_dagster.source.base import JSON_VALUE_COLUMN, Payload, Source, StoredRecords

BUCKET_COLUMN = "_bucket"
OFFSET_COLUMN = "_offset"
TIMESTAMP_COLUMN = "_timestamp"
#: When the record was appended to the log (a TIMESTAMP): its arrival, which decides
#: whether a realtime record is late (``phases.watermark``).
APPENDED_COLUMN = "_appended_at"
#: JSON payloads only: the raw text of a record that did not parse against the
#: declared schema (null for good records), as in Spark's own JSON reader.
CORRUPT_COLUMN = "_corrupt_record"
#: JSON payloads only: why that record did not parse.
ERROR_COLUMN = "_error"

METADATA_COLUMNS = (
    BUCKET_COLUMN,
    OFFSET_COLUMN,
    TIMESTAMP_COLUMN,
    APPENDED_COLUMN,
    CORRUPT_COLUMN,
    ERROR_COLUMN,
)


class MalformedRecord(ValueError):
    """A JSON record did not parse and the reader was told to fail on one."""


@dataclass(frozen=True)
class RecordLayout:
    """Everything a worker needs to shape one bucket range into output batches."""

    output: pa.Schema
    payload: Payload
    fail_on_malformed: bool

    @property
    def payload_schema(self) -> pa.Schema:
        return pa.schema([f for f in self.output if f.name not in METADATA_COLUMNS])


def check_layout(layout: RecordLayout, topic_schema: pa.Schema, topic: str) -> None:
    """Raise a ValueError naming the column if the declared output cannot be served."""
    names = set(layout.output.names)
    if layout.payload is Payload.ARROW:
        for column in (CORRUPT_COLUMN, ERROR_COLUMN):
            if column in names:
                raise ValueError(
                    f"topic {topic} stores typed records: {column} exists only for JSON payloads"
                )
        for field in layout.payload_schema:
            if field.name not in topic_schema.names:
                raise ValueError(
                    f"column {field.name!r} is not in topic {topic} "
                    f"(its columns: {', '.join(topic_schema.names)})"
                )
            stored = topic_schema.field(field.name).type
            if stored != field.type:
                raise ValueError(
                    f"column {field.name!r} is {stored} in topic {topic}, declared as {field.type}"
                )
    elif not layout.fail_on_malformed and CORRUPT_COLUMN not in names:
        raise ValueError(
            f"topic {topic} has a JSON payload: declare a {CORRUPT_COLUMN} STRING column to "
            "receive records that do not parse, or set mode FAILFAST to stop on the first one"
        )


def read_range(
    source: Source, bucket: int, start: int, end: int, layout: RecordLayout
) -> Iterator[pa.RecordBatch]:
    """Yield records ``[start, end)`` of one bucket in the layout's output schema."""
    for stored in source.read_records(bucket, start, end):
        yield shape(stored, bucket, layout)


def shape(stored: StoredRecords, bucket: int, layout: RecordLayout) -> pa.RecordBatch:
    rows = stored.records.num_rows
    if layout.payload is Payload.JSON:
        values = stored.records.column(JSON_VALUE_COLUMN)
        payload, corrupt, errors = _parse_json(values, layout)
        if layout.fail_on_malformed and corrupt.null_count < rows:
            index = next(i for i, v in enumerate(corrupt.is_null().to_pylist()) if not v)
            raise MalformedRecord(
                f"bucket {bucket} offset {stored.offsets[index].as_py()}: "
                f"{errors[index].as_py()} (record: {corrupt[index].as_py()[:200]!r})"
            )
    else:
        payload = pa.Table.from_batches([stored.records])
        corrupt = errors = pa.nulls(rows, pa.string())
    metadata = {
        BUCKET_COLUMN: lambda: pa.repeat(pa.scalar(bucket, pa.int32()), rows),
        OFFSET_COLUMN: lambda: stored.offsets,
        TIMESTAMP_COLUMN: lambda: stored.record_times,
        APPENDED_COLUMN: lambda: stored.appended_at,
        CORRUPT_COLUMN: lambda: corrupt,
        ERROR_COLUMN: lambda: errors,
    }
    columns = [
        metadata[f.name]() if f.name in metadata else payload.column(f.name) for f in layout.output
    ]
    return pa.RecordBatch.from_arrays(
        [_as_array(c).cast(f.type) for c, f in zip(columns, layout.output, strict=True)],
        schema=layout.output,
    )


def _as_array(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        return column.combine_chunks()
    return column


def _parse_json(values: pa.Array, layout: RecordLayout) -> tuple[pa.Table, pa.Array, pa.Array]:
    """Parse JSON texts; return the parsed rows, raw text of bad rows, and their errors.

    The whole batch is parsed at once by Arrow's JSON reader; only a batch with a bad
    record is split, in halves, until each bad record stands alone. So a clean batch
    costs one native parse, and ``k`` bad records cost about ``k log n`` parses.
    """
    schema = layout.payload_schema
    options = pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    whole = _parse_whole(values, options)
    if whole is not None:
        nulls = pa.nulls(len(values), pa.string())
        return whole, nulls, nulls
    texts = values.to_pylist()
    lines: list[bytes | None] = [_one_line(t) for t in texts]
    parsed: list[pa.Table] = []
    take: list[int | None] = [None] * len(texts)
    errors: list[str | None] = [None] * len(texts)
    good_rows = 0

    def parse(low: int, high: int) -> None:
        nonlocal good_rows
        chunk = lines[low:high]
        if any(line is None for line in chunk):
            if high - low == 1:
                errors[low] = "not a single JSON value"
                return
        else:
            try:
                table = pa_json.read_json(
                    io.BytesIO(b"\n".join(chunk)),  # type: ignore[arg-type]
                    parse_options=options,
                )
            except pa.ArrowInvalid as error:
                if high - low == 1:
                    errors[low] = str(error)
                    return
            else:
                if table.num_rows == high - low:
                    parsed.append(table)
                    for i in range(low, high):
                        take[i] = good_rows
                        good_rows += 1
                    return
                if high - low == 1:
                    errors[low] = "not a JSON object"
                    return
        middle = (low + high) // 2
        parse(low, middle)
        parse(middle, high)

    if texts:
        parse(0, len(texts))
    good = pa.concat_tables(parsed) if parsed else schema.empty_table()
    payload = good.take(pa.array(take, pa.int64()))
    corrupt = pa.array(
        [t if e is not None else None for t, e in zip(texts, errors, strict=True)], pa.string()
    )
    return payload, corrupt, pa.array(errors, pa.string())


def _parse_whole(values: pa.Array, options: pa_json.ParseOptions) -> pa.Table | None:
    """The batch parsed in one native pass when it is clean (every value one line, one
    object each), without a Python step per value; None to go the careful way."""
    if values.null_count or not len(values):
        return None
    if _has_line_break(values):
        return None
    lines = pa.ListArray.from_arrays(pa.array([0, len(values)], pa.int32()), values)
    joined = pc.binary_join(lines, "\n")[0].as_buffer()
    try:
        table = pa_json.read_json(pa.BufferReader(joined), parse_options=options)
    except pa.ArrowInvalid:
        return None
    return table if table.num_rows == len(values) else None


def _has_line_break(values: pa.Array) -> bool:
    """Whether any text holds a line break: searched in the texts' one data buffer, a
    byte scan (a regular expression over each text cost a third of the parse)."""
    width = np.int64 if pa.types.is_large_string(values.type) else np.int32
    _, offsets, data = values.buffers()
    bounds = np.frombuffer(offsets, width, len(values) + 1, values.offset * width().itemsize)
    first, last = int(bounds[0]), int(bounds[-1])
    held = b"" if data is None else data.to_pybytes()[first:last]
    return b"\n" in held or b"\r" in held


def _one_line(text: str | None) -> bytes | None:
    """The text as one JSON line, or None if it cannot be one record."""
    if text is None or not text.strip():
        return None
    if "\n" in text or "\r" in text:
        try:
            return json.dumps(json.loads(text)).encode()
        except ValueError:
            return None
    return text.encode()
