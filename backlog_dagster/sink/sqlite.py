"""The embedded sink: one SQLite database file, in WAL mode.

Why SQLite: it needs no server, and in WAL mode other processes (a dashboard, the
sensor, ``sqlite3`` on the command line) read a consistent snapshot *while* the
pipeline writes, never blocked by the writer (DuckDB, by contrast, locks its file
against other processes). Results and progress live in the same file, so one
transaction commits both.

The tables (results, their view, dead letters, late records, and the state tables with
markers, progress, phases, commits, heartbeats and skips) are described in one place:
``docs/sink-tables.md``.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import sqlalchemy as sa
from filelock import lock_descriptor
from sqlalchemy.pool import NullPool
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

from backlog_dagster.pipeline.results import (
    RECORD_ID,
    WINDOW_END,
    WINDOW_START,
    ResultLayout,
    merge_sketches,
    visible_record_columns,
)
from backlog_dagster.sink.base import DEAD_LETTER_COLUMNS, ResultTables, SinkUnreachable
from backlog_dagster.sink.state import state_tables
from backlog_dagster.sink.stored import StoredSink
from backlog_dagster.waiting import until

T = TypeVar("T")

#: The page cache of a sink's connection (KiB; SQLite's default is 2,000). A results
#: table is made ``WITHOUT ROWID``: one B-tree ordered by its keys, not a table and an
#: index on them, so a merge writes each row once. Measured, 100,000 keys upserted
#: into an empty table: 0.48 s as SQLite's defaults, 0.45 s with the table alone, 0.39 s
#: with both (the keys' pages stay cached); into a full one, 0.65 s and 0.58 s.
RESULTS_CACHE_KIB = 16_384


def open_sqlite_sink(
    path: Path | str, table: str, pipeline: str, layout: ResultLayout
) -> StoredSink:
    """The sink in the SQLite file ``path``, its tables made if missing."""
    database = SqliteDatabase(Path(path), pipeline)
    return StoredSink(database, state_tables(), SqliteResults(table, layout), pipeline)


def _to_wal(db: sqlite3.Connection) -> None:
    """Put the file in WAL mode. Two connections opening a new file at once may get
    "database is locked" here at once, without SQLite's busy timeout (measured: a run
    and a reader of its progress): such a connection tries again for a while."""
    for attempt in Retrying(
        retry=retry_if_exception(lambda e: "locked" in str(e)),
        wait=wait_fixed(0.05),
        stop=stop_after_delay(30),
        reraise=True,
    ):
        with attempt:
            db.execute("PRAGMA journal_mode=WAL")


class SqliteDatabase:
    """One connection to the file; a writing transaction is ``BEGIN IMMEDIATE`` (it
    waits for the file's other writer), a reading one a snapshot of the file."""

    def __init__(self, path: Path, pipeline: str) -> None:
        self.path = path
        self.pipeline = pipeline
        self._holding = False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine("sqlite://", creator=self._open, poolclass=NullPool)
            # SQLite's own BEGIN, not the sqlite3 module's (which begins only before
            # writes, deferred): the reading or the writing one ``run`` asks for.
            sa.event.listen(engine, "begin", _begin)
            self._connection = engine.connect()
        except (OSError, sqlite3.Error, sa.exc.DBAPIError) as error:
            raise SinkUnreachable(
                f"attributes.sink.path: cannot open the SQLite database {path} ({error}); "
                "make sure its folder exists or can be created, and is writable"
            ) from error

    def _open(self) -> sqlite3.Connection:
        # Spark calls foreachBatch functions on its own thread; one caller at a time.
        db = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        _to_wal(db)
        db.execute("PRAGMA synchronous=FULL")
        db.execute(f"PRAGMA cache_size={-RESULTS_CACHE_KIB}")
        return db

    def run(self, work: Callable[[sa.Connection], T], *, write: bool, retry: bool) -> T:
        """A file's connection is not lost: ``retry`` has nothing to make again."""
        self._connection.info["begin"] = "BEGIN IMMEDIATE" if write else "BEGIN"
        with self._connection.begin():
            return work(self._connection)

    def close(self) -> None:
        self._connection.close()

    @contextmanager
    def run_lock(self, holder: str, wait_s: float) -> Iterator[bool]:
        """An exclusive ``flock`` on ``.<pipeline>.lock`` beside the database file.

        The kernel drops it when the process dies however it dies, so a crash never
        leaves the pipeline locked. The file holds the holder's description.
        """
        path = self._lock_path
        descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            if not until(lambda: lock_descriptor(descriptor, blocking=False), wait_s, 0.1):
                yield False
                return
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, f"{holder}, process {os.getpid()}".encode(), 0)
            self._holding = True
            yield True
        finally:
            self._holding = False
            os.close(descriptor)

    def holds_run_lock(self, holder: str) -> bool:
        """Held (a shared ``flock`` is refused) and the file names ``holder``."""
        try:
            descriptor = os.open(self._lock_path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return self.lock_holder().startswith(f"{holder}, ")
            fcntl.flock(descriptor, fcntl.LOCK_UN)
            return False
        finally:
            os.close(descriptor)

    def keep_run_lock(self) -> bool:
        """A ``flock`` is only let go of by its holder: held here means kept."""
        return self._holding

    def lock_holder(self) -> str:
        try:
            return self._lock_path.read_text(errors="replace").strip()
        except OSError:
            return ""

    @property
    def _lock_path(self) -> Path:
        return self.path.with_name(f".{self.pipeline}.lock")


def _begin(connection: sa.Connection) -> None:
    connection.exec_driver_sql(connection.info.pop("begin", "BEGIN"))


def _raw(connection: sa.Connection) -> Any:
    """The sqlite3 connection under ``connection``, for statements of SQLite's own."""
    return connection.connection.driver_connection


class SqliteResults(ResultTables):
    """The results table, its view, the dead letters and late records, in the file."""

    def __init__(self, table: str, layout: ResultLayout) -> None:
        self.table = table
        self.layout = layout

    def create(self, connection: sa.Connection) -> None:
        db = _raw(connection)
        if not self.layout.stateless:  # a stateless table is made at the first commit
            db.execute(self._results_ddl())
            self._make_view(db, self.layout.visible_columns)
        db.execute(
            f"CREATE TABLE IF NOT EXISTS {_quote(self.dead_letter_table)} (bucket INTEGER, "
            '"offset" INTEGER, payload TEXT, reason TEXT, PRIMARY KEY (bucket, "offset"))'
        )
        if self.windowed:
            db.execute(
                f"CREATE TABLE IF NOT EXISTS {_quote(self.late_table)} (bucket INTEGER, "
                '"offset" INTEGER, event_time TEXT, watermark TEXT, PRIMARY KEY '
                '(bucket, "offset"))'
            )

    def clear(self, connection: sa.Connection) -> None:
        db = _raw(connection)
        if self.layout.stateless:  # the next commit makes it, in its records' shape
            db.execute(f"DROP VIEW IF EXISTS {_quote(self.view)}")
            db.execute(f"DROP TABLE IF EXISTS {_quote(self.table)}")
        else:
            db.execute(f"DELETE FROM {_quote(self.table)}")
        db.execute(f"DELETE FROM {_quote(self.dead_letter_table)}")
        if self.windowed:
            db.execute(f"DELETE FROM {_quote(self.late_table)}")

    def write(
        self,
        connection: sa.Connection,
        results: pa.Table,
        late: pa.Table | None,
        dead_letters: pa.Table | None,
    ) -> None:
        db = _raw(connection)
        self._merge(db, results)
        _insert(db, self.late_table, late, ("bucket", "offset", "event_time", "watermark"))
        _insert(db, self.dead_letter_table, dead_letters, DEAD_LETTER_COLUMNS)

    def _results_exist(self, db: sqlite3.Connection) -> bool:
        return (
            db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
            ).fetchone()
            is not None
        )

    def is_empty(self, connection: sa.Connection) -> bool:
        db = _raw(connection)
        tables = [self.dead_letter_table] + ([self.late_table] if self.windowed else [])
        if self._results_exist(db):
            tables.append(self.table)
        return not any(db.execute(f"SELECT 1 FROM {_quote(t)} LIMIT 1").fetchone() for t in tables)

    def dead_letter_count(self, connection: sa.Connection) -> int:
        return _count(_raw(connection), self.dead_letter_table)

    def read_dead_letters(self, connection: sa.Connection) -> pa.Table:
        rows = (
            _raw(connection)
            .execute(f'SELECT * FROM {_quote(self.dead_letter_table)} ORDER BY bucket, "offset"')
            .fetchall()
        )
        return _table(DEAD_LETTER_COLUMNS, rows)

    def late_count(self, connection: sa.Connection) -> int:
        return _count(_raw(connection), self.late_table) if self.windowed else 0

    def read_reference(self, connection: sa.Connection, table: str, columns: list[str]) -> pa.Table:
        db = _raw(connection)
        held = _columns(db, table)
        if not held:
            raise LookupError(f"no table {table} in the sink's SQLite file")
        present = [c for c in columns if c in held]
        rows = db.execute(
            f"SELECT {', '.join(_quote(c) for c in present)} FROM {_quote(table)}"
        ).fetchall()
        return _table(present, rows)

    def read_late(self, connection: sa.Connection) -> pa.Table:
        rows = _raw(connection).execute(f"SELECT * FROM {_quote(self.late_table)}").fetchall()
        return _table(("bucket", "offset", "event_time", "watermark"), rows)

    def read_results(self, connection: sa.Connection) -> pa.Table:
        db = _raw(connection)
        if not self._results_exist(db):
            return pa.table({c: [] for c in self.layout.visible_columns})
        columns = list(self.layout.visible_columns)
        if self.layout.stateless:
            columns = visible_record_columns(_columns(db, self.table))
        rows = db.execute(
            f"SELECT {', '.join(_quote(c) for c in columns)} FROM {_quote(self.table)}"
        ).fetchall()
        return _table(columns, rows)

    def _merge(self, db: sqlite3.Connection, results: pa.Table) -> None:
        if results.num_rows == 0:
            return
        layout = self.layout
        if layout.stateless:
            self._append_records(db, results)
            return
        if layout.sketches:
            held = self._held_sketches(db, results)
            results = merge_sketches(results, held, layout, _sqlite_values)
        stored = layout.stored_columns
        names = ", ".join(_quote(c) for c in stored)
        holes = ", ".join("?" for _ in stored)
        updates = ", ".join(
            [_merge_sql(p.name, p.merge) for p in layout.partials]
            + [_merge_sql(e.name, "sketch") for e in layout.estimates]
        )
        keys = ", ".join(_quote(k) for k in self.layout.keys)
        data = {c: _sqlite_values(results.column(c)) for c in stored}
        db.executemany(
            f"INSERT INTO {_quote(self.table)} ({names}) VALUES ({holes}) "
            f"ON CONFLICT ({keys}) DO UPDATE SET {updates}",
            zip(*(data[c] for c in stored), strict=True),
        )

    def _held_sketches(self, db: sqlite3.Connection, results: pa.Table) -> pa.Table:
        """The keys and sketches the table holds for ``results``' keys."""
        keys = self.layout.keys
        sketches = [p.name for p in self.layout.sketches]
        quoted = ", ".join(_quote(k) for k in keys)
        db.execute(f"CREATE TEMP TABLE IF NOT EXISTS _sketch_keys ({quoted})")
        db.execute("DELETE FROM _sketch_keys")
        db.executemany(
            f"INSERT INTO _sketch_keys VALUES ({', '.join('?' for _ in keys)})",
            zip(*(_sqlite_values(results.column(k)) for k in keys), strict=True),
        )
        columns = [*keys, *sketches]
        rows = db.execute(
            f"SELECT {', '.join(f'held.{_quote(c)}' for c in columns)} "
            f"FROM {_quote(self.table)} AS held JOIN _sketch_keys USING ({quoted})"
        ).fetchall()
        return _table(columns, rows)

    def _results_ddl(self) -> str:
        layout = self.layout
        columns = [_quote(c) for c in layout.stored_columns]
        columns += [
            f"{_quote(d.name)} GENERATED ALWAYS AS ({d.expression}) VIRTUAL" for d in layout.derived
        ]
        keys = ", ".join(_quote(k) for k in layout.keys)
        return (
            f"CREATE TABLE IF NOT EXISTS {_quote(self.table)} "
            f"({', '.join(columns)}, PRIMARY KEY ({keys})) WITHOUT ROWID"
        )

    def _make_view(self, db: sqlite3.Connection, visible: Sequence[str]) -> None:
        """The view over the results, unless it is there as it should be."""
        columns = [
            f"datetime({_quote(c)}) AS {_quote(c)}"
            if c in (WINDOW_START, WINDOW_END)
            else _quote(c)
            for c in visible
        ]
        view = (
            f"CREATE VIEW {_quote(self.view)} AS SELECT {', '.join(columns)} "
            f"FROM {_quote(self.table)}"
        )
        held = db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?", (self.view,)
        ).fetchone()
        if held is None or held[0] != view:  # new, or the definition changed
            db.execute(f"DROP VIEW IF EXISTS {_quote(self.view)}")
            db.execute(view)

    def _append_records(self, db: sqlite3.Connection, records: pa.Table) -> None:
        """A stateless pipeline's rows, appended; its table made at the first commit, in
        the records' shape, indexed (not keyed) by their bucket and offset."""
        names = ", ".join(_quote(c) for c in records.column_names)
        if not self._results_exist(db):
            db.execute(f"CREATE TABLE {_quote(self.table)} ({names})")
            db.execute(
                f"CREATE INDEX {_quote(self.table + '_record')} ON {_quote(self.table)} "
                f"({', '.join(_quote(c) for c in RECORD_ID)})"
            )
            self._make_view(db, visible_record_columns(records.column_names))
        holes = ", ".join("?" for _ in records.column_names)
        db.executemany(
            f"INSERT INTO {_quote(self.table)} ({names}) VALUES ({holes})",
            zip(*(_sqlite_values(c) for c in records.columns), strict=True),
        )


