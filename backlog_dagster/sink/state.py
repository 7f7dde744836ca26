"""A pipeline's coordination state, written once for every database a sink uses.

Generations and their boundary markers, per-bucket progress, the phase history, commits,
heartbeats, published progress and skips: seven tables of plain columns, described here
with SQLAlchemy Core (which ships with Dagster) so that one set of statements serves
SQLite and PostgreSQL alike. The statements run on a connection the sink's ``Database``
gives them, inside its transaction, so a commit moves progress in the same transaction
that writes the results (``sink.stored``). The tables are listed for users in
``docs/sink-tables.md``.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from backlog_dagster.sink.base import BucketState, Generation, PhaseChange, check_commit

_TEXT: sa.types.TypeEngine[str] = sa.Text()
_NUMBER: sa.types.TypeEngine[int] = sa.Integer()
_OFFSET: sa.types.TypeEngine[int] = sa.BigInteger()
_SECONDS: sa.types.TypeEngine[float] = sa.Double()


@dataclass(frozen=True)
class StateTables:
    """The state tables of one database (and schema)."""

    metadata: sa.MetaData
    generations: sa.Table
    buckets: sa.Table
    commits: sa.Table
    heartbeats: sa.Table
    run_progress: sa.Table
    phases: sa.Table
    skips: sa.Table


@functools.cache
def state_tables(schema: str | None = None) -> StateTables:
    """The tables' definitions, in ``schema`` (PostgreSQL) or the database's own (SQLite).

    Made once per schema in a process: SQLAlchemy caches a statement's compiled form by
    the tables it names, so the sinks a sensor opens every tick reuse it."""
    metadata = sa.MetaData(schema=schema)
    generations, buckets, phases, skips = _progress_tables(metadata)
    commits, heartbeats, run_progress = _run_tables(metadata)
    return StateTables(
        metadata, generations, buckets, commits, heartbeats, run_progress, phases, skips
    )


def _column(name: str, kind: sa.types.TypeEngine[Any], null: bool = False) -> sa.Column[Any]:
    return sa.Column(name, kind, nullable=null)


def _table(
    metadata: sa.MetaData, name: str, *columns: sa.Column[Any], key: tuple[str, ...] = ()
) -> sa.Table:
    constraints = [sa.PrimaryKeyConstraint(*key)] if key else []
    return sa.Table(f"backlog_{name}", metadata, *columns, *constraints)


def _progress_tables(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table, sa.Table]:
    """Generations, their buckets' progress, the phase history and the skips."""
    generations = _table(
        metadata,
        "generations",
        _column("pipeline", _TEXT),
        _column("generation", _NUMBER),
        _column("created_at", _SECONDS),
        _column("reason", _TEXT),
        _column("definition", _TEXT),
        key=("pipeline", "generation"),
    )
    buckets = _table(
        metadata,
        "buckets",
        _column("pipeline", _TEXT),
        _column("generation", _NUMBER),
        _column("bucket", _NUMBER),
        _column("start_offset", _OFFSET),
        _column("marker", _OFFSET),
        _column("reached", _OFFSET),
        _column("event_time_us", _OFFSET, null=True),
        key=("pipeline", "generation", "bucket"),
    )
    # ``id`` orders the history (on SQLite it is the rowid, which orders tables made
    # before the column existed).
    phases = _table(
        metadata,
        "phases",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        _column("pipeline", _TEXT),
        _column("generation", _NUMBER),
        _column("phase", _TEXT),
        _column("changed_at", _SECONDS),
        _column("cause", _TEXT),
        _column("lag_s", _SECONDS, null=True),
    )
    skips = _table(
        metadata,
        "skips",
        _column("pipeline", _TEXT),
        _column("generation", _NUMBER),
        _column("bucket", _NUMBER),
        _column("from_offset", _OFFSET),
        _column("to_offset", _OFFSET),
        _column("skipped_at", _SECONDS),
    )
    return generations, buckets, phases, skips


