"""The sink contract, held by every sink alike: SQLite and PostgreSQL (a real server)."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import GenerationEnded, ProgressConflict, open_sink
from backlog_dagster.sink.postgres import RESULTS_FILLFACTOR
from tests.pipelines import CUSTOMER_TOTALS, REGION_MINUTES, pipeline
from tests.postgres import holding, wait_for_blocked_merge

PACKAGE = Path(__file__).resolve().parent.parent / "backlog_dagster"


def test_nothing_outside_the_sink_package_knows_its_implementations() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "sink"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "backlog_dagster.sink."
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: from {node.module} import …")
            if isinstance(node, ast.Name) and node.id in (
                "SqliteSink",
                "PipelineState",
                "PostgresSink",
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: names {node.id}")
    assert offenders == []


def on_sink(config: PipelineConfig, kind: str, dsn: str | None) -> PipelineConfig:
    if kind == "sqlite":
        return config
    sink = {"kind": "postgres", "dsn": dsn, "schema": "results", "table": config.sink.table}
    return PipelineConfig.model_validate({**config.model_dump(by_alias=True), "sink": sink})


@pytest.fixture(params=["sqlite", "postgres"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def dsn(kind: str, request: pytest.FixtureRequest) -> str | None:
    return request.getfixturevalue("postgres_dsn") if kind == "postgres" else None


def customer_partials(rows: list[tuple[int, float, int, float, float, float, int]]) -> pa.Table:
    """Partial results as the backlog hands them over: keys, then each partial column."""
    names = [
        "customer_id",
        "total_amount",
        "orders",
        "largest_amount",
        "smallest_amount",
        "_mean_amount_sum",
        "_mean_amount_count",
    ]
    columns = list(zip(*rows, strict=True))
    types = [pa.int64(), pa.float64(), pa.int64(), pa.float64(), pa.float64(), pa.float64()]
    types.append(pa.int64())
    return pa.table([pa.array(c, t) for c, t in zip(columns, types, strict=True)], names=names)


def test_partials_merge_and_a_commit_made_twice_counts_once(
    tmp_path: Path, kind: str, dsn: str | None
) -> None:
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS), kind, dsn)
    with open_sink(config) as sink:
        assert sink.is_empty() and sink.read_results().num_rows == 0
        generation = sink.start_generation({0: (0, 10), 1: (0, 10)}, "test", "d").number
        first = customer_partials([(1, 10.0, 2, 7.0, 3.0, 10.0, 2), (2, 5.0, 1, 5.0, 5.0, 5.0, 1)])
        assert sink.commit(generation, {0: 0, 1: 0}, {0: 4, 1: 3}, first, event_times={0: 5})
        second = customer_partials([(1, 9.0, 1, 9.0, 9.0, 9.0, 1)])
        assert sink.commit(generation, {0: 4, 1: 3}, {0: 5, 1: 3}, second, event_times={0: 9})
        # The same commit again (its outcome was lost with a connection): nothing changes.
        assert not sink.commit(generation, {0: 4, 1: 3}, {0: 5, 1: 3}, second)
        rows = sorted(sink.read_results().to_pylist(), key=lambda r: r["customer_id"])
        assert rows == [
            {
                "customer_id": 1,
                "total_amount": 19.0,
                "orders": 3,
                "largest_amount": 9.0,
                "smallest_amount": 3.0,
                "mean_amount": pytest.approx(19.0 / 3),
            },
            {
                "customer_id": 2,
                "total_amount": 5.0,
                "orders": 1,
                "largest_amount": 5.0,
                "smallest_amount": 5.0,
                "mean_amount": 5.0,
            },
        ]
        held = sink.current_generation()
        assert held is not None
        assert {b: s.reached for b, s in held.buckets.items()} == {0: 5, 1: 3}
        assert held.buckets[0].event_time_us == 9 and held.buckets[1].event_time_us is None
        with pytest.raises(ProgressConflict, match="another run may be writing"):
            sink.commit(generation, {0: 4}, {0: 6}, second)
        newer = sink.start_generation({0: (5, 10)}, "reset", "d").number
        with pytest.raises(GenerationEnded):
            sink.commit(generation, {0: 5, 1: 3}, {0: 6, 1: 3}, second)
        assert sink.is_empty() and sink.current_generation().number == newer  # type: ignore[union-attr]


def test_windows_late_records_and_dead_letters_read_alike(
    tmp_path: Path, kind: str, dsn: str | None
) -> None:
    config = on_sink(pipeline(tmp_path, REGION_MINUTES, name="region_minutes"), kind, dsn)
    minute = datetime(2026, 9, 21, 10, 0, tzinfo=timezone.utc)
    stamp = pa.timestamp("us", tz="UTC")
    results = pa.table(
        {
            "region": ["eu", "us"],
            "window_start": pa.array([minute, minute], stamp),
            "window_end": pa.array([minute.replace(minute=1)] * 2, stamp),
            "orders": pa.array([2, 1], pa.int64()),
            "total_amount": [3.5, 1.0],
        }
    )
    late = pa.table(
        {
            "bucket": pa.array([0], pa.int32()),
            "offset": pa.array([7], pa.int64()),
            "event_time": pa.array([minute], stamp),
            "watermark": pa.array([minute.replace(minute=5)], stamp),
        }
    )
    letters = pa.table(
        {
            "bucket": pa.array([1], pa.int32()),
            "offset": pa.array([3], pa.int64()),
            "payload": ['{"amount": "a lot", "note": "a, \\"quoted\\" one"}'],
            "reason": ["amount is not a number"],
        }
    )
    with open_sink(config) as sink:
        generation = sink.start_generation({0: (0, 10), 1: (0, 10)}, "test", "d").number
        sink.commit(generation, {0: 0}, {0: 8}, results, late=late, dead_letters=letters)
        sink.commit(generation, {0: 8}, {0: 9}, results.slice(0, 1))
        rows = sorted(sink.read_results().to_pylist(), key=lambda r: r["region"])
        assert rows[0] == {
            "region": "eu",
            "window_start": "2026-09-21T10:00:00.000000Z",
            "window_end": "2026-09-21T10:01:00.000000Z",
            "orders": 4,
            "total_amount": 7.0,
        }
        assert sink.read_late().to_pylist() == [
            {
                "bucket": 0,
                "offset": 7,
                "event_time": "2026-09-21T10:00:00.000000Z",
                "watermark": "2026-09-21T10:05:00.000000Z",
            }
        ]
        assert sink.read_dead_letters().to_pylist() == letters.to_pylist()
        assert sink.dead_letter_count() == 1 and not sink.is_empty()


def stateless_rows(offsets: list[int], notes: list[str | None]) -> pa.Table:
    """A stateless pipeline's rows as a run hands them over: the record's columns, its
    bucket and offset."""
    moment = datetime(2026, 9, 21, 10, 0, 0, 250_000, tzinfo=timezone.utc)
    return pa.table(
        {
            "order_id": pa.array([100 + o for o in offsets], pa.int64()),
            "note": notes,
            "event_time": pa.array([moment] * len(offsets), pa.timestamp("us", tz="UTC")),
            "_bucket": pa.array([0] * len(offsets), pa.int32()),
            "_offset": pa.array(offsets, pa.int64()),
        }
    )


def test_a_stateless_pipelines_rows_land_once_in_their_records_shape(
    tmp_path: Path, kind: str, dsn: str | None
) -> None:
    config = on_sink(pipeline(tmp_path, {"filter": "amount > 0"}, name="orders_kept"), kind, dsn)
    with open_sink(config) as sink:
        assert sink.is_empty() and sink.read_results().num_rows == 0
        generation = sink.start_generation({0: (0, 10)}, "test", "d").number
        # Offset 1 made two rows (a function may explode a record): both are kept.
        first = stateless_rows([0, 1, 1], ["a", None, 'b, "quoted"'])
        assert sink.commit(generation, {0: 0}, {0: 2}, first)
        assert not sink.commit(generation, {0: 0}, {0: 2}, first)  # made already
        assert sink.commit(generation, {0: 2}, {0: 3}, stateless_rows([2], ["c"]))
        with pytest.raises(ProgressConflict):
            sink.commit(generation, {0: 2}, {0: 4}, stateless_rows([3], ["d"]))
        rows = sorted(
            sink.read_results().to_pylist(), key=lambda r: (r["order_id"], r["note"] or "")
        )
        at = "2026-09-21T10:00:00.250000Z"
        assert rows == [
            {"order_id": 100, "note": "a", "event_time": at},
            {"order_id": 101, "note": None, "event_time": at},
            {"order_id": 101, "note": 'b, "quoted"', "event_time": at},
            {"order_id": 102, "note": "c", "event_time": at},
        ]
        assert not sink.is_empty()
        # A new generation starts from nothing, in the shape its records have.
        newer = sink.start_generation({0: (0, 10)}, "reset", "d").number
        assert sink.is_empty() and sink.read_results().num_rows == 0
        reshaped = stateless_rows([0], ["a"]).drop_columns(["note"])
        assert sink.commit(newer, {0: 0}, {0: 1}, reshaped)
        assert sink.read_results().column_names == ["order_id", "event_time"]


def test_the_run_lock_excludes_another_holder_and_a_dead_holder_lets_go(
    tmp_path: Path, kind: str, dsn: str | None
) -> None:
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS), kind, dsn)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD_THE_LOCK, config.model_dump_json(by_alias=True)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with open_sink(config) as sink:
            with sink.run_lock("second run", 0.3) as held:
                assert not held
                assert not sink.keep_run_lock()
            assert sink.lock_holder().startswith(f"backlog run, process {holder.pid}")
            # What a realtime query's commit asks, from whatever process it runs in.
            assert sink.holds_run_lock("backlog run")
            assert not sink.holds_run_lock("second run")
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait()
            # The server lets go when it notices the closed connection: moments, not at once.
            deadline = time.monotonic() + 10
            while sink.holds_run_lock("backlog run") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not sink.holds_run_lock("backlog run")
            with sink.run_lock("second run", 10) as held:
                assert held and sink.keep_run_lock()
                assert sink.holds_run_lock("second run")
                with open_sink(config) as other:
                    assert other.holds_run_lock("second run")
            assert not sink.keep_run_lock()
    finally:
        holder.kill()


_HOLD_THE_LOCK = """
import sys, time
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
with open_sink(PipelineConfig.model_validate_json(sys.argv[1])) as sink:
    with sink.run_lock("backlog run", 0) as held:
        print("held" if held else "refused", flush=True)
        time.sleep(600)
