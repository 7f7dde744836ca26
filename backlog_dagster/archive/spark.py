"""How Spark reads an archive in front of a log.

- ``parquet_ranges``: a Parquet archive's part of a batch read, by Spark's own Parquet
  reader: each record's bucket and start offset come from its file's name, its offset
  from its row index in the file (a file holds consecutive offsets).
- The data source ``archivethenlog`` reads through ``ArchiveThenLog`` in Python (JSON
  archives, and the streaming reads, which are the log's). Its options are the log's
  own (for the log's data source, named as ``module:Class`` by ``log.data_source``) plus
  ``archive.path`` and ``archive.format``; the rest is the generic source's
  (``backlog_dagster.source.spark``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from backlog_dagster.archive.layout import Format
from backlog_dagster.archive.source import FORMAT, ArchiveThenLog
from backlog_dagster.source.base import Source
from backlog_dagster.source.spark import SourceDataSource

if TYPE_CHECKING:
    pass


class ArchiveDataSource(SourceDataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    @staticmethod
    def open(options: Mapping[str, str]) -> Source:
        lowered = {k.lower(): v for k, v in options.items()}
        log_data_source = lowered.get("log.data_source", "")
        if ":" not in log_data_source or "archive.path" not in lowered:
            raise ValueError(f"the {FORMAT} source needs options archive.path and log.data_source")
        log_options = {
            k: v
            for k, v in lowered.items()
            if k not in ("archive.path", "archive.format", "log.data_source")
        }
        module, _, name = log_data_source.partition(":")
        log = getattr(importlib.import_module(module), name).open(log_options)
        fmt: Format = "json" if lowered.get("archive.format") == "json" else "parquet"
        return ArchiveThenLog(Path(lowered["archive.path"]), fmt, log, log_data_source, log_options)
