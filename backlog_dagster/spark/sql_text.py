"""Spark SQL text: a column's name and a string as the parser reads them.

A plan part written as one SQL expression costs one call to Spark's parser; built from
PySpark's ``Column`` functions, each ``col``, ``lit``, ``when`` and method is a call into
Spark's JVM over py4j (see ``phases.bad_records.dead_letter``).
"""

from __future__ import annotations


def name(column: str) -> str:
    """``column`` as an identifier, whatever it holds: in backquotes, any doubled."""
    return "`" + column.replace("`", "``") + "`"


def text(value: str) -> str:
    """``value`` as a string literal (Spark reads backslash escapes in literals)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def expression(user_sql: str) -> str:
    """A user's expression embedded in a larger one: in parentheses, on lines of its
    own (a ``--`` comment in it then ends where it does)."""
    return f"(\n{user_sql}\n)"