"""


# -- PostgreSQL only ---------------------------------------------------------------------


def test_postgres_results_have_proper_types_and_a_reader_sees_them_agree_with_progress(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """While commits go on, every read of results and progress in one snapshot agrees:
    the orders counted equal the offsets consumed. The results table leaves room on its
    pages for the merges' new row versions."""
    config = on_sink(
        pipeline(tmp_path, REGION_MINUTES, name="region_minutes"), "postgres", dsn=postgres_dsn
    )
    minute = datetime(2026, 9, 21, 10, 0, tzinfo=timezone.utc)
    stamp = pa.timestamp("us", tz="UTC")
    with open_sink(config) as sink:
        generation = sink.start_generation({0: (0, 1_000_000)}, "test", "d").number
        done, disagreements, reads = threading.Event(), [], [0]

        def read() -> None:
            with psycopg.connect(postgres_dsn, autocommit=True) as reader:
                while not done.is_set():
                    with reader.transaction():
                        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                        (reached,) = reader.execute(
                            "SELECT reached FROM results.backlog_buckets"
                        ).fetchone() or (0,)
                        (counted,) = reader.execute(
                            "SELECT coalesce(sum(orders), 0) FROM results.region_minutes"
                        ).fetchone()  # type: ignore[misc]
                    reads[0] += 1
                    if counted != reached:
                        disagreements.append((counted, reached))

        thread = threading.Thread(target=read)
        offset = 0
        for round_ in range(40):
            if round_ == 1:
                # The reader starts once the table exists. The first commit creates it, and
                # PostgreSQL lets a new table's transaction be seen in a snapshot a moment
                # before other sessions' catalog caches learn of the table: a reader there
                # would find progress but no table. That is the catalog's, not the commit's.
                thread.start()
            keys = 2_000
            results = pa.table(
                {
                    "region": [f"r{k}" for k in range(keys)],
                    "window_start": pa.array([minute] * keys, stamp),
                    "window_end": pa.array([minute.replace(minute=1)] * keys, stamp),
                    "orders": pa.array([round_ % 3 + 1] * keys, pa.int64()),
                    "total_amount": [1.0] * keys,
                }
            )
            step = keys * (round_ % 3 + 1)
            sink.commit(generation, {0: offset}, {0: offset + step}, results)
            offset += step
        done.set()
        thread.join()
        assert disagreements == [] and reads[0] > 10
    with psycopg.connect(postgres_dsn) as db:
        types = dict(
            db.execute(
                "SELECT column_name, data_type FROM information_schema.columns "
                "WHERE table_schema = 'results' AND table_name = 'region_minutes_view'"
            ).fetchall()
        )
        options = db.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'results.region_minutes'::regclass"
        ).fetchone()
    assert options == ([f"fillfactor={RESULTS_FILLFACTOR}"],)
    assert types == {
        "region": "text",
        "window_start": "timestamp with time zone",
        "window_end": "timestamp with time zone",
        "orders": "bigint",
        "total_amount": "double precision",
    }


