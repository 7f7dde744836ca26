"""Archive a topic's older records to files in Kafka Connect's layout
(``backlog_dagster.archive.layout``), so that the log can then be truncated.

Each bucket's archive goes on from where it ends (a second run writes only what came
since); a file is written under a temporary name and renamed when whole, so a reader or
a crash never sees half a file.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from backlog_dagster.archive.layout import ArchiveFile, Format, archived_end, file_path
from backlog_dagster.log.topic import Topic

#: Records per file unless asked otherwise.
RECORDS_PER_FILE = 1_000_000


def archive_before(
    topic: Topic,
    root: Path,
    before: dict[int, int],
    fmt: Format = "parquet",
    records_per_file: int = RECORDS_PER_FILE,
    on_file: Callable[[ArchiveFile, int], None] = lambda archived, records: None,
) -> dict[int, tuple[int, int]]:
    """Write each bucket's records up to offset ``before[bucket]`` that the archive does
    not hold yet; return ``{bucket: (first, end)}`` of what was written."""
    written: dict[int, tuple[int, int]] = {}
    bounds = topic.bounds()
    for bucket, end in sorted(before.items()):
        held = archived_end(root, topic.name, bucket)
        start = max(bounds[bucket].earliest, held or 0)
        end = min(end, bounds[bucket].latest)
        for first in range(start, end, records_per_file):
            last = min(first + records_per_file, end)
            table = pa.Table.from_batches(list(topic.read(bucket, first, last)))
            path = file_path(root, topic.name, bucket, first, fmt)
            _write_whole(table, path, fmt)
            on_file(ArchiveFile(bucket, first, path), table.num_rows)
        if end > start:
            written[bucket] = (start, end)
    return written


def _write_whole(table: pa.Table, path: Path, fmt: Format) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, partial)
    else:
        text = table.to_pandas().to_json(
            orient="records", lines=True, date_format="iso", date_unit="us"
        )
        partial.write_text(text if text.endswith("\n") else text + "\n")
    with partial.open("rb") as handle:
        os.fsync(handle.fileno())
    os.replace(partial, path)
