"""Records from a user's files, in a topic's schema: what ``log append`` reads."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pyarrow.parquet as pq

_FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
}


def read_records(path: Path, schema: pa.Schema, file_format: str | None = None) -> pa.Table:
    """The file's records with the topic's columns, parsed as the topic's types."""
    kind = file_format or _FORMATS.get(path.suffix.lower())
    if kind is None:
        raise ValueError(
            f"{path}: cannot tell the format from the extension {path.suffix!r}; "
            "give --format parquet, csv or jsonl"
        )
    # Text formats: times are read as text and parsed below, so that both
    # '2026-11-20T10:00:00Z' and '2026-11-20 10:00:00' (taken as UTC) are accepted.
    as_text = pa.schema(
        [pa.field(f.name, pa.string()) if pa.types.is_timestamp(f.type) else f for f in schema]
    )
    try:
        if kind == "parquet":
            table = pq.read_table(path)
        elif kind == "csv":
            table = pa_csv.read_csv(
                path,
                convert_options=pa_csv.ConvertOptions(
                    column_types={f.name: f.type for f in as_text}
                ),
            )
        else:
            table = pa_json.read_json(
                path,
                parse_options=pa_json.ParseOptions(
                    explicit_schema=as_text, unexpected_field_behavior="ignore"
                ),
            )
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"{path}: cannot read it as {kind}: {error}") from error
    missing = [name for name in schema.names if name not in table.column_names]
    if missing:
        raise ValueError(
            f"{path}: lacks the topic's column(s) {', '.join(missing)} "
            f"(it has {', '.join(table.column_names)})"
        )
    table = table.select(schema.names)
    for index, field in enumerate(schema):
        column = table.column(index)
        if pa.types.is_timestamp(field.type) and pa.types.is_string(column.type):
            table = table.set_column(index, field.name, _parse_times(path, field.name, column))
    return table


def _parse_times(path: Path, name: str, column: pa.ChunkedArray) -> pa.Array:
    try:
        times = pd.to_datetime(column.to_pandas(), utc=True, format="ISO8601")
    except ValueError as error:
        reason = str(error).splitlines()[0]
        raise ValueError(f"{path}: column {name!r}: {reason}") from error
    return pa.array(times)


def split_by_key(records: pa.Table, key: str, buckets: list[int]) -> dict[int, pa.Table]:
    """Each bucket's share of ``records``: a key value always lands in the same bucket."""
    if key not in records.column_names:
        raise ValueError(
            f"--key {key!r} is not a column (columns: {', '.join(records.column_names)})"
        )
    hashes = pd.util.hash_pandas_object(records.column(key).to_pandas(), index=False)
    chosen = hashes.to_numpy() % len(buckets)
    return {buckets[i]: records.filter(pa.array(chosen == i)) for i in sorted(set(chosen.tolist()))}