def test_postgres_commit_survives_its_connection_terminated_mid_commit(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """``pg_terminate_backend`` while the commit waits between its bulk load and its
    merge: the sink opens a new connection and makes the commit once."""
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS), "postgres", dsn=postgres_dsn)
    with open_sink(config) as sink:
        generation = sink.start_generation({0: (0, 10)}, "test", "d").number
        first = customer_partials([(1, 1.0, 1, 1.0, 1.0, 1.0, 1)])
        sink.commit(generation, {0: 0}, {0: 1}, first)
        with holding(postgres_dsn, "customer_totals", schema="results") as blocker:
            committed: list[bool] = []
            thread = threading.Thread(
                target=lambda: committed.append(sink.commit(generation, {0: 1}, {0: 3}, first))
            )
            thread.start()
            pid = wait_for_blocked_merge(postgres_dsn, "customer_totals")
            blocker.execute("SELECT pg_terminate_backend(%s)", (pid,))
            time.sleep(0.5)
        # The lock is let go of: the commit, made again on a new connection, goes through.
        thread.join(timeout=60)
        assert committed == [True]
        (row,) = sink.read_results().to_pylist()
        assert row["orders"] == 2
        held = sink.current_generation()
        assert held is not None and held.buckets[0].reached == 3


def test_postgres_run_lock_is_taken_again_after_its_connection_was_lost(
    tmp_path: Path, postgres_dsn: str
) -> None:
    """A server restart or a terminated backend ends the lock's connection, and the
    server lets go of the lock: the run takes it again, unless another run took it."""
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS), "postgres", postgres_dsn)
    with open_sink(config) as sink, sink.run_lock("realtime run a", 0) as held:
        assert held

        def end_lock_connection() -> None:
            with psycopg.connect(postgres_dsn, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name LIKE 'realtime run a, %'"
                )

        end_lock_connection()
        time.sleep(0.5)
        assert not sink.holds_run_lock("realtime run a")
        assert sink.keep_run_lock() and sink.holds_run_lock("realtime run a")
        end_lock_connection()
        with open_sink(config) as other, other.run_lock("realtime run b", 5) as taken:
            assert taken
            assert not sink.keep_run_lock()


