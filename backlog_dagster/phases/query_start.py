"""Where a realtime query starts: a file in its checkpoint folder, written once by its run.

A realtime query is started before it is known where it starts: a backlog run that goes
on as the realtime run, or a standby run, arms its query while the backlog still runs,
and only at the switch learns the generation and the offsets the backlog reached. A
realtime query on a warmed, idle Spark Connect server (2 cores) ran its first
micro-batch 6.8 to 8.5 s after it was started: the server starts a Python process for
``foreachBatch``, another for the stream reader and two for its plans, each importing
PySpark, and the first micro-batch runs cold. An armed query has done all that when
the switch comes.

The stream reader waits for this file (its option ``startingOffsetsFile``) and reads
nothing until it exists; the commit reads the generation from it. A query started at
once (no standby) gets its file before it starts. It is written once, atomically, and
never changed: the stream reader and the commit may read it at any time and must agree.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

#: The file's name in the query's checkpoint folder.
START_FILE = "start.json"


@dataclass(frozen=True)
class QueryStart:
    """The generation a query commits into and its offsets per bucket where it starts."""

    generation: int
    offsets: dict[int, int]


def start_file(checkpoint: Path) -> Path:
    """The start file of the query whose checkpoint folder is ``checkpoint``."""
    return checkpoint / START_FILE


def write_start(checkpoint: Path, start: QueryStart) -> None:
    """Let the query at ``checkpoint`` go: write its start (once, atomically)."""
    checkpoint.mkdir(parents=True, exist_ok=True)
    path = start_file(checkpoint)
    if path.exists():
        raise FileExistsError(f"{path}: a query's start is written once")
    text = json.dumps(
        {
            "generation": start.generation,
            "startingOffsets": {str(b): o for b, o in sorted(start.offsets.items())},
        }
    )
    temporary = path.with_name(f".{START_FILE}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)


def read_start(checkpoint: Path) -> QueryStart | None:
    """The query's start, or None while its run has not written it."""
    try:
        held = json.loads(start_file(checkpoint).read_text())
    except FileNotFoundError:
        return None
    return QueryStart(
        held["generation"], {int(b): int(o) for b, o in held["startingOffsets"].items()}
    )
