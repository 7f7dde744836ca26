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
import json
import os
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from filelock import lock_descriptor
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed
from typing_extensions import Self

from backlog_dagster.pipeline.results import (
    RECORD_ID,
    WINDOW_END,
    WINDOW_START,
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

_STATE_TABLES = (
    """CREATE TABLE IF NOT EXISTS backlog_generations (
    pipeline TEXT NOT NULL,
    generation INTEGER NOT NULL,
    created_at REAL NOT NULL,
    reason TEXT NOT NULL,
    definition TEXT NOT NULL,
    PRIMARY KEY (pipeline, generation)
)""",
    """CREATE TABLE IF NOT EXISTS backlog_buckets (
    pipeline TEXT NOT NULL,
    generation INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    start_offset INTEGER NOT NULL,
    marker INTEGER NOT NULL,
    reached INTEGER NOT NULL,
    event_time_us INTEGER,
    PRIMARY KEY (pipeline, generation, bucket)
)""",
    """CREATE TABLE IF NOT EXISTS backlog_commits (
    pipeline TEXT NOT NULL,
    generation INTEGER NOT NULL,
    phase TEXT NOT NULL,
    committed_at REAL NOT NULL,
    records INTEGER NOT NULL,
    joined TEXT
)""",
    """CREATE TABLE IF NOT EXISTS backlog_heartbeats (
    pipeline TEXT NOT NULL,
    run_id TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (pipeline, run_id)
)""",
    """CREATE TABLE IF NOT EXISTS backlog_run_progress (
    pipeline TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    at REAL NOT NULL,
    progress TEXT NOT NULL
)""",
    """CREATE TABLE IF NOT EXISTS backlog_phases (
    pipeline TEXT NOT NULL,
    generation INTEGER NOT NULL,
    phase TEXT NOT NULL,
    changed_at REAL NOT NULL,
    cause TEXT NOT NULL,
    lag_s REAL
)""",
    """CREATE TABLE IF NOT EXISTS backlog_skips (
    pipeline TEXT NOT NULL,
    generation INTEGER NOT NULL,
    bucket INTEGER NOT NULL,
    from_offset INTEGER NOT NULL,
    to_offset INTEGER NOT NULL,
    skipped_at REAL NOT NULL
)""",
)


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


class PipelineState:
    """A pipeline's durable state in the sink's file: generations, progress, phases,
    commits, heartbeats and the run lock; ``SqliteSink`` adds the results beside it."""

    def __init__(self, path: Path | str, pipeline: str) -> None:
        self.path = Path(path)
        self.pipeline = pipeline
        self._holding = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Spark calls foreachBatch functions on its own thread; one caller at a time.
            self._db = sqlite3.connect(
                self.path, timeout=60, isolation_level=None, check_same_thread=False
            )
            _to_wal(self._db)
            self._db.execute("PRAGMA synchronous=FULL")
            with self._transaction():
                for statement in _STATE_TABLES:
                    self._db.execute(statement)
                commits = [row[1] for row in self._db.execute("PRAGMA table_info(backlog_commits)")]
                if "joined" not in commits:  # a database from before transform.join
                    self._db.execute("ALTER TABLE backlog_commits ADD COLUMN joined TEXT")
        except (OSError, sqlite3.Error) as error:
            raise SinkUnreachable(
                f"attributes.sink.path: cannot open the SQLite database {self.path} ({error}); "
                "make sure its folder exists or can be created, and is writable"
            ) from error

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def current_generation(self) -> Generation | None:
        row = self._db.execute(
            "SELECT generation, created_at, reason, definition FROM backlog_generations "
            "WHERE pipeline = ? ORDER BY generation DESC LIMIT 1",
            (self.pipeline,),
        ).fetchone()
        if row is None:
            return None
        number, created_at, reason, definition = row
        buckets = {
            row[0]: BucketState(*row)
            for row in self._db.execute(
                "SELECT bucket, start_offset, marker, reached, event_time_us FROM backlog_buckets "
                "WHERE pipeline = ? AND generation = ? ORDER BY bucket",
                (self.pipeline, number),
            )
        }
        return Generation(number, created_at, reason, definition, buckets)

    def track_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> Generation:
        with self._transaction():
            self._insert_buckets(generation, buckets)
        current = self.current_generation()
        assert current is not None
        return current

    def _insert_buckets(self, generation: int, buckets: dict[int, tuple[int, int]]) -> None:
        self._db.executemany(
            "INSERT INTO backlog_buckets VALUES (?, ?, ?, ?, ?, ?, NULL)",
            [
                (self.pipeline, generation, bucket, start, marker, start)
                for bucket, (start, marker) in sorted(buckets.items())
            ],
        )

    def _new_generation(self, reason: str, definition: str) -> int:
        (top,) = self._db.execute(
            "SELECT coalesce(max(generation), 0) FROM backlog_generations WHERE pipeline = ?",
            (self.pipeline,),
        ).fetchone()
        self._db.execute(
            "INSERT INTO backlog_generations VALUES (?, ?, ?, ?, ?)",
            (self.pipeline, top + 1, time.time(), reason, definition),
        )
        return int(top) + 1

    def continue_generation(
        self,
        markers: dict[int, int],
        reason: str,
        lag_s: float | None = None,
        if_phase: str | None = None,
    ) -> Generation | None:
        with self._transaction():
            if if_phase is not None and self.phase() != if_phase:
                return None
            current = self.current_generation()
            assert current is not None, "continue_generation needs a generation to continue"
            number = self._new_generation(reason, current.definition)
            self._db.executemany(
                "INSERT INTO backlog_buckets VALUES (?, ?, ?, ?, ?, ?, ?)",
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
            self._insert_phase(number, "backlog", reason, lag_s)
        generation = self.current_generation()
        assert generation is not None
        return generation

    def phase(self) -> str:
        """``backlog`` or ``realtime``: the durable phase flag (FLIP-309's isProcessingBacklog)."""
        row = self._db.execute(
            "SELECT phase FROM backlog_phases WHERE pipeline = ? ORDER BY rowid DESC LIMIT 1",
            (self.pipeline,),
        ).fetchone()
        return "backlog" if row is None else str(row[0])

    def record_phase(
        self, generation: int, phase: str, cause: str, lag_s: float | None = None
    ) -> bool:
        with self._transaction():
            current = self.current_generation()
            if self.phase() == phase or (current is not None and current.number != generation):
                return False
            self._insert_phase(generation, phase, cause, lag_s)
        return True

    def _insert_phase(self, generation: int, phase: str, cause: str, lag_s: float | None) -> None:
        self._db.execute(
            "INSERT INTO backlog_phases VALUES (?, ?, ?, ?, ?, ?)",
            (self.pipeline, generation, phase, time.time(), cause, lag_s),
        )

    def phase_history(self) -> list[PhaseChange]:
        return [
            PhaseChange(*row)
            for row in self._db.execute(
                "SELECT generation, phase, changed_at, cause, lag_s FROM backlog_phases "
                "WHERE pipeline = ? ORDER BY rowid",
                (self.pipeline,),
            )
        ]

    def skip(self, generation: int, gaps: dict[int, tuple[int, int]]) -> None:
        """Move past offsets ``{bucket: (from, to)}`` that retention removed, recording it."""
        with self._transaction():
            for bucket, (low, high) in sorted(gaps.items()):
                self._db.execute(
                    "UPDATE backlog_buckets SET reached = ? WHERE pipeline = ? AND "
                    "generation = ? AND bucket = ? AND reached = ?",
                    (high, self.pipeline, generation, bucket, low),
                )
                self._db.execute(
                    "INSERT INTO backlog_skips VALUES (?, ?, ?, ?, ?, ?)",
                    (self.pipeline, generation, bucket, low, high, time.time()),
                )

    def skipped_records(self) -> int:
        """Records skipped because retention removed them before they were read."""
        (count,) = self._db.execute(
            "SELECT coalesce(sum(to_offset - from_offset), 0) FROM backlog_skips "
            "WHERE pipeline = ?",
            (self.pipeline,),
        ).fetchone()
        return int(count)

    def beat(self, run_id: str) -> None:
        """A long-running run says it is alive (the sensor restarts runs that stop saying so)."""
        with self._transaction():
            self._db.execute(
                "INSERT INTO backlog_heartbeats VALUES (?, ?, ?) "
                "ON CONFLICT (pipeline, run_id) DO UPDATE SET at = excluded.at",
                (self.pipeline, run_id, time.time()),
            )

    def last_beat(self, run_id: str) -> float | None:
        row = self._db.execute(
            "SELECT at FROM backlog_heartbeats WHERE pipeline = ? AND run_id = ?",
            (self.pipeline, run_id),
        ).fetchone()
        return None if row is None else float(row[0])

    def publish_progress(self, run_id: str, progress: Mapping[str, Any]) -> None:
        with self._transaction():
            self._db.execute(
                "INSERT INTO backlog_run_progress VALUES (?, ?, ?, ?) ON CONFLICT (pipeline) "
                "DO UPDATE SET run_id = excluded.run_id, at = excluded.at, "
                "progress = excluded.progress",
                (self.pipeline, run_id, time.time(), json.dumps(progress)),
            )

    def published_progress(self) -> Mapping[str, Any] | None:
        row = self._db.execute(
            "SELECT progress FROM backlog_run_progress WHERE pipeline = ?", (self.pipeline,)
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def switch_gap(self, generation: int) -> float | None:
        """Seconds from the backlog's last commit to the realtime phase's first one."""
        (gap,) = self._db.execute(
            "SELECT (SELECT min(committed_at) FROM backlog_commits WHERE pipeline = :p AND "
            "generation = :g AND phase = 'realtime') - (SELECT max(committed_at) FROM "
            "backlog_commits WHERE pipeline = :p AND generation = :g AND phase = 'backlog')",
            {"p": self.pipeline, "g": generation},
        ).fetchone()
        return None if gap is None else float(gap)

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

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


#: The page cache of a sink's connection (KiB; SQLite's default is 2,000). A results
#: table is made ``WITHOUT ROWID``: one B-tree ordered by its keys, not a table and an
#: index on them, so a merge writes each row once. Measured, 100,000 keys upserted
#: into an empty table: 0.48 s as SQLite's defaults, 0.45 s with the table alone, 0.39 s
#: with both (the keys' pages stay cached); into a full one, 0.65 s and 0.58 s.
RESULTS_CACHE_KIB = 16_384


class SqliteSink(PipelineState, ResultTables):
    """The results table beside the state, merged and committed together."""

    def __init__(self, path: Path | str, table: str, pipeline: str, layout: ResultLayout) -> None:
        super().__init__(path, pipeline)
        self.table = table
        self.layout = layout
        self._db.execute(f"PRAGMA cache_size={-RESULTS_CACHE_KIB}")
        with self._transaction():
            if not layout.stateless:  # a stateless table is made at the first commit
                self._db.execute(self._results_ddl())
                self._make_view(layout.visible_columns)
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {_quote(self.dead_letter_table)} (bucket INTEGER, "
                '"offset" INTEGER, payload TEXT, reason TEXT, PRIMARY KEY (bucket, "offset"))'
            )
            if self.windowed:
                self._db.execute(
                    f"CREATE TABLE IF NOT EXISTS {_quote(self.late_table)} (bucket INTEGER, "
                    '"offset" INTEGER, event_time TEXT, watermark TEXT, PRIMARY KEY '
                    '(bucket, "offset"))'
                )

    def start_generation(
        self, buckets: dict[int, tuple[int, int]], reason: str, definition: str
    ) -> Generation:
        with self._transaction():
            number = self._new_generation(reason, definition)
            self._insert_buckets(number, buckets)
            self._insert_phase(number, "backlog", reason, None)
            if self.layout.stateless:  # the next commit makes it, in its records' shape
                self._db.execute(f"DROP VIEW IF EXISTS {_quote(self.view)}")
                self._db.execute(f"DROP TABLE IF EXISTS {_quote(self.table)}")
            else:
                self._db.execute(f"DELETE FROM {_quote(self.table)}")
            self._db.execute(f"DELETE FROM {_quote(self.dead_letter_table)}")
            if self.windowed:
                self._db.execute(f"DELETE FROM {_quote(self.late_table)}")
        generation = self.current_generation()
        assert generation is not None
        return generation

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
        with self._transaction():
            (newest,) = self._db.execute(
                "SELECT max(generation) FROM backlog_generations WHERE pipeline = ?",
                (self.pipeline,),
            ).fetchone()
            held = dict(
                self._db.execute(
                    "SELECT bucket, reached FROM backlog_buckets "
                    "WHERE pipeline = ? AND generation = ?",
                    (self.pipeline, generation),
                ).fetchall()
            )
            if not check_commit(self.pipeline, generation, newest, held, start, end):
                return False
            self._merge(results)
            self._insert(self.late_table, late, ("bucket", "offset", "event_time", "watermark"))
            self._insert(self.dead_letter_table, dead_letters, DEAD_LETTER_COLUMNS)
            times = event_times or {}
            self._db.executemany(
                "UPDATE backlog_buckets SET reached = ?, event_time_us = "
                "max(coalesce(event_time_us, ?), coalesce(?, event_time_us)) "
                "WHERE pipeline = ? AND generation = ? AND bucket = ?",
                [
                    (offset, times.get(b), times.get(b), self.pipeline, generation, b)
                    for b, offset in end.items()
                ],
            )
            self._db.execute(
                "INSERT INTO backlog_commits "
                "(pipeline, generation, phase, committed_at, records, joined) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    self.pipeline,
                    generation,
                    self.phase(),
                    time.time(),
                    sum(end[b] - start.get(b, end[b]) for b in end),
                    joined,
                ),
            )
        return True

    def _insert(self, table: str, rows: pa.Table | None, columns: Sequence[str]) -> None:
        """Append ``rows``' ``columns`` (in the table's column order) to ``table``."""
        if rows is None or not rows.num_rows:
            return
        marks = ", ".join("?" for _ in columns)
        self._db.executemany(
            f"INSERT INTO {_quote(table)} VALUES ({marks})",
            zip(*(_sqlite_values(rows.column(c)) for c in columns), strict=True),
        )

    def _results_exist(self) -> bool:
        return (
            self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (self.table,)
            ).fetchone()
            is not None
        )

    def is_empty(self) -> bool:
        tables = [self.dead_letter_table] + ([self.late_table] if self.windowed else [])
        if self._results_exist():
            tables.append(self.table)
        return not any(
            self._db.execute(f"SELECT 1 FROM {_quote(t)} LIMIT 1").fetchone() for t in tables
        )

    def dead_letter_count(self) -> int:
        (count,) = self._db.execute(
            f"SELECT count(*) FROM {_quote(self.dead_letter_table)}"
        ).fetchone()
        return int(count)

    def read_dead_letters(self) -> pa.Table:
        rows = self._db.execute(
            f'SELECT * FROM {_quote(self.dead_letter_table)} ORDER BY bucket, "offset"'
        ).fetchall()
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(DEAD_LETTER_COLUMNS)})

    def late_count(self) -> int:
        if not self.windowed:
            return 0
        (count,) = self._db.execute(f"SELECT count(*) FROM {_quote(self.late_table)}").fetchone()
        return int(count)

    def read_reference(self, table: str, columns: list[str]) -> pa.Table:
        held = [row[1] for row in self._db.execute(f"PRAGMA table_info({_quote(table)})")]
        if not held:
            raise LookupError(f"no table {table} in {self.path}")
        present = [c for c in columns if c in held]
        rows = self._db.execute(
            f"SELECT {', '.join(_quote(c) for c in present)} FROM {_quote(table)}"
        ).fetchall()
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(present)})

    def read_late(self) -> pa.Table:
        rows = self._db.execute(f"SELECT * FROM {_quote(self.late_table)}").fetchall()
        columns = ("bucket", "offset", "event_time", "watermark")
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})

    def read_results(self) -> pa.Table:
        if not self._results_exist():
            return pa.table({c: [] for c in self.layout.visible_columns})
        columns = list(self.layout.visible_columns)
        if self.layout.stateless:
            held = [row[1] for row in self._db.execute(f"PRAGMA table_info({_quote(self.table)})")]
            columns = visible_record_columns(held)
        rows = self._db.execute(
            f"SELECT {', '.join(_quote(c) for c in columns)} FROM {_quote(self.table)}"
        ).fetchall()
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})

    def _merge(self, results: pa.Table) -> None:
        if results.num_rows == 0:
            return
        layout = self.layout
        if layout.stateless:
            self._append_records(results)
            return
        if layout.sketches:
            results = merge_sketches(results, self._held_sketches(results), layout, _sqlite_values)
        stored = layout.stored_columns
        names = ", ".join(_quote(c) for c in stored)
        holes = ", ".join("?" for _ in stored)
        updates = ", ".join(
            [_merge_sql(p.name, p.merge) for p in layout.partials]
            + [_merge_sql(e.name, "sketch") for e in layout.estimates]
        )
        keys = ", ".join(_quote(k) for k in self.layout.keys)
        data = {c: _sqlite_values(results.column(c)) for c in stored}
        self._db.executemany(
            f"INSERT INTO {_quote(self.table)} ({names}) VALUES ({holes}) "
            f"ON CONFLICT ({keys}) DO UPDATE SET {updates}",
            zip(*(data[c] for c in stored), strict=True),
        )

    def _held_sketches(self, results: pa.Table) -> pa.Table:
        """The keys and sketches the table holds for ``results``' keys."""
        keys = self.layout.keys
        sketches = [p.name for p in self.layout.sketches]
        quoted = ", ".join(_quote(k) for k in keys)
        self._db.execute(f"CREATE TEMP TABLE IF NOT EXISTS _sketch_keys ({quoted})")
        self._db.execute("DELETE FROM _sketch_keys")
        self._db.executemany(
            f"INSERT INTO _sketch_keys VALUES ({', '.join('?' for _ in keys)})",
            zip(*(_sqlite_values(results.column(k)) for k in keys), strict=True),
        )
        columns = [*keys, *sketches]
        rows = self._db.execute(
            f"SELECT {', '.join(f'held.{_quote(c)}' for c in columns)} "
            f"FROM {_quote(self.table)} AS held JOIN _sketch_keys USING ({quoted})"
        ).fetchall()
        return pa.table({c: [row[i] for row in rows] for i, c in enumerate(columns)})

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

    def _make_view(self, visible: Sequence[str]) -> None:
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
        held = self._db.execute(
            "SELECT sql FROM sqlite_master WHERE type = 'view' AND name = ?", (self.view,)
        ).fetchone()
        if held is None or held[0] != view:  # new, or the definition changed
            self._db.execute(f"DROP VIEW IF EXISTS {_quote(self.view)}")
            self._db.execute(view)

    def _append_records(self, records: pa.Table) -> None:
        """A stateless pipeline's rows, appended; its table made at the first commit, in
        the records' shape, indexed (not keyed) by their bucket and offset."""
        names = ", ".join(_quote(c) for c in records.column_names)
        if not self._results_exist():
            self._db.execute(f"CREATE TABLE {_quote(self.table)} ({names})")
            self._db.execute(
                f"CREATE INDEX {_quote(self.table + '_record')} ON {_quote(self.table)} "
                f"({', '.join(_quote(c) for c in RECORD_ID)})"
            )
            self._make_view(visible_record_columns(records.column_names))
        holes = ", ".join("?" for _ in records.column_names)
        self._db.executemany(
            f"INSERT INTO {_quote(self.table)} ({names}) VALUES ({holes})",
            zip(*(_sqlite_values(c) for c in records.columns), strict=True),
        )


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *exc: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


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
