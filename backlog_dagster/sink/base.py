"""What every sink offers: results merged with progress in one transaction.

A sink holds the pipeline's results *and* its durable state (generations, boundary
markers, per-bucket progress, phases, heartbeats, the run lock), so that the offsets a
run has consumed and the results it produced from them are committed together: recovery
can neither skip nor replay a record (the consistency the Pravega seed asks of reader
positions). Everything outside this package depends on the ``Sink`` protocol only;
``backlog_dagster.sink.open_sink`` chooses the implementation ``sink.kind`` names.

Inside the package a sink is three parts: a ``Database`` (a connection, its
transactions, the run lock), the state (``sink.state``, written once for every
database) and a ``ResultsWriter`` (the results tables, one per database, since each
merges and bulk loads its own way); ``sink.stored`` puts them together.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pyarrow as pa
from typing_extensions import Self

from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.results import ResultLayout

if TYPE_CHECKING:
    import sqlalchemy as sa

T = TypeVar("T")


@dataclass(frozen=True)
class BucketState:
    """One bucket in one generation: where it started, its marker, how far it got."""

    bucket: int
    start: int
    marker: int
    reached: int
    #: The latest event time (µs) of the records committed from this bucket: where the
    #: bucket's watermark stands. None before the first commit.
    event_time_us: int | None = None

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


@dataclass(frozen=True)
class PhaseChange:
    """One row of the phase history: what the phase became, when, why, in which generation."""

    generation: int
    phase: str
    changed_at: float
    cause: str
    #: The watermark lag (s) the decision was made on, where the lag strategy made it.
    lag_s: float | None = None


class ResultTables:
    """The names of a pipeline's tables in a sink, derived from its results table's: one
    rule for every sink (``docs/sink-tables.md``)."""

    table: str
    layout: ResultLayout

    @property
    def view(self) -> str:
        """The results as users read them: keys, window bounds, aggregations; no internals."""
        return f"{self.table}_view"

    @property
    def late_table(self) -> str:
        return f"{self.table}_late"

    @property
    def dead_letter_table(self) -> str:
        return f"{self.table}_dead_letters"

    @property
    def windowed(self) -> bool:
        return self.layout.windowed


class ProgressConflict(RuntimeError):
    """A commit whose start does not match the progress the sink holds."""


class GenerationEnded(ProgressConflict):
    """A commit to a generation that a newer one replaced (the switch went back, or a reset)."""


#: The dead-letter table's columns: where a bad record is, what it held, why it is bad.
DEAD_LETTER_COLUMNS = ("bucket", "offset", "payload", "reason")


def check_commit(
    pipeline: str,
    generation: int,
    newest: int | None,
    held: Mapping[int, int],
    start: Mapping[int, int],
    end: Mapping[int, int],
) -> bool:
    """Whether a commit from ``start`` to ``end`` in ``generation`` is to be made, given
    the newest generation and the progress ``held``: False when exactly it was made
    already; ``GenerationEnded`` or ``ProgressConflict`` when it must not be."""
    if newest != generation:
        raise GenerationEnded(
            f"pipeline {pipeline}: generation {generation} was replaced by "
            f"generation {newest}; this commit is not made"
        )
    if all(held.get(b) == offset for b, offset in end.items()) and start != end:
        return False
    stale = {b: (held.get(b), offset) for b, offset in start.items() if held.get(b) != offset}
    if stale:
        raise ProgressConflict(
            f"pipeline {pipeline}: commit starts at offsets the sink does not hold "
            f"(bucket: (held, commit start)) {stale}; another run may be writing"
        )
    return True


class SinkUnreachable(RuntimeError, UserError):
    """The sink cannot be opened; the message names the field and what to check."""


class Database(Protocol):
    """The connection a sink's statements run on, for one pipeline."""

    def run(self, work: Callable[[sa.Connection], T], *, write: bool, retry: bool) -> T:
        """``work`` in one transaction, committed when it returns.

        A writing transaction (``write``) follows the pipeline's other writers, one at a
        time, from any process. A lost connection is opened again; with ``retry``,
        ``work`` is made again on it (it must be safe to make twice), else the call
        raises ``SinkUnreachable``.
        """

    def run_lock(self, holder: str, wait_s: float) -> AbstractContextManager[bool]:
        """``Sink.run_lock``."""

    def holds_run_lock(self, holder: str) -> bool:
        """``Sink.holds_run_lock``."""

    def keep_run_lock(self) -> bool:
        """``Sink.keep_run_lock``."""

    def lock_holder(self) -> str:
        """``Sink.lock_holder``."""

    def close(self) -> None: ...


class ResultsWriter(Protocol):
    """One pipeline's results, dead letters and late records in one database; each call
    runs in a transaction its caller holds on that database's connection (the names
    come from ``ResultTables``)."""

    @property
    def dead_letter_table(self) -> str: ...

    @property
    def late_table(self) -> str: ...

    def create(self, connection: sa.Connection) -> None:
        """The tables that do not depend on the data, unless they are there."""

    def clear(self, connection: sa.Connection) -> None:
        """Nothing held any more (new markers were taken): ``Sink.start_generation``."""

    def write(
        self,
        connection: sa.Connection,
        results: pa.Table,
        late: pa.Table | None,
        dead_letters: pa.Table | None,
    ) -> None:
        """Merge ``results`` into the held ones; keep ``late`` and ``dead_letters``."""

    def is_empty(self, connection: sa.Connection) -> bool: ...

    def read_results(self, connection: sa.Connection) -> pa.Table: ...

    def read_dead_letters(self, connection: sa.Connection) -> pa.Table: ...

    def read_late(self, connection: sa.Connection) -> pa.Table: ...

    def read_reference(self, connection: sa.Connection, table: str, columns: list[str]) -> pa.Table:
        """``Sink.read_reference``."""

    def dead_letter_count(self, connection: sa.Connection) -> int: ...

    def late_count(self, connection: sa.Connection) -> int: ...


