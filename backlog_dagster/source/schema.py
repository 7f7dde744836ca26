"""Record schemas: the Spark DDL a user writes, as the Arrow schema the log stores.

The log must not start a JVM to learn a schema (the CLI and the Dagster code server
would pay Spark's start-up for it), so this parses the flat subset of Spark's DDL that
a log record uses: ``name TYPE [NOT NULL], ...`` with Spark's primitive type names.
Nested types belong in a JSON payload, where Spark itself parses them.
"""

from __future__ import annotations

import re

import pyarrow as pa

#: Timestamps everywhere in the project: what Spark's Arrow reader requires of a
#: Python data source's first batch.
TIMESTAMP = pa.timestamp("us", tz="UTC")

_PRIMITIVES: dict[str, pa.DataType] = {
    "BOOLEAN": pa.bool_(),
    "TINYINT": pa.int8(),
    "BYTE": pa.int8(),
    "SMALLINT": pa.int16(),
    "SHORT": pa.int16(),
    "INT": pa.int32(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "LONG": pa.int64(),
    "FLOAT": pa.float32(),
    "REAL": pa.float32(),
    "DOUBLE": pa.float64(),
    "STRING": pa.string(),
    "BINARY": pa.binary(),
    "DATE": pa.date32(),
    "TIMESTAMP": TIMESTAMP,
}
_SPARK_NAMES = {
    pa.bool_(): "BOOLEAN",
    pa.int8(): "TINYINT",
    pa.int16(): "SMALLINT",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.string(): "STRING",
    pa.binary(): "BINARY",
    pa.date32(): "DATE",
    TIMESTAMP: "TIMESTAMP",
}
_FIELD = re.compile(
    r"""\s*(?P<name>`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*:?\s+
        (?P<type>[A-Za-z]+)\s*(?:\(\s*(?P<p>\d+)\s*(?:,\s*(?P<s>\d+)\s*)?\))?
        (?P<not_null>\s+NOT\s+NULL)?\s*(?:,|$)""",
    re.IGNORECASE | re.VERBOSE,
)
_LOOSE_FIELD = re.compile(r"\s*(?P<name>`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*:?\s+(?P<type>[A-Za-z]+)")


class SchemaError(ValueError):
    """A schema the log cannot store, with the reason in the message."""


def parse_ddl(ddl: str) -> pa.Schema:
    """Parse ``"order_id BIGINT NOT NULL, amount DOUBLE, ..."`` into an Arrow schema."""
    fields: list[pa.Field] = []
    position = 0
    text = ddl.strip()
    while position < len(text):
        match = _FIELD.match(text, position)
        if match is None:
            loose = _LOOSE_FIELD.match(text, position)
            if loose is not None and loose["type"].upper() not in _PRIMITIVES:
                raise SchemaError(_unsupported(loose["name"].strip("`"), loose["type"]))
            raise SchemaError(
                f"cannot parse the schema at {text[position:][:40]!r}: expected "
                f"'name TYPE' with TYPE one of {', '.join(sorted(_PRIMITIVES))} or DECIMAL(p, s)"
            )
        fields.append(_field(match))
        position = match.end()
    if not fields:
        raise SchemaError("the schema is empty: declare at least one column")
    names = [f.name for f in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaError(f"the schema repeats the column(s) {', '.join(duplicates)}")
    return pa.schema(fields)


def _field(match: re.Match[str]) -> pa.Field:
    name = match["name"].strip("`")
    type_name = match["type"].upper()
    if type_name in ("DECIMAL", "DEC", "NUMERIC"):
        precision = int(match["p"] or 10)
        scale = int(match["s"] or 0)
        arrow_type: pa.DataType = pa.decimal128(precision, scale)
    elif type_name in _PRIMITIVES and match["p"] is None:
        arrow_type = _PRIMITIVES[type_name]
    else:
        raise SchemaError(_unsupported(name, match["type"]))
    return pa.field(name, arrow_type, nullable=match["not_null"] is None)


def _unsupported(column: str, type_name: str) -> str:
    return (
        f"column {column!r}: type {type_name.upper()!r} is not supported in a log record; "
        f"use one of {', '.join(sorted(_PRIMITIVES))} or DECIMAL(p, s), "
        "or a JSON payload for nested data"
    )


def to_ddl(schema: pa.Schema) -> str:
    """The Spark DDL for an Arrow schema this module produced."""
    return ", ".join(_column_ddl(field) for field in schema)


def _column_ddl(field: pa.Field) -> str:
    return f"`{field.name}` {type_name(field.type)}{'' if field.nullable else ' NOT NULL'}"


def type_name(arrow_type: pa.DataType) -> str:
    """Spark's name for a type this module produces (``STRING``, ``DECIMAL(10, 2)``)."""
    if pa.types.is_decimal(arrow_type):
        return f"DECIMAL({arrow_type.precision}, {arrow_type.scale})"
    return _SPARK_NAMES.get(arrow_type, str(arrow_type).upper())
