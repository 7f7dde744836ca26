"""Micro-batch starts spread over the interval, for streaming queries on one machine.

Spark starts a ``processingTime`` micro-batch on a multiple of the interval counted from
the epoch, so every query with the same interval on one Spark (a shared Connect server,
or runs each with a local Spark on one machine) starts its micro-batches at the same
instant, and they contend for the same cores while the machine then idles until the
next one. A paced query runs with Spark's trigger at 0 and its reader waits, in
``latestOffset``, for the query's own *slot*: a fixed offset (its phase) past each
multiple of the interval.

A query takes its phase when it first waits: the middle of the widest gap between the
phases of the other paced queries live on this machine. They are kept as one small
file per query in a folder of the system's temporary directory, each touched at every
slot; a file untouched for several intervals belongs to a query that stopped, and its
slot is free again. The others keep theirs: no query moves once it has a phase.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock

#: Where this machine's paced queries keep their phases.
SLOTS_DIR = Path(tempfile.gettempdir()) / "backlog-dagster-slots"
#: A query whose file was not touched for this many of its intervals (and at least
#: ``STALE_AFTER_S``) has stopped.
STALE_INTERVALS = 4
STALE_AFTER_S = 10.0


def widest_gap_middle(interval: float, phases: Iterable[float]) -> float:
    """The phase (in ``[0, interval)``) farthest from every one of ``phases``, taken
    modulo ``interval``: the middle of the widest gap between them; 0 with none."""
    points = sorted({p % interval for p in phases})
    if not points:
        return 0.0
    best_start, best_width = points[-1], points[0] + interval - points[-1]
    for left, right in itertools.pairwise(points):
        if right - left > best_width:
            best_start, best_width = left, right - left
    return (best_start + best_width / 2) % interval


@dataclass
class Pacer:
    """Waits for one query's slot: ``phase`` past each multiple of ``interval``."""

    interval: float
    folder: Path = SLOTS_DIR
    phase: float | None = None
    name: str = field(default_factory=lambda: uuid.uuid4().hex)

    #: The slot the last wait ended on (or, after an overrun, the one just passed).
    last_slot: float | None = None

    def wait(self) -> None:
        """Sleep until the query's next slot (taking a phase first, if it has none).

        A micro-batch that ran past the slot after its own (a query catching up) is
        followed at once, where Spark's trigger would idle until its next multiple of
        the interval; the query is back on its slots once a micro-batch fits in one.
        """
        if self.phase is not None:
            try:
                os.utime(self._file)
            except OSError:  # removed as stale after a long pause, or never written
                self.phase = None
        if self.phase is None:
            self.phase = self._take_phase()
        now = time.time()
        passed = (now - self.phase) // self.interval * self.interval + self.phase
        if self.last_slot is not None and passed > self.last_slot + self.interval / 2:
            self.last_slot = passed  # overran: go on now
            return
        self.last_slot = passed + self.interval
        time.sleep(max(0.0, self.last_slot - now))

    @property
    def _file(self) -> Path:
        return self.folder / f"{self.name}.json"

    def _take_phase(self) -> float:
        """A phase agreed with the other queries; Spark's own (0) where the folder cannot
        be written: pacing must not fail a query."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with FileLock(self.folder / ".lock"):
                phase = widest_gap_middle(self.interval, self._live_phases())
                self._file.write_text(json.dumps({"interval": self.interval, "phase": phase}))
        except OSError:
            return 0.0
        return phase

    def _live_phases(self) -> list[float]:
        """The phases of the other live queries; files of stopped ones are removed."""
        phases, now = [], time.time()
        for path in self.folder.glob("*.json"):
            try:
                entry = json.loads(path.read_text())
                age = now - path.stat().st_mtime
            except (OSError, ValueError):
                continue
            if age > max(STALE_INTERVALS * float(entry["interval"]), STALE_AFTER_S):
                path.unlink(missing_ok=True)
            else:
                phases.append(float(entry["phase"]))
        return phases
