"""The PostgreSQL sink: results and the pipeline's state in tables of one schema.

A commit is one transaction: the chunk's partial results are bulk loaded (``COPY`` into
a temporary table) and merged into the results in one ``MERGE`` statement (hence
PostgreSQL 15 or later), beside the progress and offsets they cover (the results table
leaves room on its pages for the merges' new row versions: ``RESULTS_FILLFACTOR``).
Every writing transaction first takes the pipeline's transaction-level advisory lock, so
writers of one pipeline (a run, the sensor, a superseded run) follow one another, and
the generation fence is checked under it: a run whose generation was replaced commits
nothing. A reader sees results and progress that agree at every moment (MVCC: both
change in the same transaction).

The run lock is a session-level advisory lock held on a connection of its own: runs on
two machines exclude each other, and a process that dies lets go of it when its
connection ends.

A lost connection (the server restarted, ``pg_terminate_backend``) is opened again with
backoff, and the interrupted call is made again where that is safe: a commit made again
is recognised (``commit`` returns False), so a commit whose outcome was lost with the
connection is neither lost nor doubled.

The connection string may carry a password (read from the environment); it is in no
message this module raises: errors name the sink by ``describe`` instead.
"""

from __future__ import annotations

import io
import json
import os
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv
from psycopg import sql
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)
from typing_extensions import Self

from backlog_dagster.pipeline.results import (
    RECORD_ID,
    ResultLayout,
    merge_sketches,
    visible_record_columns,
)
from backlog_dagster.sink.base import (
    DEAD_LETTER_COLUMNS,
    BucketState,
    Generation,
    PhaseChange,
    ResultTables,
    SinkUnreachable,
    check_commit,
)
from backlog_dagster.waiting import until

T = TypeVar("T")

#: How full PostgreSQL fills the results table's pages (percent). A merge rewrites every
#: key its chunk touches; with room on the row's own page the new version goes there and
#: the primary key index is left alone (a "HOT" update). Full pages (the default, 100)
#: send each new version elsewhere and update the index too: a commit merging into
#: 100,000 keys merged before took 0.78 s at 100 and 0.37 s at 50, for up to twice the
#: pages (``bench/sinks.py``, medians).
RESULTS_FILLFACTOR = 50

#: How long a call keeps opening a lost connection again before it gives up (a server
#: restart), and how long opening the sink waits for the server (a mistyped connection
#: string should be reported soon).
RECONNECT_S, OPEN_S = 90.0, 10.0

#: The oldest server the sink works with (``server_version``'s form): 15 brought MERGE.
OLDEST_SERVER = 150000

#: First keys of the two advisory locks (the second is the pipeline's): one serialises
#: the pipeline's writing transactions, the other is the run lock.
_WRITER_LOCK, _RUN_LOCK = 0x6264_0001, 0x6264_0002

_LATE_COLUMNS = ("bucket", "offset", "event_time", "watermark")

