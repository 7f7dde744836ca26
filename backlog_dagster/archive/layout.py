"""Where an archive keeps a bucket's records: Kafka Connect's layout.

    <root>/<topic>/partition=<p>/<topic>+<p>+<startOffset>.<ext>

with the start offset zero-padded to ten digits (Kafka Connect's default
``filename.offset.zero.pad.width``). A file holds consecutive records from its start
offset on; a file appears under its final name only once it is whole.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Format = Literal["parquet", "json"]
EXTENSIONS: dict[str, Format] = {"parquet": "parquet", "json": "json"}
PAD = 10


@dataclass(frozen=True)
class ArchiveFile:
    bucket: int
    start: int
    path: Path

    @property
    def format(self) -> Format:
        return EXTENSIONS[self.path.suffix.lstrip(".")]


def folder(root: Path, topic: str, bucket: int) -> Path:
    return root / topic / f"partition={bucket}"


def file_path(root: Path, topic: str, bucket: int, start: int, fmt: Format) -> Path:
    return folder(root, topic, bucket) / f"{topic}+{bucket}+{start:0{PAD}d}.{fmt}"


def files(root: Path, topic: str) -> dict[int, list[ArchiveFile]]:
    """Every whole file of ``topic`` under ``root``, per bucket, by start offset."""
    pattern = re.compile(rf"^{re.escape(topic)}\+(\d+)\+(\d+)\.(parquet|json)$")
    found: dict[int, list[ArchiveFile]] = {}
    base = root / topic
    if not base.is_dir():
        return found
    for partition in base.glob("partition=*"):
        for path in partition.iterdir():
            match = pattern.match(path.name)
            if match is None:
                continue
            bucket, start = int(match[1]), int(match[2])
            found.setdefault(bucket, []).append(ArchiveFile(bucket, start, path))
    return {b: sorted(fs, key=lambda f: f.start) for b, fs in sorted(found.items())}


def records_in(archived: ArchiveFile) -> int:
    """How many records the file holds (Parquet: from its footer; JSON: its lines).

    Remembered per file version: a backlog asks for every file's count at each chunk,
    and a whole file does not change (its name, size and time would).
    """
    stat = archived.path.stat()
    return _count(str(archived.path), archived.format, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=65_536)
def _count(path: str, fmt: Format, mtime_ns: int, size: int) -> int:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with open(path, "rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


def archived_end(root: Path, topic: str, bucket: int) -> int | None:
    """The offset after the last record the archive holds for ``bucket``; None if none."""
    held = files(root, topic).get(bucket)
    if not held:
        return None
    return held[-1].start + records_in(held[-1])


@dataclass(frozen=True)
class HeldFile:
    """An archive file of a read, and the offset its records end before."""

    file: ArchiveFile
    end: int
