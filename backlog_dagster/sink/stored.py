"""A sink made of its three parts: a database, the pipeline's state and its results.

Every method is one transaction on the database's connection; ``commit`` checks the
progress held, writes the results and moves the progress in the same one, so what a
commit produced and the offsets it consumed land together or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import sqlalchemy as sa
from typing_extensions import Self

from backlog_dagster.sink.base import Database, Generation, PhaseChange, ResultsWriter
from backlog_dagster.sink.state import (
    PipelineState,
    StateTables,
    create_state_tables,
    state_tables_missing,
)

T = TypeVar("T")


class StoredSink:
    """The ``Sink`` every database gives: its ``Database`` and ``ResultsWriter`` are the
    parts that differ."""

    def __init__(
        self, database: Database, tables: StateTables, results: ResultsWriter, pipeline: str
    ) -> None:
        self.database = database
        self.results = results
        self.state = PipelineState(tables, pipeline)
        try:
            # Checked before anything is taken: a sink opened every sensor tick then
            # takes no lock, and needs no right to create anything.
            if self._read(lambda c: state_tables_missing(c, tables)):
                self._write(lambda c: create_state_tables(c, tables))
            self._write(results.create)
        except BaseException:
            database.close()
            raise

    def _read(self, work: Callable[[sa.Connection], T]) -> T:
        return self.database.run(work, write=False, retry=True)

    def _write(self, work: Callable[[sa.Connection], T], retry: bool = True) -> T:
        return self.database.run(work, write=True, retry=retry)

    @property
    def dead_letter_table(self) -> str:
        return self.results.dead_letter_table

    @property
    def late_table(self) -> str:
        return self.results.late_table

    # -- generations and phases ---------------------------------------------------------

    def current_generation(self) -> Generation | None:
        return self._read(self.state.current_generation)

    def start_generation(
        self, buckets: dict[int, tuple[int, int]], reason: str, definition: str
    ) -> Generation:
        def start(connection: sa.Connection) -> None:
            states = {b: (start, marker, start, None) for b, (start, marker) in buckets.items()}
            number = self.state.new_generation(connection, states, reason, definition)
            self.state.insert_phase(connection, number, "backlog", reason, None)
            self.results.clear(connection)

        # Not made again after a lost connection: it would take a second generation.
        self._write(start, retry=False)
        return self._current()

    def track_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> Generation:
        states = {b: (start, marker, start, None) for b, (start, marker) in buckets.items()}
        self._write(lambda c: self.state.insert_buckets(c, generation, states))
        return self._current()

    def continue_generation(
        self,
        markers: dict[int, int],
        reason: str,
        lag_s: float | None = None,
        if_phase: str | None = None,
    ) -> Generation | None:
        def go_on(connection: sa.Connection) -> bool:
            if if_phase is not None and self.state.phase(connection) != if_phase:
                return False
            current = self.state.current_generation(connection)
            assert current is not None, "continue_generation needs a generation to continue"
            states = {
                b.bucket: (
                    b.reached,
                    max(b.reached, markers.get(b.bucket, b.reached)),
                    b.reached,
                    b.event_time_us,
                )
                for b in current.buckets.values()
            }
            number = self.state.new_generation(connection, states, reason, current.definition)
            self.state.insert_phase(connection, number, "backlog", reason, lag_s)
            return True

        # Made again only when guarded by the phase: the first attempt, if it landed,
        # changed the phase, so the second changes nothing.
        if not self._write(go_on, retry=if_phase is not None):
            return None
        return self._current()

    def _current(self) -> Generation:
        generation = self.current_generation()
        assert generation is not None
        return generation

    def phase(self) -> str:
        return self._read(self.state.phase)

    def record_phase(
        self, generation: int, phase: str, cause: str, lag_s: float | None = None
    ) -> bool:
        def record(connection: sa.Connection) -> bool:
            newest = self.state.newest(connection)
            if self.state.phase(connection) == phase or newest not in (None, generation):
                return False
            self.state.insert_phase(connection, generation, phase, cause, lag_s)
            return True

        return self._write(record)

    def phase_history(self) -> list[PhaseChange]:
        return self._read(self.state.phase_history)

    # -- commits ------------------------------------------------------------------------

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
        def commit_once(connection: sa.Connection) -> bool:
            if not self.state.may_commit(connection, generation, start, end):
                return False
            self.results.write(connection, results, late, dead_letters)
            self.state.advance(connection, generation, start, end, event_times or {}, joined)
            return True

        # Safe to make again: a commit that landed before the connection was lost is
        # recognised by the progress it moved, and changes nothing the second time.
        return self._write(commit_once)

    def skip(self, generation: int, gaps: dict[int, tuple[int, int]]) -> None:
        self._write(lambda c: self.state.skip(c, generation, gaps))

    def switch_gap(self, generation: int) -> float | None:
        return self._read(lambda c: self.state.switch_gap(c, generation))

    def skipped_records(self) -> int:
        return self._read(self.state.skipped_records)

    # -- results ------------------------------------------------------------------------

    def is_empty(self) -> bool:
        return self._read(self.results.is_empty)

    def read_results(self) -> pa.Table:
        return self._read(self.results.read_results)

    def read_dead_letters(self) -> pa.Table:
        return self._read(self.results.read_dead_letters)

    def read_late(self) -> pa.Table:
        return self._read(self.results.read_late)

    def read_reference(self, table: str, columns: list[str]) -> pa.Table:
        return self._read(lambda c: self.results.read_reference(c, table, columns))

    def dead_letter_count(self) -> int:
        return self._read(self.results.dead_letter_count)

    def late_count(self) -> int:
        return self._read(self.results.late_count)

    # -- liveness and the run lock ------------------------------------------------------

    def beat(self, run_id: str) -> None:
        self._write(lambda c: self.state.beat(c, run_id))

    def last_beat(self, run_id: str) -> float | None:
        return self._read(lambda c: self.state.last_beat(c, run_id))

    def publish_progress(self, run_id: str, progress: Mapping[str, Any]) -> None:
        self._write(lambda c: self.state.publish_progress(c, run_id, progress))

    def published_progress(self) -> Mapping[str, Any] | None:
        return self._read(self.state.published_progress)

    @contextmanager
    def run_lock(self, holder: str, wait_s: float) -> Iterator[bool]:
        with self.database.run_lock(holder, wait_s) as held:
            yield held

    def lock_holder(self) -> str:
        return self.database.lock_holder()

    def holds_run_lock(self, holder: str) -> bool:
        return self.database.holds_run_lock(holder)

    def keep_run_lock(self) -> bool:
        return self.database.keep_run_lock()

    def close(self) -> None:
        self.database.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
