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
import os
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import pyarrow as pa
import pyarrow.csv as pa_csv
import sqlalchemy as sa
from psycopg import sql
from sqlalchemy.pool import NullPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from backlog_dagster.pipeline.results import (
    RECORD_ID,
    ResultLayout,
    merge_sketches,
    visible_record_columns,
)
from backlog_dagster.sink.base import DEAD_LETTER_COLUMNS, ResultTables, SinkUnreachable
from backlog_dagster.sink.state import state_tables
from backlog_dagster.sink.stored import StoredSink
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


def open_postgres_sink(
    dsn: str, schema: str, table: str, pipeline: str, layout: ResultLayout, describe: str
) -> StoredSink:
    """The sink in ``schema`` of the database ``dsn`` names, its tables made if missing."""
    database = PostgresDatabase(dsn, schema, pipeline, describe)
    results = PostgresResults(schema, table, layout)
    return StoredSink(database, state_tables(schema), results, pipeline)


class PostgresDatabase:
    """A connection that is opened again when it is lost, the pipeline's writer lock
    around each writing transaction, and the run lock."""

    def __init__(self, dsn: str, schema: str, pipeline: str, describe: str) -> None:
        self.pipeline = pipeline
        self.describe = describe
        self._dsn = dsn
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        self._secrets = [str(s) for s in (dsn, password) if s]
        self._key = zlib.crc32(f"{schema}.{pipeline}".encode()) & 0x7FFF_FFFF
        #: The run lock's holder name and connection while ``run_lock`` holds it.
        self._lock: tuple[str, psycopg.Connection[Any]] | None = None
        self._patience_s = OPEN_S
        engine = sa.create_engine("postgresql+psycopg://", creator=self._open, poolclass=NullPool)
        self._connection: sa.Connection | None = self._connected(engine)
        self._engine = engine
        self._patience_s = RECONNECT_S
        version = _raw(self._connection).info.server_version
        if version < OLDEST_SERVER:
            self.close()
            raise SinkUnreachable(
                f"attributes.sink.dsn: the PostgreSQL sink {describe} runs PostgreSQL "
                f"{_version_name(version)}; it needs {OLDEST_SERVER // 10000} or later "
                "(its commits merge results with MERGE)"
            )

    def _open(self) -> psycopg.Connection[Any]:
        return self._connect(autocommit=False, patience_s=self._patience_s)

    def _connect(
        self, application_name: str = "", autocommit: bool = True, patience_s: float = RECONNECT_S
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
                        autocommit=autocommit,
                        connect_timeout=10,
                        application_name=name[:63],
                        options="-c TimeZone=UTC",
                    )
        except psycopg.Error as error:
            raise self._unreachable(error) from None
        raise AssertionError("unreachable")  # pragma: no cover: Retrying returns or raises

    def _connected(self, engine: sa.Engine) -> sa.Connection:
        try:
            return engine.connect()
        except sa.exc.DBAPIError as error:
            raise self._unreachable(error.orig) from None

    def run(self, work: Callable[[sa.Connection], T], *, write: bool, retry: bool) -> T:
        deadline = time.monotonic() + RECONNECT_S
        while True:
            if self._connection is None:
                self._connection = self._connected(self._engine)
            connection = self._connection
            try:
                with connection.begin():
                    if write:
                        lock = sa.func.pg_advisory_xact_lock(_WRITER_LOCK, self._key)
                        connection.execute(sa.select(lock))
                    return work(connection)
            except (psycopg.OperationalError, sa.exc.DBAPIError) as error:
                if not self._lost(connection, error):
                    raise
                self._drop()
                if not retry or time.monotonic() > deadline:
                    raise self._unreachable(error) from None

    @staticmethod
    def _lost(connection: sa.Connection, error: BaseException) -> bool:
        """Whether ``error`` ended the connection (server restart, terminated backend)
        rather than being the SQL's own."""
        if isinstance(error, sa.exc.DBAPIError):
            if error.connection_invalidated:
                return True
            error = error.orig or error
        if not isinstance(error, psycopg.OperationalError):
            return False
        return _is_lost_connection(error) or connection.invalidated or _raw(connection).broken

    def _drop(self) -> None:
        if self._connection is not None:
            try:
                self._connection.invalidate()
                self._connection.close()
            except (psycopg.Error, sa.exc.SQLAlchemyError):
                pass  # it is gone already
        self._connection = None

    def _unreachable(self, error: BaseException | None) -> SinkUnreachable:
        message = str(error).strip()
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return SinkUnreachable(
            f"attributes.sink.dsn: cannot reach the PostgreSQL sink {self.describe} "
            f"({type(error).__name__}: {message}); check that the server runs and the "
            "connection string is right"
        )

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
        self._connection = None

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
        def holder(connection: sa.Connection) -> str:
            cursor = _raw(connection).cursor()
            cursor.execute(
                "SELECT activity.application_name, activity.client_addr FROM pg_locks AS lock "
                "JOIN pg_stat_activity AS activity USING (pid) WHERE lock.locktype = 'advisory' "
                "AND lock.granted AND lock.classid = %s AND lock.objid = %s "
                "AND lock.objsubid = 2 AND lock.database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())",
                (_RUN_LOCK, self._key),
            )
            row = cursor.fetchone()
            if row is None:
                return ""
            name, address = row
            return f"{name} on {address}" if address else str(name)

        return self.run(holder, write=False, retry=True)


