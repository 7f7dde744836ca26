"""Where records come from: the ``Source`` contract, and Spark's reader over any source.

A source's own package implements it (``log``, ``kafka``, ``archive``); which one a
pipeline's config names is decided in ``backlog_dagster.implementations`` alone.
"""

from backlog_dagster.source.base import (
    JSON_VALUE_COLUMN,
    Arrivals,
    Bounds,
    Payload,
    Source,
    SourceError,
    StoredRecords,
)

__all__ = [
    "JSON_VALUE_COLUMN",
    "Arrivals",
    "Bounds",
    "Payload",
    "Source",
    "SourceError",
    "StoredRecords",
]