def _insert(
    db: sqlite3.Connection, table: str, rows: pa.Table | None, columns: Sequence[str]
) -> None:
    """Append ``rows``' ``columns`` (in the table's column order) to ``table``."""
    if rows is None or not rows.num_rows:
        return
    marks = ", ".join("?" for _ in columns)
    db.executemany(
        f"INSERT INTO {_quote(table)} VALUES ({marks})",
        zip(*(_sqlite_values(rows.column(c)) for c in columns), strict=True),
    )


def _count(db: sqlite3.Connection, table: str) -> int:
    (count,) = db.execute(f"SELECT count(*) FROM {_quote(table)}").fetchone()
    return int(count)


def _columns(db: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in db.execute(f"PRAGMA table_info({_quote(table)})")]


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> pa.Table:
    return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})


def _sqlite_values(column: pa.ChunkedArray) -> list[object]:
    """Python values SQLite stores; timestamps as ISO-8601 text in UTC, to the microsecond."""
    if pa.types.is_timestamp(column.type):
        column = pc.strftime(column, format="%Y-%m-%dT%H:%M:%SZ")
    return column.to_pylist()


def _merge_sql(column: str, merge: str) -> str:
    mine, theirs = _quote(column), f"excluded.{_quote(column)}"
    if merge == "sketch":  # merged already (``pipeline.sketches``)
        return f"{mine} = {theirs}"
    combined = {
        "add": f"{mine} + {theirs}",
        "min": f"min({mine}, {theirs})",
        "max": f"max({mine}, {theirs})",
    }[merge]
    return (
        f"{mine} = CASE WHEN {mine} IS NULL THEN {theirs} WHEN {theirs} IS NULL THEN {mine} "
        f"ELSE {combined} END"
    )


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'