class Sink(Protocol):
    @property
    def dead_letter_table(self) -> str:
        """Where users find the bad records, by name."""

    @property
    def late_table(self) -> str:
        """Where users find the late records (windowed pipelines), by name."""

    def current_generation(self) -> Generation | None:
        """The newest generation, or None before the pipeline first started."""

    def start_generation(
        self, buckets: dict[int, tuple[int, int]], reason: str, definition: str
    ) -> Generation:
        """Record new markers ``{bucket: (start, marker)}``; clears the results."""

    def continue_generation(
        self,
        markers: dict[int, int],
        reason: str,
        lag_s: float | None = None,
        if_phase: str | None = None,
    ) -> Generation | None:
        """A new generation that keeps the results: each bucket starts where it stands.

        The phase becomes ``backlog`` with ``reason`` in the same transaction. With
        ``if_phase``, only while the phase is still that (else None, nothing changed).
        """

    def track_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> Generation:
        """Add buckets that appeared after the markers were taken."""

    def commit(
        self,
        generation: int,
        start: dict[int, int],
        end: dict[int, int],
        results: pa.Table,
        late: pa.Table | None = None,
        event_times: Mapping[int, int | None] | None = None,
        dead_letters: pa.Table | None = None,
        joined: str | None = None,
    ) -> bool:
        """Merge ``results``, keep ``late`` and ``dead_letters``, move progress, atomically.

        ``event_times`` is the latest event time (µs) per bucket among the records
        committed; ``joined``, the version of ``transform.join``'s reference data the
        results joined. Returns False, changing nothing, when exactly this commit was already
        made; raises ``GenerationEnded`` when ``generation`` is no longer the newest.
        """

    def skip(self, generation: int, gaps: dict[int, tuple[int, int]]) -> None:
        """Move past offsets ``{bucket: (from, to)}`` that retention removed, recording it."""

    def phase(self) -> str:
        """``backlog`` or ``realtime``: the durable phase flag."""

    def record_phase(
        self, generation: int, phase: str, cause: str, lag_s: float | None = None
    ) -> bool:
        """Record a change to ``phase``, with its cause, in the phase history.

        Atomic with reading the current phase: a no-op returning False when the phase
        already is ``phase`` (the sensor and a standby run may both decide the switch) or
        ``generation`` is no longer the newest (a backlog run took new markers meanwhile).
        """

    def phase_history(self) -> list[PhaseChange]:
        """Every phase change of the pipeline, oldest first."""

    def is_empty(self) -> bool:
        """No result, dead letter or late record is held: starting over loses nothing."""

    def read_results(self) -> pa.Table:
        """The results as they stand, with the visible columns."""

    def read_dead_letters(self) -> pa.Table:
        """The bad records set aside, by bucket and offset."""

    def read_late(self) -> pa.Table:
        """The late records set aside (windowed pipelines)."""

    def read_reference(self, table: str, columns: list[str]) -> pa.Table:
        """Those of ``columns`` that ``table`` (in the sink's database, and schema) has,
        for ``transform.join``; ``LookupError`` when there is no such table."""

    def dead_letter_count(self) -> int: ...

    def late_count(self) -> int: ...

    def skipped_records(self) -> int:
        """Records skipped because retention removed them before they were read."""

    def switch_gap(self, generation: int) -> float | None:
        """Seconds from the backlog's last commit to the realtime phase's first one."""

    def beat(self, run_id: str) -> None:
        """A run says it is alive (the sensor restarts runs that stop saying so)."""

    def last_beat(self, run_id: str) -> float | None:
        """When the run last said it was alive (Unix s), if ever."""

    def publish_progress(self, run_id: str, progress: Mapping[str, Any]) -> None:
        """A run's progress beyond what it committed (JSON-able); the newest is kept."""

    def published_progress(self) -> Mapping[str, Any] | None:
        """The newest progress a run of the pipeline published, if any."""

    def run_lock(self, holder: str, wait_s: float) -> AbstractContextManager[bool]:
        """Hold the pipeline's run lock for the block if it can be had within ``wait_s``;
        the block is told whether it holds it. ``holder`` says who, for the refused.

        Whatever the implementation, a process that dies lets go of it.
        """

    def lock_holder(self) -> str:
        """Who holds the run lock, as its holder described itself ('' if unknown)."""

    def holds_run_lock(self, holder: str) -> bool:
        """Whether ``holder`` (as given to ``run_lock``) holds the run lock now, from any
        process: how a realtime query's commit, which may run in another process, tells
        that the run that started it is alive."""

    def keep_run_lock(self) -> bool:
        """Keep the run lock this sink holds: take it again if it went with a lost
        connection (the server restarted). False if it is not held here, or another
        run took it meanwhile."""

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