def _run_tables(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table]:
    """The commits made, the runs' heartbeats and the progress they published."""
    commits = _table(
        metadata,
        "commits",
        _column("pipeline", _TEXT),
        _column("generation", _NUMBER),
        _column("phase", _TEXT),
        _column("committed_at", _SECONDS),
        _column("records", _OFFSET),
        _column("joined", _TEXT, null=True),
    )
    heartbeats = _table(
        metadata,
        "heartbeats",
        _column("pipeline", _TEXT),
        _column("run_id", _TEXT),
        _column("at", _SECONDS),
        key=("pipeline", "run_id"),
    )
    run_progress = _table(
        metadata,
        "run_progress",
        _column("pipeline", _TEXT),
        _column("run_id", _TEXT),
        _column("at", _SECONDS),
        _column("progress", _TEXT),
        key=("pipeline",),
    )
    return commits, heartbeats, run_progress


def state_tables_missing(connection: sa.Connection, tables: StateTables) -> bool:
    """Whether a state table, or a column added since the first release, is missing."""
    held = set(sa.inspect(connection).get_table_names(schema=tables.metadata.schema))
    if any(t.name not in held for t in tables.metadata.sorted_tables):
        return True
    with connection.begin_nested() as probe:
        try:
            connection.execute(sa.select(tables.commits.c.joined).limit(0))
        except sa.exc.DBAPIError:
            probe.rollback()
            return True
    return False


def create_state_tables(connection: sa.Connection, tables: StateTables) -> None:
    """The tables that are missing, and ``backlog_commits.joined`` in a database from
    before ``transform.join``."""
    schema = tables.metadata.schema
    if schema is not None:
        connection.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    tables.metadata.create_all(connection)
    commits = tables.commits
    found = sa.inspect(connection).get_columns(commits.name, schema=schema)
    if "joined" not in {c["name"] for c in found}:
        name = connection.dialect.identifier_preparer.format_table(commits)
        connection.exec_driver_sql(f"ALTER TABLE {name} ADD COLUMN joined TEXT")


