"""The Spark data source over an archive in front of a log, format ``archivethenlog``.

Its options are the log's own (for the log's data source, named by ``log.format``) plus
``archive.path`` and ``archive.format``; the rest is the generic source's
(``backlog_dagster.spark.source``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from backlog_dagster.archive.layout import Format
from backlog_dagster.archive.source import ArchiveThenLog
from backlog_dagster.source.base import Source
from backlog_dagster.spark.source import SourceDataSource

FORMAT = "archivethenlog"


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
