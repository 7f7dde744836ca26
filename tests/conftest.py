"""Shared fixtures: one real local SparkSession for the whole run, and small topics."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from backlog_dagster.log import Topic, create_topic
from backlog_dagster.tools.workload import (
    ORDERS_SCHEMA,
    ORDERS_TIMESTAMP,
    Customers,
    append_by_bucket,
    orders,
)

MakeTopic = Callable[..., Topic]

# The JVMs of the tests (the session below, every run's driver under `dagster dev`, the
# Spark Connect servers, standalone masters, workers and executors the tests start) live
# for seconds to minutes: the C1 compiler alone serves them and leaves the two cores to
# the work (three local Spark starts and small backlogs at once: 43 s each with the
# default tiered compilation, 32 s with C1 alone). Every JVM reads the variable, however
# it is launched. The project's own runs keep the JVM's defaults, which pay off over
# long backlogs.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")


#: The modules whose tests run the example project under `dagster dev` (each marked
#: ``dagster_dev``; ``pytest_collection_modifyitems`` checks the two agree).
DAGSTER_DEV_MODULES = ("tests/test_crash.py", "tests/test_switch.py", "tests/test_user_project.py")


#: The modules whose tests need no Spark (a fast minute in all): ``make test``
#: also runs them (``pytest -m unit``) on the oldest and the newest supported Python.
UNIT_MODULES = (
    "tests/test_chunks.py",
    "tests/test_component.py",
    "tests/test_install_checks.py",
    "tests/test_log.py",
    "tests/test_log_cli.py",
    "tests/test_pipeline_config.py",
    "tests/test_policy.py",
    "tests/test_scheduler.py",
    "tests/test_progress.py",
    "tests/test_sink_contract.py",
    "tests/test_source_contract.py",
    "tests/test_spark_session.py",
    "tests/test_switch_sensor.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests under `dagster dev` first (see ``pytest_xdist_make_scheduler``); the
    unit modules' tests marked ``unit``."""
    for item in items:
        if item.nodeid.split("::")[0] in UNIT_MODULES:
            item.add_marker(pytest.mark.unit)
    marked = {i.nodeid.split("::")[0] for i in items if i.get_closest_marker("dagster_dev")}
    assert marked <= set(DAGSTER_DEV_MODULES), f"add {marked} to DAGSTER_DEV_MODULES"
    items.sort(key=lambda item: item.get_closest_marker("dagster_dev") is None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The modules that run the example under `dagster dev` go first, each whole to one
    worker (one per worker while a worker is left for the rest), and the other tests to
    the other workers, and to the first ones once they are done.

    `make test` runs two workers, so both modules go to the first, one after the other.
    Measured on two cores: two workers 1,060 s; three (the two sessions at once) 1,127 s,
    the sessions each taking half as long again (load average 15); four, 869 s but with
    runs failing under the load. xdist's own ``--dist loadgroup`` would say so with
    ``xdist_group`` marks, but does not keep a group on one worker here
    (``tests/test_scheduler.py`` shows it, and fails once it does)."""
    from xdist.scheduler import LoadScheduling

    class DagsterDevFirst(LoadScheduling):
        def schedule(self) -> None:
            if self.collection is not None or not self._check_nodes_have_same_collection():
                super().schedule()
                return
            self.collection = next(iter(self.node2collection.values()))
            by_module: dict[str, list[int]] = {}
            for index, nodeid in enumerate(self.collection):
                module = nodeid.split("::")[0]
                if module in DAGSTER_DEV_MODULES:
                    by_module.setdefault(module, []).append(index)
            if not by_module or len(self.nodes) < 2:
                self.collection = None
                super().schedule()
                return
            if self.maxschedchunk is None:
                self.maxschedchunk = len(self.collection)
            heavy_nodes = self.nodes[: min(len(by_module), len(self.nodes) - 1)]
            heavy = {i for indexes in by_module.values() for i in indexes}
            self.pending[:] = [i for i in range(len(self.collection)) if i not in heavy]
            for turn, indexes in enumerate(by_module.values()):
                # A worker starts a test only once it holds the next one: one light test
                # after each module, so that the module starts now, not at the end.
                self.pending[:0] = indexes
                self._send_tests(heavy_nodes[turn % len(heavy_nodes)], len(indexes) + 1)
            light = self.pending
            others = self.nodes[len(heavy_nodes) :]
            for node in others:
                self._send_tests(node, max(2, len(light) // len(self.nodes) // 4))

    return DagsterDevFirst(config, log)


#: The logs that say what runs and servers did, by file name: when a test fails, the last
#: ``LOG_TAIL_LINES`` of each under its ``tmp_path`` go into its report (CI keeps nothing else).
TOLD_LOGS = ("dagster-dev.log", "connect-server.log")
LOG_TAIL_LINES = 60


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when == "call" and report.failed and isinstance(tmp_path, Path):
        for name in TOLD_LOGS:
            for log in sorted(tmp_path.rglob(name)):
                lines = log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
                report.sections.append(
                    (f"last lines of {log.relative_to(tmp_path)}", "\n".join(lines))
                )
    return report


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    from backlog_dagster.implementations import open_session

    session = open_session("local[2]", app_name="backlog-dagster-tests")
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def make_topic(tmp_path: Path) -> Iterator[MakeTopic]:
    """Create an orders topic with ``records`` records spread over ``buckets``."""
    opened: list[Topic] = []

    def make(records: int = 10_000, buckets: int = 4, name: str = "orders") -> Topic:
        topic = create_topic(
            tmp_path / name, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=buckets
        )
        opened.append(topic)
        append_orders(topic, records)
        return topic

    yield make
    for topic in opened:
        topic.close()


def append_orders(topic: Topic, records: int, seed: int = 3, live: bool = False) -> None:
    """Append ``records`` orders whose order ids continue the topic's count.

    Their times lie in a fixed 100 s of 2026-09-21, or with ``live`` in the last second.
    """
    if records == 0:
        return
    end_us = time.time_ns() // 1000 if live else 1_790_000_100_000_000
    start_us = end_us - (1_000_000 if live else 100_000_000)
    first = sum(b.latest for b in topic.bounds().values())
    rng = np.random.default_rng(seed + first)
    table, buckets = orders(
        rng,
        Customers.make(len(topic.buckets())),
        first,
        records,
        start_us,
        end_us,
    )
    append_by_bucket(topic, table, buckets)


def all_records(topic: Topic) -> pa.Table:
    """Every record the topic holds, read directly from the log (the test oracle)."""
    tables = []
    for bucket, bounds in topic.bounds().items():
        batches = list(topic.read(bucket, bounds.earliest, bounds.latest))
        if batches:
            table = pa.Table.from_batches(batches)
            tables.append(
                table.append_column("_bucket", pa.array([bucket] * len(table), pa.int32()))
            )
    return pa.concat_tables(tables)


@pytest.fixture
def postgres_dsn() -> Iterator[str]:
    """A fresh database on the machine's PostgreSQL server (started if down)."""
    from tests.postgres import ensure_server, fresh_database

    ensure_server()
    with fresh_database() as dsn:
        yield dsn
