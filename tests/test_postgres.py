"""The example on PostgreSQL, end to end: Dagster's storage and both pipelines' sinks.

One `dagster dev` session whose instance keeps runs, events and sensor ticks in
PostgreSQL (``deploy/dagster-postgres.yaml``) runs a copy of the example whose sinks are
PostgreSQL ones, on a server of the test's own (so the test may restart it without
disturbing other tests). Through backlog, switch and realtime it strikes three times,
and each time the pipelines recover by themselves with nothing lost or doubled:

1. customer_totals' realtime run is SIGKILLed while its commit has bulk loaded a
   micro-batch and waits to merge it (the test holds a lock on the results table);
2. region_minutes' realtime connection is ended with ``pg_terminate_backend`` at the same
   point of its commit;
3. the sink's server is restarted while both realtime runs go on.

Then both results equal the oracle over the log.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import psycopg
import pytest

from backlog_dagster.components.dev_server import (
    POSTGRES_INSTANCE,
    copy_project,
    dagster_dev,
    on_postgres,
    postgres_url,
)
from backlog_dagster.components.pipeline import with_paths_under
from backlog_dagster.log import Topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic, append_orders
from tests.dagster_server import ROOT, kill_run_worker
from tests.pipelines import (
    assert_same,
    customer_totals_oracle,
    records_not_late,
    records_up_to,
    region_minutes_oracle,
)
from tests.postgres import ensure_server, fresh_database, private_server, wait_for_blocked_merge

SINK_DSN = "BACKLOG_TEST_SINK_DSN"


def _lighter(attributes: dict[str, object]) -> bool:
    """On PostgreSQL, and lighter for two cores: no standby realtime runs (two fewer
    Spark drivers), and a killed run noticed after 15 s."""
    on_postgres("example", SINK_DSN)(attributes)
    switch = attributes.setdefault("switch", {})
    assert isinstance(switch, dict)
    switch.update({"heartbeat_timeout": "15s", "standby": False})
    return True


@pytest.fixture
def servers() -> Iterator[tuple[str, str, object]]:
    """Dagster's database on the machine's server; the sinks' on a private one."""
    ensure_server()
    with (
        fresh_database() as dagster_dsn,
        private_server() as sink_server,
        fresh_database(sink_server.dsn) as sink_dsn,
    ):
        yield dagster_dsn, sink_dsn, sink_server


@pytest.mark.dagster_dev
@pytest.mark.timeout(1200)
def test_the_example_on_postgresql_recovers_from_kills_and_a_server_restart(
    make_topic: MakeTopic,
    tmp_path: Path,
    servers: tuple[str, str, object],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dagster_dsn, sink_dsn, sink_server = servers
    topic = make_topic(records=50_000, buckets=4, name="example/orders")
    project, home = tmp_path / "project", tmp_path / "dagster_home"
    copy_project(ROOT, project, _lighter)
    home.mkdir()
    shutil.copy(ROOT / POSTGRES_INSTANCE, home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres_url(dagster_dsn))
    monkeypatch.setenv(SINK_DSN, sink_dsn)
    configs = {
        name: with_paths_under(
            load_pipeline(project / "definitions" / "defs" / name / "defs.yaml"), tmp_path
        )
        for name in ("customer_totals", "region_minutes")
    }

    stop = threading.Event()
    producer = threading.Thread(target=_produce, args=(topic.path, stop), daemon=True)
    with dagster_dev(project, home, tmp_path):
        instance = dg.DagsterInstance.from_config(str(home))
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
        producer.start()
        try:
            for config in configs.values():
                _wait_until(lambda c=config: _phase(c) == "realtime", 600, f"{config.name} live")

            # 1. SIGKILL between the bulk load and the merge.
            with _holding(sink_dsn, "customer_totals"):
                wait_for_blocked_merge(sink_dsn, "customer_totals")
                customer_run = _started_run(instance, "customer_totals_realtime_job")
                kill_run_worker(instance, customer_run)
            _wait_until(
                lambda: _started_run(instance, "customer_totals_realtime_job", customer_run),
                300,
                "customer_totals' realtime run to be restarted",
            )

            # 2. The connection ended mid-commit: the run goes on, on a new connection.
            with _holding(sink_dsn, "region_minutes") as holder:
                pid = wait_for_blocked_merge(sink_dsn, "region_minutes")
                region_run = _started_run(instance, "region_minutes_realtime_job")
                holder.execute("SELECT pg_terminate_backend(%s)", (pid,))
            _advances(configs["region_minutes"])
            assert _started_run(instance, "region_minutes_realtime_job") == region_run

            # 3. The sink's server restarts while both realtime runs go on.
            sink_server.restart()  # type: ignore[attr-defined]
            for config in configs.values():
                _advances(config)
        finally:
            stop.set()
            producer.join()
        for config in configs.values():
            _wait_until(
                lambda c=config: _reached(c) == Topic(topic.path).latest_offsets(),
                300,
                f"{config.name} to catch up",
            )
        instance.dispose()
    _assert_equal_the_oracles(configs, topic.path)


def _produce(path: Path, stop: threading.Event) -> None:
    """Live records, 500 every second, until told to stop."""
    with Topic(path) as topic:
        while not stop.is_set():
            append_orders(topic, 500, seed=int(time.time()), live=True)
            stop.wait(1)


def _phase(config: PipelineConfig) -> str:
    try:
        with open_sink(config) as sink:
            return sink.phase()
    except Exception:
        return "unknown"


def _reached(config: PipelineConfig) -> dict[int, int]:
    with open_sink(config) as sink:
        generation = sink.current_generation()
        return {} if generation is None else {b: s.reached for b, s in generation.buckets.items()}


def _advances(config: PipelineConfig) -> None:
    """Its progress moves on within a minute."""
    before = sum(_reached(config).values())
    _wait_until(lambda: sum(_reached(config).values()) > before, 120, f"{config.name} to go on")


def _started_run(instance: dg.DagsterInstance, job: str, other_than: str = "") -> str:
    runs = [
        r.run_id
        for r in instance.get_runs(filters=dg.RunsFilter(job_name=job))
        if r.status == dg.DagsterRunStatus.STARTED and r.run_id != other_than
    ]
    return runs[0] if runs else ""


class _holding:
    """Hold an exclusive lock on a results table: a commit then waits, its bulk load
    done, at its merge. The lock is let go of when the block ends."""

    def __init__(self, dsn: str, table: str) -> None:
        self.dsn, self.table = dsn, table

    def __enter__(self) -> psycopg.Connection[tuple[object, ...]]:
        self.connection = psycopg.connect(self.dsn)
        self.connection.execute(f'LOCK TABLE example."{self.table}" IN EXCLUSIVE MODE')
        return self.connection

    def __exit__(self, *exc: object) -> None:
        self.connection.rollback()
        self.connection.close()


def _wait_until(condition, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def _assert_equal_the_oracles(configs: dict[str, PipelineConfig], topic_path: Path) -> None:
    with Topic(topic_path) as topic:
        with open_sink(configs["customer_totals"]) as sink:
            results = sink.read_results().to_pandas()
        oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
        columns = ["customer_id", "total_amount", "orders", "largest_amount"]
        assert_same(results, oracle[columns], ["customer_id"])
        with open_sink(configs["region_minutes"]) as sink:
            results = sink.read_results().to_pandas()
            late = {(r["bucket"], r["offset"]) for r in sink.read_late().to_pylist()}
        assert_same(
            results,
            region_minutes_oracle(records_not_late(topic, late)),
            ["region", "window_start"],
        )