def test_postgres_older_than_the_sink_needs_is_refused_by_name(
    postgres_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server without MERGE is refused when the sink opens, saying which version it
    runs (here: the local server, with the oldest version the sink takes raised past it)."""
    from backlog_dagster.sink import SinkUnreachable, postgres

    with psycopg.connect(postgres_dsn) as connection:
        version = connection.info.server_version
    monkeypatch.setattr(postgres, "OLDEST_SERVER", version + 1)
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS), "postgres", postgres_dsn)
    with pytest.raises(SinkUnreachable) as error:
        open_sink(config)
    running = f"{version // 10000}.{version % 10000}"
    assert str(error.value).endswith(
        f"runs PostgreSQL {running}; it needs 15 or later (its commits merge results with MERGE)"
    )
    assert str(error.value).startswith("attributes.sink.dsn: the PostgreSQL sink ")


def test_postgres_password_is_in_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from backlog_dagster.sink import SinkUnreachable

    secret = "s3cret-Pa55"
    monkeypatch.setenv("RESULTS_DSN", f"postgresql://someone:{secret}@127.0.0.1:1/results")
    config = PipelineConfig.model_validate(
        {
            **pipeline(tmp_path, CUSTOMER_TOTALS).model_dump(by_alias=True),
            "sink": {"kind": "postgres", "dsn": {"env": "RESULTS_DSN"}, "table": "totals"},
        }
    )
    started = time.monotonic()
    with pytest.raises(SinkUnreachable) as error:
        open_sink(config)
    assert secret not in str(error.value) and "postgresql://someone" not in str(error.value)
    assert str(error.value).startswith(
        "attributes.sink.dsn: cannot reach the PostgreSQL sink $RESULTS_DSN:public.totals"
    )
    assert time.monotonic() - started < 30