_STATE_TABLES = (
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_generations (
    pipeline text NOT NULL,
    generation integer NOT NULL,
    created_at double precision NOT NULL,
    reason text NOT NULL,
    definition text NOT NULL,
    PRIMARY KEY (pipeline, generation)
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_buckets (
    pipeline text NOT NULL,
    generation integer NOT NULL,
    bucket integer NOT NULL,
    start_offset bigint NOT NULL,
    marker bigint NOT NULL,
    reached bigint NOT NULL,
    event_time_us bigint,
    PRIMARY KEY (pipeline, generation, bucket)
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_commits (
    pipeline text NOT NULL,
    generation integer NOT NULL,
    phase text NOT NULL,
    committed_at double precision NOT NULL,
    records bigint NOT NULL,
    joined text
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_heartbeats (
    pipeline text NOT NULL,
    run_id text NOT NULL,
    at double precision NOT NULL,
    PRIMARY KEY (pipeline, run_id)
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_run_progress (
    pipeline text PRIMARY KEY,
    run_id text NOT NULL,
    at double precision NOT NULL,
    progress text NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_phases (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    pipeline text NOT NULL,
    generation integer NOT NULL,
    phase text NOT NULL,
    changed_at double precision NOT NULL,
    cause text NOT NULL,
    lag_s double precision
)""",
    """CREATE TABLE IF NOT EXISTS {schema}.backlog_skips (
    pipeline text NOT NULL,
    generation integer NOT NULL,
    bucket integer NOT NULL,
    from_offset bigint NOT NULL,
    to_offset bigint NOT NULL,
    skipped_at double precision NOT NULL
)""",
)


class PostgresSink(ResultTables):
    """Results, dead letters and late records in ``schema``, beside the state tables."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        table: str,
        pipeline: str,
        layout: ResultLayout,
        describe: str,
    ) -> None:
        self.pipeline = pipeline
        self.schema = schema
        self.table = table
        self.layout = layout
        self.describe = describe
        self._dsn = dsn
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        self._secrets = [str(s) for s in (dsn, password) if s]
        self._key = zlib.crc32(f"{schema}.{pipeline}".encode()) & 0x7FFF_FFFF
        #: The run lock's holder name and connection while ``run_lock`` holds it.
        self._lock: tuple[str, psycopg.Connection[Any]] | None = None
        self._db = self._connect(patience_s=OPEN_S)
        version = self._db.info.server_version
        if version < OLDEST_SERVER:
            self._db.close()
            raise SinkUnreachable(
                f"attributes.sink.dsn: the PostgreSQL sink {describe} runs PostgreSQL "
                f"{_version_name(version)}; it needs {OLDEST_SERVER // 10000} or later "
                "(its commits merge results with MERGE)"
            )
        self._call(self._create_tables, retry=True)

    # -- connections --------------------------------------------------------------------

    def _connect(
        self, application_name: str = "", patience_s: float = RECONNECT_S
    ) -> psycopg.Connection[Any]:
        name = application_name or f"backlog-dagster {self.pipeline}"
        try:
            for attempt in Retrying(
                retry=retry_if_exception(_is_lost_connection),
                stop=stop_after_delay(patience_s),
                wait=wait_exponential(multiplier=0.2, max=5),
                reraise=True,
            ):
                with attempt:
                    return psycopg.connect(
                        self._dsn,
                        autocommit=True,
                        connect_timeout=10,
                        application_name=name[:63],
                        options="-c TimeZone=UTC",
                    )
        except psycopg.Error as error:
            raise self._unreachable(error) from None
        raise AssertionError("unreachable")  # pragma: no cover: Retrying returns or raises

    def _call(self, work: Callable[[], T], retry: bool) -> T:
        """Run ``work`` on the connection; open it again when it was lost.

        With ``retry``, ``work`` is made again on the new connection (it must be safe to
        make twice); without, a connection lost during ``work`` raises ``SinkUnreachable``.
        """
        deadline = time.monotonic() + RECONNECT_S
        while True:
            if self._db.closed:
                self._db = self._connect()
            try:
                return work()
            except psycopg.OperationalError as error:
                if not (_is_lost_connection(error) or self._db.broken):
                    raise
                self._db.close()
                if not retry or time.monotonic() > deadline:
                    raise self._unreachable(error) from None

    def _unreachable(self, error: BaseException) -> SinkUnreachable:
        message = str(error).strip()
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return SinkUnreachable(
            f"attributes.sink.dsn: cannot reach the PostgreSQL sink {self.describe} "
            f"({type(error).__name__}: {message}); check that the server runs and the "
            "connection string is right"
        )

    @contextmanager
    def _writing(self) -> Iterator[psycopg.Cursor[Any]]:
        """A transaction that holds the pipeline's writer lock until it ends."""
        with self._db.transaction(), self._db.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_WRITER_LOCK, self._key))
            yield cursor

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- names --------------------------------------------------------------------------

    def _name(self, table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(table))

    # -- tables -------------------------------------------------------------------------

    def _add_joined_column(self) -> None:
        """``backlog_commits.joined`` in a database from before ``transform.join``."""
        found = self._db.execute(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND "
            "table_name = 'backlog_commits' AND column_name = 'joined'",
            (self.schema,),
        ).fetchone()
        if found is None:
            with self._writing() as cursor:
                cursor.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS joined text").format(
                        self._name("backlog_commits")
                    )
                )

    def _create_tables(self) -> None:
        """The schema and tables, unless they are all there: a sink opened every sensor
        tick then takes no lock, and needs no right to create anything."""
        tables = [
            "backlog_generations",
            "backlog_buckets",
            "backlog_commits",
            "backlog_heartbeats",
            "backlog_run_progress",
            "backlog_phases",
            "backlog_skips",
            self.dead_letter_table,
            *([self.late_table] if self.windowed else []),
        ]
        row = self._db.execute(
            "SELECT bool_and(to_regclass(format('%%I.%%I', %s::text, name)) IS NOT NULL) "
            "FROM unnest(%s::text[]) AS name",
            (self.schema, tables),
        ).fetchone()
        if row is not None and row[0]:
            self._add_joined_column()
            return
        schema = sql.Identifier(self.schema)
        with self._writing() as cursor:
            cursor.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
            for statement in _STATE_TABLES:
                cursor.execute(sql.SQL(statement).format(schema=schema))
            cursor.execute(
                sql.SQL(
                    'CREATE TABLE IF NOT EXISTS {} (bucket integer, "offset" bigint, '
                    'payload text, reason text, PRIMARY KEY (bucket, "offset"))'
                ).format(self._name(self.dead_letter_table))
            )
            if self.windowed:
                cursor.execute(
                    sql.SQL(
                        'CREATE TABLE IF NOT EXISTS {} (bucket integer, "offset" bigint, '
                        "event_time timestamptz, watermark timestamptz, "
                        'PRIMARY KEY (bucket, "offset"))'
                    ).format(self._name(self.late_table))
                )

    def _results_exist(self, cursor: psycopg.Cursor[Any]) -> bool:
        cursor.execute("SELECT to_regclass(%s)", (f'"{self.schema}"."{self.table}"',))
        row = cursor.fetchone()
        return row is not None and row[0] is not None

    def _create_results(self, cursor: psycopg.Cursor[Any], schema: pa.Schema) -> None:
        """The results table, typed after the first chunk's columns, and its view.

        The column types come from the data (the keys' types are the source's), so the
        table is made at the first commit; ``start_generation`` drops it, so a changed
        definition gets a table of its own shape.
        """
        layout = self.layout
        if layout.stateless:
            self._create_record_table(cursor, schema)
            return
        columns = [
            sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(_pg_type(schema.field(c).type)))
            for c in layout.stored_columns
        ]
        columns += [
            sql.SQL(
                "{} double precision GENERATED ALWAYS AS (CAST({} AS double precision)) STORED"
            ).format(sql.Identifier(d.name), sql.SQL(d.expression))
            for d in layout.derived
        ]
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in layout.keys)
        cursor.execute(
            sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({})) WITH (fillfactor = {})").format(
                self._name(self.table),
                sql.SQL(", ").join(columns),
                keys,
                sql.Literal(RESULTS_FILLFACTOR),
            )
        )
        cursor.execute(
            sql.SQL("CREATE VIEW {} AS SELECT {} FROM {}").format(
                self._name(self.view),
                sql.SQL(", ").join(sql.Identifier(c) for c in layout.visible_columns),
                self._name(self.table),
            )
        )

    def _create_record_table(self, cursor: psycopg.Cursor[Any], schema: pa.Schema) -> None:
        """A stateless pipeline's table: the records' columns, appended; indexed by the
        records' bucket and offset, not keyed (a function may make several rows of one)."""
        cursor.execute(
            sql.SQL("CREATE TABLE {} ({})").format(
                self._name(self.table),
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(_pg_type(f.type)))
                    for f in schema
                ),
            )
        )
        cursor.execute(
            sql.SQL("CREATE INDEX ON {} ({})").format(
                self._name(self.table), sql.SQL(", ").join(map(sql.Identifier, RECORD_ID))
            )
        )
        visible = visible_record_columns(schema.names)
        cursor.execute(
            sql.SQL("CREATE VIEW {} AS SELECT {} FROM {}").format(
                self._name(self.view),
                sql.SQL(", ").join(map(sql.Identifier, visible)),
                self._name(self.table),
            )
        )

    # -- generations and phases ---------------------------------------------------------

    def current_generation(self) -> Generation | None:
        return self._call(self._current_generation, retry=True)

    def _current_generation(self) -> Generation | None:
        with self._db.transaction(), self._db.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "SELECT generation, created_at, reason, definition FROM {} "
                    "WHERE pipeline = %s ORDER BY generation DESC LIMIT 1"
                ).format(self._name("backlog_generations")),
                (self.pipeline,),
            )
            row = cursor.fetchone()
            if row is None:
                return None
            number, created_at, reason, definition = row
            cursor.execute(
                sql.SQL(
                    "SELECT bucket, start_offset, marker, reached, event_time_us FROM {} "
                    "WHERE pipeline = %s AND generation = %s ORDER BY bucket"
                ).format(self._name("backlog_buckets")),
                (self.pipeline, number),
            )
            buckets = {r[0]: BucketState(*r) for r in cursor.fetchall()}
        return Generation(number, created_at, reason, definition, buckets)

    def start_generation(
        self, buckets: dict[int, tuple[int, int]], reason: str, definition: str
    ) -> Generation:
        def start() -> None:
            with self._writing() as cursor:
                number = self._new_generation(cursor, reason, definition)
                self._insert_buckets(cursor, number, buckets)
                self._insert_phase(cursor, number, "backlog", reason, None)
                cursor.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(self._name(self.view)))
                cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._name(self.table)))
                cursor.execute(sql.SQL("DELETE FROM {}").format(self._name(self.dead_letter_table)))
                if self.windowed:
                    cursor.execute(sql.SQL("DELETE FROM {}").format(self._name(self.late_table)))

        # Not made again after a lost connection: it would take a second generation.
        self._call(start, retry=False)
        generation = self.current_generation()
        assert generation is not None
        return generation

    def _new_generation(self, cursor: psycopg.Cursor[Any], reason: str, definition: str) -> int:
        cursor.execute(
            sql.SQL(
                "INSERT INTO {0} SELECT %s, coalesce(max(generation), 0) + 1, %s, %s, %s "
                "FROM {0} WHERE pipeline = %s RETURNING generation"
            ).format(self._name("backlog_generations")),
            (self.pipeline, time.time(), reason, definition, self.pipeline),
        )
        row = cursor.fetchone()
        assert row is not None
        return int(row[0])

    def _insert_buckets(
        self, cursor: psycopg.Cursor[Any], generation: int, buckets: dict[int, tuple[int, int]]
    ) -> None:
        cursor.executemany(
            sql.SQL(
                "INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, NULL) ON CONFLICT DO NOTHING"
            ).format(self._name("backlog_buckets")),
            [
                (self.pipeline, generation, bucket, start, marker, start)
                for bucket, (start, marker) in sorted(buckets.items())
            ],
        )

    def track_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> Generation:
        def track() -> None:
            with self._writing() as cursor:
                self._insert_buckets(cursor, generation, buckets)

        self._call(track, retry=True)
        current = self.current_generation()
        assert current is not None
        return current

    def continue_generation(
        self,
        markers: dict[int, int],
        reason: str,
        lag_s: float | None = None,
        if_phase: str | None = None,
    ) -> Generation | None:
        def go_on() -> bool:
            with self._writing() as cursor:
                if if_phase is not None and self._phase(cursor) != if_phase:
                    return False
                current = self._current_generation()
                assert current is not None, "continue_generation needs a generation to continue"
                number = self._new_generation(cursor, reason, current.definition)
                cursor.executemany(
                    sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s)").format(
                        self._name("backlog_buckets")
                    ),
                    [
                        (
                            self.pipeline,
                            number,
                            b.bucket,
                            b.reached,
                            max(b.reached, markers.get(b.bucket, b.reached)),
                            b.reached,
                            b.event_time_us,
                        )
                        for b in current.buckets.values()
                    ],
                )
                self._insert_phase(cursor, number, "backlog", reason, lag_s)
            return True

        # Made again only when guarded by the phase: the first attempt, if it landed,
        # changed the phase, so the second changes nothing.
        if not self._call(go_on, retry=if_phase is not None):
            return None
        return self.current_generation()

    def phase(self) -> str:
        def read() -> str:
            with self._db.cursor() as cursor:
                return self._phase(cursor)

        return self._call(read, retry=True)

    def _phase(self, cursor: psycopg.Cursor[Any]) -> str:
        cursor.execute(
            sql.SQL("SELECT phase FROM {} WHERE pipeline = %s ORDER BY id DESC LIMIT 1").format(
                self._name("backlog_phases")
            ),
            (self.pipeline,),
        )
        row = cursor.fetchone()
        return "backlog" if row is None else str(row[0])

    def record_phase(
        self, generation: int, phase: str, cause: str, lag_s: float | None = None
    ) -> bool:
        def record() -> bool:
            with self._writing() as cursor:
                if self._phase(cursor) == phase or self._newest(cursor) not in (None, generation):
                    return False
                self._insert_phase(cursor, generation, phase, cause, lag_s)
            return True

        return self._call(record, retry=True)

    def _newest(self, cursor: psycopg.Cursor[Any]) -> int | None:
        cursor.execute(
            sql.SQL("SELECT max(generation) FROM {} WHERE pipeline = %s").format(
                self._name("backlog_generations")
            ),
            (self.pipeline,),
        )
        row = cursor.fetchone()
        return None if row is None else row[0]

    def _insert_phase(
        self,
        cursor: psycopg.Cursor[Any],
        generation: int,
        phase: str,
        cause: str,
        lag_s: float | None,
    ) -> None:
        cursor.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, generation, phase, changed_at, cause, lag_s) "
                "VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(self._name("backlog_phases")),
            (self.pipeline, generation, phase, time.time(), cause, lag_s),
        )

    def phase_history(self) -> list[PhaseChange]:
        rows = self._read(
            sql.SQL(
                "SELECT generation, phase, changed_at, cause, lag_s FROM {} "
                "WHERE pipeline = %s ORDER BY id"
            ).format(self._name("backlog_phases")),
            (self.pipeline,),
        )
        return [PhaseChange(*row) for row in rows]

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
        def commit_once() -> bool:
            with self._writing() as cursor:
                cursor.execute(
                    sql.SQL(
                        "SELECT bucket, reached FROM {} WHERE pipeline = %s AND generation = %s"
                    ).format(self._name("backlog_buckets")),
                    (self.pipeline, generation),
                )
                held = dict(cursor.fetchall())
                if not check_commit(
                    self.pipeline, generation, self._newest(cursor), held, start, end
                ):
                    return False
                self._merge(cursor, results)
                for table, rows, columns in (
                    (self.late_table, late, _LATE_COLUMNS),
                    (self.dead_letter_table, dead_letters, DEAD_LETTER_COLUMNS),
                ):
                    if rows is not None and rows.num_rows:
                        self._copy(cursor, self._name(table), rows.select(columns))
                self._moved(cursor, generation, start, end, event_times or {}, joined)
            return True

        # Safe to make again: a commit that landed before the connection was lost is
        # recognised by the progress it moved, and changes nothing the second time.
        return self._call(commit_once, retry=True)

    def _moved(
        self,
        cursor: psycopg.Cursor[Any],
        generation: int,
        start: dict[int, int],
        end: dict[int, int],
        event_times: Mapping[int, int | None],
        joined: str | None,
    ) -> None:
        """A commit's progress: each bucket's new offset and latest event time, and the
        commit itself in ``backlog_commits``."""
        cursor.executemany(
            sql.SQL(
                "UPDATE {} SET reached = %s, event_time_us = "
                "greatest(event_time_us, %s) "
                "WHERE pipeline = %s AND generation = %s AND bucket = %s"
            ).format(self._name("backlog_buckets")),
            [
                (offset, event_times.get(b), self.pipeline, generation, b)
                for b, offset in end.items()
            ],
        )
        cursor.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, generation, phase, committed_at, records, "
                "joined) VALUES (%s, %s, %s, %s, %s, %s)"
            ).format(self._name("backlog_commits")),
            (
                self.pipeline,
                generation,
                self._phase(cursor),
                time.time(),
                sum(end[b] - start.get(b, end[b]) for b in end),
                joined,
            ),
        )

    def _merge(self, cursor: psycopg.Cursor[Any], results: pa.Table) -> None:
        """COPY the partial results into a temporary table, then merge them in one statement.

        MERGE rather than ``INSERT … ON CONFLICT``, which took about 40 % longer to merge
        100,000 keys the table holds (``bench/sinks.py``, BENCHMARKS.md). Where another
        transaction inserts one of the keys meanwhile, MERGE fails on the primary key
        where ON CONFLICT would wait and update; none can, as the pipeline's writers
        follow one another under its writer lock.
        """
        if results.num_rows == 0:
            return
        layout = self.layout
        exists = self._results_exist(cursor)
        if layout.stateless:
            if not exists:
                self._create_results(cursor, results.schema)
            self._copy(cursor, self._name(self.table), results)
            return
        if layout.sketches:
            held = self._held_sketches(cursor, results) if exists else pa.table({})
            results = merge_sketches(results, held, layout)
        stored = results.select(layout.stored_columns)
        if not exists:
            self._create_results(cursor, stored.schema)
        staging = sql.Identifier(f"staging_{self.table}")
        cursor.execute(
            sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
                staging,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(_pg_type(f.type)))
                    for f in stored.schema
                ),
            )
        )
        self._copy(cursor, staging, stored)
        updates = [_merge_sql(p.name, p.merge) for p in layout.partials]
        updates += [_merge_sql(e.name, "sketch") for e in layout.estimates]
        names = sql.SQL(", ").join(sql.Identifier(c) for c in layout.stored_columns)
        # The staging rows are named ``excluded``, as ON CONFLICT names the proposed row:
        # ``_merge_sql`` reads them so.
        cursor.execute(
            sql.SQL(
                "MERGE INTO {target} AS held USING {staging} AS excluded ON {same_keys} "
                "WHEN MATCHED THEN UPDATE SET {updates} "
                "WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})"
            ).format(
                target=self._name(self.table),
                staging=staging,
                same_keys=sql.SQL(" AND ").join(
                    sql.SQL("held.{0} = excluded.{0}").format(sql.Identifier(k))
                    for k in layout.keys
                ),
                updates=sql.SQL(", ").join(updates),
                names=names,
                values=sql.SQL(", ").join(
                    sql.SQL("excluded.{}").format(sql.Identifier(c)) for c in layout.stored_columns
                ),
            )
        )

    def _held_sketches(self, cursor: psycopg.Cursor[Any], results: pa.Table) -> pa.Table:
        """The keys and sketches the table holds for ``results``' keys."""
        keys = list(self.layout.keys)
        columns = [*keys, *(p.name for p in self.layout.sketches)]
        wanted = sql.Identifier(f"sketch_keys_{self.table}")
        cursor.execute(
            sql.SQL("CREATE TEMPORARY TABLE {} ({}) ON COMMIT DROP").format(
                wanted,
                sql.SQL(", ").join(
                    sql.SQL("{} {}").format(
                        sql.Identifier(k), sql.SQL(_pg_type(results.schema.field(k).type))
                    )
                    for k in keys
                ),
            )
        )
        self._copy(cursor, wanted, results.select(keys))
        cursor.execute(
            sql.SQL("SELECT {} FROM {} AS held JOIN {} USING ({})").format(
                sql.SQL(", ").join(sql.SQL("held.{}").format(sql.Identifier(c)) for c in columns),
                self._name(self.table),
                wanted,
                sql.SQL(", ").join(sql.Identifier(k) for k in keys),
            )
        )
        rows = cursor.fetchall()
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})

    def _copy(self, cursor: psycopg.Cursor[Any], target: sql.Composable, table: pa.Table) -> None:
        """Bulk load ``table`` into ``target`` (its columns, by name) as CSV."""
        for index, field in enumerate(table.schema):
            if pa.types.is_binary(field.type):  # bytea's hex text form
                hexed = [None if b is None else "\\x" + b.hex() for b in table[index].to_pylist()]
                table = table.set_column(index, field.name, pa.array(hexed, pa.string()))
        buffer = io.BytesIO()
        pa_csv.write_csv(table, buffer, pa_csv.WriteOptions(include_header=False))
        columns = sql.SQL(", ").join(sql.Identifier(c) for c in table.column_names)
        with cursor.copy(
            sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(target, columns)
        ) as copy:
            copy.write(buffer.getbuffer())

    def skip(self, generation: int, gaps: dict[int, tuple[int, int]]) -> None:
        def skip_once() -> None:
            with self._writing() as cursor:
                for bucket, (low, high) in sorted(gaps.items()):
                    # Recorded only when it moved the bucket, so made again it changes nothing.
                    cursor.execute(
                        sql.SQL(
                            "WITH moved AS (UPDATE {} SET reached = %s WHERE pipeline = %s "
                            "AND generation = %s AND bucket = %s AND reached = %s RETURNING 1) "
                            "INSERT INTO {} SELECT %s, %s, %s, %s, %s, %s FROM moved"
                        ).format(self._name("backlog_buckets"), self._name("backlog_skips")),
                        (
                            high,
                            self.pipeline,
                            generation,
                            bucket,
                            low,
                            self.pipeline,
                            generation,
                            bucket,
                            low,
                            high,
                            time.time(),
                        ),
                    )

        self._call(skip_once, retry=True)

    # -- reading ------------------------------------------------------------------------

    def _read(self, query: sql.Composed | sql.SQL, params: Any = ()) -> list[tuple[Any, ...]]:
        def read() -> list[tuple[Any, ...]]:
            with self._db.cursor() as cursor:
                cursor.execute(query, params)
                return cursor.fetchall()

        return self._call(read, retry=True)

    def _count(self, query: sql.Composed | sql.SQL, params: Any = ()) -> int:
        return int(self._read(query, params)[0][0] or 0)

    def is_empty(self) -> bool:
        def empty() -> bool:
            with self._db.transaction(), self._db.cursor() as cursor:
                tables = [self.dead_letter_table] + ([self.late_table] if self.windowed else [])
                if self._results_exist(cursor):
                    tables.append(self.table)
                for table in tables:
                    cursor.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(self._name(table)))
                    if cursor.fetchone():
                        return False
            return True

        return self._call(empty, retry=True)

    def read_results(self) -> pa.Table:
        """The visible columns; timestamps as ISO-8601 text in UTC, as every sink gives them."""

        def read() -> tuple[list[str], list[tuple[Any, ...]]]:
            with self._db.transaction(), self._db.cursor() as cursor:
                if not self._results_exist(cursor):
                    return list(self.layout.visible_columns), []
                cursor.execute(
                    "SELECT column_name, data_type FROM information_schema.columns WHERE "
                    "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                    (self.schema, self.view),
                )
                types = dict(cursor.fetchall())
                columns = list(types) if self.layout.stateless else self.layout.visible_columns
                cursor.execute(
                    sql.SQL("SELECT {} FROM {}").format(
                        sql.SQL(", ").join(
                            _iso(c) if types[c] == "timestamp with time zone" else sql.Identifier(c)
                            for c in columns
                        ),
                        self._name(self.view),
                    )
                )
                return list(columns), cursor.fetchall()

        columns, rows = self._call(read, retry=True)
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})

    def read_dead_letters(self) -> pa.Table:
        rows = self._read(
            sql.SQL('SELECT {} FROM {} ORDER BY bucket, "offset"').format(
                sql.SQL(", ").join(sql.Identifier(c) for c in DEAD_LETTER_COLUMNS),
                self._name(self.dead_letter_table),
            )
        )
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(DEAD_LETTER_COLUMNS)})

    def read_reference(self, table: str, columns: list[str]) -> pa.Table:
        held = [
            row[0]
            for row in self._read(
                sql.SQL(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s"
                ),
                (self.schema, table),
            )
        ]
        if not held:
            raise LookupError(f"no table {self.schema}.{table} in the sink's database")
        present = [c for c in columns if c in held]
        rows = self._read(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in present), self._name(table)
            )
        )
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(present)})

    def read_late(self) -> pa.Table:
        rows = self._read(
            sql.SQL('SELECT bucket, "offset", {}, {} FROM {}').format(
                _iso("event_time"), _iso("watermark"), self._name(self.late_table)
            )
        )
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(_LATE_COLUMNS)})

    def late_count(self) -> int:
        if not self.windowed:
            return 0
        return self._count(sql.SQL("SELECT count(*) FROM {}").format(self._name(self.late_table)))

    def dead_letter_count(self) -> int:
        return self._count(
            sql.SQL("SELECT count(*) FROM {}").format(self._name(self.dead_letter_table))
        )

    def skipped_records(self) -> int:
        return self._count(
            sql.SQL("SELECT sum(to_offset - from_offset) FROM {} WHERE pipeline = %s").format(
                self._name("backlog_skips")
            ),
            (self.pipeline,),
        )

    def switch_gap(self, generation: int) -> float | None:
        commits = self._name("backlog_commits")
        (gap,) = self._read(
            sql.SQL(
                "SELECT (SELECT min(committed_at) FROM {0} WHERE pipeline = %(p)s AND "
                "generation = %(g)s AND phase = 'realtime') - (SELECT max(committed_at) FROM "
                "{0} WHERE pipeline = %(p)s AND generation = %(g)s AND phase = 'backlog')"
            ).format(commits),
            {"p": self.pipeline, "g": generation},
        )[0]
        return None if gap is None else float(gap)

    # -- liveness and the run lock ------------------------------------------------------

    def beat(self, run_id: str) -> None:
        def beat_once() -> None:
            self._db.execute(
                sql.SQL(
                    "INSERT INTO {} VALUES (%s, %s, %s) "
                    "ON CONFLICT (pipeline, run_id) DO UPDATE SET at = excluded.at"
                ).format(self._name("backlog_heartbeats")),
                (self.pipeline, run_id, time.time()),
            )

        self._call(beat_once, retry=True)

    def last_beat(self, run_id: str) -> float | None:
        rows = self._read(
            sql.SQL("SELECT at FROM {} WHERE pipeline = %s AND run_id = %s").format(
                self._name("backlog_heartbeats")
            ),
            (self.pipeline, run_id),
        )
        return None if not rows else float(rows[0][0])

    def publish_progress(self, run_id: str, progress: Mapping[str, Any]) -> None:
        def publish_once() -> None:
            self._db.execute(
                sql.SQL(
                    "INSERT INTO {} VALUES (%s, %s, %s, %s) ON CONFLICT (pipeline) DO UPDATE "
                    "SET run_id = excluded.run_id, at = excluded.at, progress = excluded.progress"
                ).format(self._name("backlog_run_progress")),
                (self.pipeline, run_id, time.time(), json.dumps(progress)),
            )

        self._call(publish_once, retry=True)

    def published_progress(self) -> Mapping[str, Any] | None:
        rows = self._read(
            sql.SQL("SELECT progress FROM {} WHERE pipeline = %s").format(
                self._name("backlog_run_progress")
            ),
            (self.pipeline,),
        )
        return None if not rows else dict(json.loads(rows[0][0]))

    @contextmanager
    def run_lock(self, holder: str, wait_s: float) -> Iterator[bool]:
        """A session-level advisory lock on a connection of its own, named after the holder.

        The server lets go of it when that connection ends, including when the process
        holding it dies (and when the server restarts: ``keep_run_lock``).
        """
        name = f"{holder}, process {os.getpid()}"
        connection = self._connect(name, patience_s=OPEN_S)
        try:
            if not until(lambda: self._try_run_lock(connection), wait_s, 0.1):
                yield False
                return
            self._lock = (name, connection)
            yield True
        finally:
            if self._lock is not None:
                self._lock[1].close()
            self._lock = None
            connection.close()

    def keep_run_lock(self) -> bool:
        """Check the lock's connection; when the server lost it, open it again and take
        the lock again, unless another run took it in between."""
        if self._lock is None:
            return False
        name, connection = self._lock
        try:
            connection.execute("SELECT 1")
            return True
        except psycopg.OperationalError as error:
            if not _is_lost_connection(error):
                raise
        connection.close()
        connection = self._connect(name)
        self._lock = (name, connection)
        return self._try_run_lock(connection)

    def _try_run_lock(self, connection: psycopg.Connection[Any]) -> bool:
        row = connection.execute(
            "SELECT pg_try_advisory_lock(%s, %s)", (_RUN_LOCK, self._key)
        ).fetchone()
        return row is not None and bool(row[0])

    def holds_run_lock(self, holder: str) -> bool:
        # The holder's name, as the lock's connection gave it to the server.
        return self.lock_holder().startswith(f"{holder}, ")

    def lock_holder(self) -> str:
        rows = self._read(
            sql.SQL(
                "SELECT activity.application_name, activity.client_addr FROM pg_locks AS lock "
                "JOIN pg_stat_activity AS activity USING (pid) WHERE lock.locktype = 'advisory' "
                "AND lock.granted AND lock.classid = %s AND lock.objid = %s "
                "AND lock.objsubid = 2 AND lock.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            ),
            (_RUN_LOCK, self._key),
        )
        if not rows:
            return ""
        name, address = rows[0]
        return f"{name} on {address}" if address else str(name)


def _is_lost_connection(error: BaseException) -> bool:
    """The connection failed or ended (server restart, terminated backend), not the SQL."""
    return isinstance(error, psycopg.OperationalError) and (
        not isinstance(error, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable)
    )


def _iso(column: str) -> sql.Composed:
    """A timestamptz column as ISO-8601 text in UTC, to the microsecond."""
    text = """to_char({0} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS {0}"""
    return sql.SQL(text).format(sql.Identifier(column))


def _pg_type(kind: pa.DataType) -> str:
    """The PostgreSQL type of an Arrow type (Spark's result columns)."""
    if pa.types.is_timestamp(kind):
        return "timestamptz"
    if pa.types.is_decimal(kind):
        return f"numeric({kind.precision}, {kind.scale})"
    for test, name in (
        (pa.types.is_boolean, "boolean"),
        (pa.types.is_int8, "smallint"),
        (pa.types.is_int16, "smallint"),
        (pa.types.is_int32, "integer"),
        (pa.types.is_int64, "bigint"),
        (pa.types.is_float32, "real"),
        (pa.types.is_float64, "double precision"),
        (pa.types.is_date32, "date"),
        (pa.types.is_string, "text"),
        (pa.types.is_large_string, "text"),
        (pa.types.is_binary, "bytea"),
    ):
        if test(kind):
            return name
    raise TypeError(
        f"the PostgreSQL sink cannot store a result column of type {kind}; turn it into "
        "text in transform.columns, e.g. {name_json: to_json(name)}"
    )


def _merge_sql(column: str, merge: str) -> sql.Composed:
    """``count`` and ``sum`` add, ``min`` and ``max`` keep the extreme; NULL is no value."""
    mine = sql.SQL("held.{}").format(sql.Identifier(column))
    theirs = sql.SQL("excluded.{}").format(sql.Identifier(column))
    if merge == "sketch":  # merged already (``pipeline.sketches``)
        return sql.SQL("{} = {}").format(sql.Identifier(column), theirs)
    if merge == "add":
        combined = sql.SQL(
            "CASE WHEN {0} IS NULL THEN {1} WHEN {1} IS NULL THEN {0} ELSE {0} + {1} END"
        )
    else:  # LEAST and GREATEST leave NULLs out
        combined = sql.SQL("LEAST({0}, {1})" if merge == "min" else "GREATEST({0}, {1})")
    return sql.SQL("{} = {}").format(sql.Identifier(column), combined.format(mine, theirs))


def _version_name(server_version: int) -> str:
    """``140010`` as ``14.10``."""
    return f"{server_version // 10000}.{server_version % 10000}"