class PostgresResults(ResultTables):
    """Results, dead letters and late records in ``schema``, beside the state tables."""

    def __init__(self, schema: str, table: str, layout: ResultLayout) -> None:
        self.schema = schema
        self.table = table
        self.layout = layout

    def _name(self, table: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(table))

    def create(self, connection: sa.Connection) -> None:
        """The dead-letter and late tables, unless they are there (a sink opened every
        sensor tick then needs no right to create anything); the results table is made
        at the first commit, typed after its columns."""
        cursor = _cursor(connection)
        tables = [self.dead_letter_table, *([self.late_table] if self.windowed else [])]
        cursor.execute(
            "SELECT bool_and(to_regclass(format('%%I.%%I', %s::text, name)) IS NOT NULL) "
            "FROM unnest(%s::text[]) AS name",
            (self.schema, tables),
        )
        row = cursor.fetchone()
        if row is not None and row[0]:
            return
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

    def clear(self, connection: sa.Connection) -> None:
        """The results table is dropped: the next commit makes it again, in the shape of
        what the (maybe changed) definition produces."""
        cursor = _cursor(connection)
        cursor.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(self._name(self.view)))
        cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(self._name(self.table)))
        cursor.execute(sql.SQL("DELETE FROM {}").format(self._name(self.dead_letter_table)))
        if self.windowed:
            cursor.execute(sql.SQL("DELETE FROM {}").format(self._name(self.late_table)))

    def write(
        self,
        connection: sa.Connection,
        results: pa.Table,
        late: pa.Table | None,
        dead_letters: pa.Table | None,
    ) -> None:
        cursor = _cursor(connection)
        self._merge(cursor, results)
        for table, rows, columns in (
            (self.late_table, late, _LATE_COLUMNS),
            (self.dead_letter_table, dead_letters, DEAD_LETTER_COLUMNS),
        ):
            if rows is not None and rows.num_rows:
                self._copy(cursor, self._name(table), rows.select(columns))

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

    # -- reading ------------------------------------------------------------------------

    def _read(
        self, connection: sa.Connection, query: sql.Composed | sql.SQL, params: Any = ()
    ) -> list[tuple[Any, ...]]:
        cursor = _cursor(connection)
        cursor.execute(query, params)
        return cursor.fetchall()

    def _count(self, connection: sa.Connection, table: str) -> int:
        query = sql.SQL("SELECT count(*) FROM {}").format(self._name(table))
        return int(self._read(connection, query)[0][0] or 0)

    def is_empty(self, connection: sa.Connection) -> bool:
        cursor = _cursor(connection)
        tables = [self.dead_letter_table] + ([self.late_table] if self.windowed else [])
        if self._results_exist(cursor):
            tables.append(self.table)
        for table in tables:
            cursor.execute(sql.SQL("SELECT 1 FROM {} LIMIT 1").format(self._name(table)))
            if cursor.fetchone():
                return False
        return True

    def read_results(self, connection: sa.Connection) -> pa.Table:
        """The visible columns; timestamps as ISO-8601 text in UTC, as every sink gives them."""
        cursor = _cursor(connection)
        if not self._results_exist(cursor):
            return _table(self.layout.visible_columns, [])
        cursor.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE "
            "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
            (self.schema, self.view),
        )
        types = dict(cursor.fetchall())
        columns = list(types) if self.layout.stateless else list(self.layout.visible_columns)
        cursor.execute(
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(
                    _iso(c) if types[c] == "timestamp with time zone" else sql.Identifier(c)
                    for c in columns
                ),
                self._name(self.view),
            )
        )
        return _table(columns, cursor.fetchall())

    def read_dead_letters(self, connection: sa.Connection) -> pa.Table:
        rows = self._read(
            connection,
            sql.SQL('SELECT {} FROM {} ORDER BY bucket, "offset"').format(
                sql.SQL(", ").join(sql.Identifier(c) for c in DEAD_LETTER_COLUMNS),
                self._name(self.dead_letter_table),
            ),
        )
        return _table(DEAD_LETTER_COLUMNS, rows)

    def read_reference(self, connection: sa.Connection, table: str, columns: list[str]) -> pa.Table:
        held = [
            row[0]
            for row in self._read(
                connection,
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
            connection,
            sql.SQL("SELECT {} FROM {}").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in present), self._name(table)
            ),
        )
        return _table(present, rows)

    def read_late(self, connection: sa.Connection) -> pa.Table:
        rows = self._read(
            connection,
            sql.SQL('SELECT bucket, "offset", {}, {} FROM {}').format(
                _iso("event_time"), _iso("watermark"), self._name(self.late_table)
            ),
        )
        return _table(_LATE_COLUMNS, rows)

    def late_count(self, connection: sa.Connection) -> int:
        return self._count(connection, self.late_table) if self.windowed else 0

    def dead_letter_count(self, connection: sa.Connection) -> int:
        return self._count(connection, self.dead_letter_table)


def _raw(connection: sa.Connection) -> Any:
    """The psycopg connection under ``connection``: its COPY and ``psycopg.sql``."""
    return connection.connection.driver_connection


def _cursor(connection: sa.Connection) -> psycopg.Cursor[Any]:
    cursor: psycopg.Cursor[Any] = _raw(connection).cursor()
    return cursor


def _table(columns: Any, rows: list[tuple[Any, ...]]) -> pa.Table:
    return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})


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
