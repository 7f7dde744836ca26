"""What every sink offers: results merged with progress in one transaction.

A sink holds the pipeline's results *and* its durable state (generations, boundary
markers, per-bucket progress), so that the offsets a run has consumed and the results
it produced from them are committed together: recovery can neither skip nor replay a
record (the consistency the Pravega seed asks of reader positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa


@dataclass(frozen=True)
class BucketState:
    """One bucket in one generation: where it started, its marker, how far it got."""

    bucket: int
    start: int
    marker: int
    reached: int

    @property
    def finished(self) -> bool:
        return self.reached >= self.marker


@dataclass(frozen=True)
class Generation:
    """A set of boundary markers, taken when the pipeline started or was reset."""

    number: int
    created_at: float
    reason: str
    definition: str
    buckets: dict[int, BucketState]

    @property
    def finished(self) -> bool:
        return all(b.finished for b in self.buckets.values())


class ProgressConflict(RuntimeError):
    """A commit whose start does not match the progress the sink holds."""


class Sink(Protocol):
    def current_generation(self) -> Generation | None:
        """The newest generation, or None before the pipeline first started."""

    def start_generation(
        self, buckets: dict[int, tuple[int, int]], reason: str, definition: str
    ) -> Generation:
        """Record new markers ``{bucket: (start, marker)}``; clears the results."""

    def track_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> Generation:
        """Add buckets that appeared after the markers were taken."""

    def commit(
        self,
        generation: int,
        start: dict[int, int],
        end: dict[int, int],
        results: pa.Table,
        late: pa.Table | None = None,
    ) -> bool:
        """Merge ``results``, keep ``late`` records, move progress ``start`` → ``end``, atomically.

        Returns False, changing nothing, when exactly this commit was already made.
        """

    def phase(self) -> str:
        """``backlog`` or ``realtime``: the durable phase flag."""

    def record_phase(self, generation: int, phase: str, cause: str) -> None:
        """Record a phase change, with its cause, in the phase history."""

    def max_event_time(self) -> str | None:
        """Latest event time committed so far (ISO text), for windowed pipelines."""

    def read_results(self) -> pa.Table:
        """The results as they stand, with the visible columns."""

    def close(self) -> None: ...