class PipelineState:
    """One pipeline's rows in the state tables: each method runs on a connection inside
    a transaction its caller holds (a writing one for the methods that write)."""

    def __init__(self, tables: StateTables, pipeline: str) -> None:
        self.tables = tables
        self.pipeline = pipeline
        # SQLite's rowid orders the phases of tables made before they had an ``id``.
        phases = tables.phases
        self._phase_order = (
            sa.literal_column("rowid") if tables.metadata.schema is None else phases.c.id
        )

    # -- generations --------------------------------------------------------------------

    def current_generation(self, connection: sa.Connection) -> Generation | None:
        generations, buckets = self.tables.generations, self.tables.buckets
        row = connection.execute(
            sa.select(
                generations.c.generation,
                generations.c.created_at,
                generations.c.reason,
                generations.c.definition,
            )
            .where(generations.c.pipeline == self.pipeline)
            .order_by(generations.c.generation.desc())
            .limit(1)
        ).first()
        if row is None:
            return None
        number, created_at, reason, definition = row
        states = connection.execute(
            sa.select(
                buckets.c.bucket,
                buckets.c.start_offset,
                buckets.c.marker,
                buckets.c.reached,
                buckets.c.event_time_us,
            )
            .where(buckets.c.pipeline == self.pipeline, buckets.c.generation == number)
            .order_by(buckets.c.bucket)
        )
        found = {state[0]: BucketState(*state) for state in states}
        return Generation(number, created_at, reason, definition, found)

    def newest(self, connection: sa.Connection) -> int | None:
        generations = self.tables.generations
        return connection.scalar(
            sa.select(sa.func.max(generations.c.generation)).where(
                generations.c.pipeline == self.pipeline
            )
        )

    def new_generation(
        self,
        connection: sa.Connection,
        buckets: Mapping[int, tuple[int, int, int, int | None]],
        reason: str,
        definition: str,
    ) -> int:
        """A generation with ``{bucket: (start, marker, reached, event time)}``, its phase
        ``backlog`` for ``reason``; its number."""
        number = (self.newest(connection) or 0) + 1
        connection.execute(
            sa.insert(self.tables.generations).values(
                pipeline=self.pipeline,
                generation=number,
                created_at=time.time(),
                reason=reason,
                definition=definition,
            )
        )
        self.insert_buckets(connection, number, buckets)
        return number

    def insert_buckets(
        self,
        connection: sa.Connection,
        generation: int,
        buckets: Mapping[int, tuple[int, int, int, int | None]],
    ) -> None:
        """Add ``{bucket: (start, marker, reached, event time)}``; a bucket the generation
        tracks already is left as it is."""
        table = self.tables.buckets
        held = set(
            connection.scalars(
                sa.select(table.c.bucket).where(
                    table.c.pipeline == self.pipeline, table.c.generation == generation
                )
            )
        )
        rows = [
            {
                "pipeline": self.pipeline,
                "generation": generation,
                "bucket": bucket,
                "start_offset": start,
                "marker": marker,
                "reached": reached,
                "event_time_us": event_time,
            }
            for bucket, (start, marker, reached, event_time) in sorted(buckets.items())
            if bucket not in held
        ]
        if rows:
            connection.execute(sa.insert(table), rows)

    # -- phases -------------------------------------------------------------------------

    def phase(self, connection: sa.Connection) -> str:
        phases = self.tables.phases
        found = connection.scalar(
            sa.select(phases.c.phase)
            .where(phases.c.pipeline == self.pipeline)
            .order_by(self._phase_order.desc())
            .limit(1)
        )
        return "backlog" if found is None else str(found)

    def insert_phase(
        self,
        connection: sa.Connection,
        generation: int,
        phase: str,
        cause: str,
        lag_s: float | None,
    ) -> None:
        connection.execute(
            sa.insert(self.tables.phases).values(
                pipeline=self.pipeline,
                generation=generation,
                phase=phase,
                changed_at=time.time(),
                cause=cause,
                lag_s=lag_s,
            )
        )

    def phase_history(self, connection: sa.Connection) -> list[PhaseChange]:
        phases = self.tables.phases
        rows = connection.execute(
            sa.select(
                phases.c.generation,
                phases.c.phase,
                phases.c.changed_at,
                phases.c.cause,
                phases.c.lag_s,
            )
            .where(phases.c.pipeline == self.pipeline)
            .order_by(self._phase_order)
        )
        return [PhaseChange(*row) for row in rows]

    # -- commits ------------------------------------------------------------------------

    def may_commit(
        self,
        connection: sa.Connection,
        generation: int,
        start: Mapping[int, int],
        end: Mapping[int, int],
    ) -> bool:
        """``check_commit`` on the progress held now (in the caller's transaction)."""
        buckets = self.tables.buckets
        rows = connection.execute(
            sa.select(buckets.c.bucket, buckets.c.reached).where(
                buckets.c.pipeline == self.pipeline, buckets.c.generation == generation
            )
        )
        held = {bucket: reached for bucket, reached in rows}
        newest = self.newest(connection)
        return check_commit(self.pipeline, generation, newest, held, start, end)

    def advance(
        self,
        connection: sa.Connection,
        generation: int,
        start: Mapping[int, int],
        end: Mapping[int, int],
        event_times: Mapping[int, int | None],
        joined: str | None,
    ) -> None:
        """Move the buckets' progress to ``end`` (and their event times on), and record
        the commit."""
        buckets = self.tables.buckets
        moved = buckets.c.event_time_us
        given = sa.bindparam("time", type_=_OFFSET)
        latest = sa.case(
            (moved.is_(None), given),
            (given.is_(None), moved),
            (given > moved, given),
            else_=moved,
        )
        connection.execute(
            sa.update(buckets)
            .where(
                buckets.c.pipeline == self.pipeline,
                buckets.c.generation == generation,
                buckets.c.bucket == sa.bindparam("at_bucket"),
            )
            .values(reached=sa.bindparam("to"), event_time_us=latest),
            [
                {"at_bucket": b, "to": offset, "time": event_times.get(b)}
                for b, offset in end.items()
            ],
        )
        connection.execute(
            sa.insert(self.tables.commits).values(
                pipeline=self.pipeline,
                generation=generation,
                phase=self.phase(connection),
                committed_at=time.time(),
                records=sum(end[b] - start.get(b, end[b]) for b in end),
                joined=joined,
            )
        )

    def switch_gap(self, connection: sa.Connection, generation: int) -> float | None:
        """Seconds from the backlog's last commit to the realtime phase's first one."""
        commits = self.tables.commits

        def of(phase: str) -> sa.Select[Any]:
            return sa.select(commits.c.committed_at).where(
                commits.c.pipeline == self.pipeline,
                commits.c.generation == generation,
                commits.c.phase == phase,
            )

        first = connection.scalar(of("realtime").order_by(commits.c.committed_at).limit(1))
        last = connection.scalar(of("backlog").order_by(commits.c.committed_at.desc()).limit(1))
        return None if first is None or last is None else float(first - last)

    def skip(
        self, connection: sa.Connection, generation: int, gaps: Mapping[int, tuple[int, int]]
    ) -> None:
        """Move past offsets ``{bucket: (from, to)}`` that retention removed, recording a
        skip only where it moved the bucket (made twice, it changes nothing)."""
        buckets = self.tables.buckets
        for bucket, (low, high) in sorted(gaps.items()):
            moved = connection.execute(
                sa.update(buckets)
                .where(
                    buckets.c.pipeline == self.pipeline,
                    buckets.c.generation == generation,
                    buckets.c.bucket == bucket,
                    buckets.c.reached == low,
                )
                .values(reached=high)
            ).rowcount
            if moved:
                connection.execute(
                    sa.insert(self.tables.skips).values(
                        pipeline=self.pipeline,
                        generation=generation,
                        bucket=bucket,
                        from_offset=low,
                        to_offset=high,
                        skipped_at=time.time(),
                    )
                )

    def skipped_records(self, connection: sa.Connection) -> int:
        skips = self.tables.skips
        total = connection.scalar(
            sa.select(sa.func.sum(skips.c.to_offset - skips.c.from_offset)).where(
                skips.c.pipeline == self.pipeline
            )
        )
        return int(total or 0)

    # -- liveness -----------------------------------------------------------------------

    def beat(self, connection: sa.Connection, run_id: str) -> None:
        self._upsert(
            connection,
            self.tables.heartbeats,
            {"pipeline": self.pipeline, "run_id": run_id},
            {"at": time.time()},
        )

    def last_beat(self, connection: sa.Connection, run_id: str) -> float | None:
        beats = self.tables.heartbeats
        at = connection.scalar(
            sa.select(beats.c.at).where(beats.c.pipeline == self.pipeline, beats.c.run_id == run_id)
        )
        return None if at is None else float(at)

    def publish_progress(
        self, connection: sa.Connection, run_id: str, progress: Mapping[str, Any]
    ) -> None:
        self._upsert(
            connection,
            self.tables.run_progress,
            {"pipeline": self.pipeline},
            {"run_id": run_id, "at": time.time(), "progress": json.dumps(progress)},
        )

    def published_progress(self, connection: sa.Connection) -> Mapping[str, Any] | None:
        table = self.tables.run_progress
        text = connection.scalar(
            sa.select(table.c.progress).where(table.c.pipeline == self.pipeline)
        )
        return None if text is None else dict(json.loads(text))

    @staticmethod
    def _upsert(
        connection: sa.Connection,
        table: sa.Table,
        key: Mapping[str, Any],
        values: Mapping[str, Any],
    ) -> None:
        """Set ``values`` on the row of ``key``, made if missing: an update first, as the
        row is there but for the first time (callers hold a writing transaction)."""
        where = [table.c[name] == value for name, value in key.items()]
        if not connection.execute(sa.update(table).where(*where).values(**values)).rowcount:
            connection.execute(sa.insert(table).values(**key, **values))
