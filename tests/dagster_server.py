"""A real ``dagster dev`` (webserver, daemon, code server) on loopback, for tests."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import dagster as dg
from dagster_graphql import DagsterGraphQLClient

from backlog_dagster.components.observations import finished_buckets
from backlog_dagster.tools import dev_server

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def dagster_dev(home: Path, data: Path, project: Path = ROOT) -> Iterator[DagsterGraphQLClient]:
    """Run ``dagster dev -w workspace.yaml`` in ``project`` until the block ends; yield a
    GraphQL client."""
    with dev_server.dagster_dev(project, home, data) as server:
        yield DagsterGraphQLClient("127.0.0.1", port_number=server.port)


def wait_for_run(client: DagsterGraphQLClient, run_id: str, timeout: float = 600) -> str:
    """Poll until the run ends; return its final status name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id).value
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    raise TimeoutError(f"run {run_id} did not finish in {timeout} s")


def copy_example(project: Path, edit: Callable[[dict[str, Any]], bool]) -> None:
    """Copy the example project to ``project``; ``edit`` changes each pipeline's attributes
    in place, and returns False to leave that pipeline out."""
    dev_server.copy_project(ROOT, project, edit)


def kill_run_worker(instance: dg.DagsterInstance, run_id: str) -> None:
    """SIGKILL every process that logged events for ``run_id``: run worker and step."""
    pids = {
        entry.dagster_event.pid
        for entry in instance.all_logs(run_id)
        if entry.dagster_event is not None and entry.dagster_event.pid
    }
    assert pids, f"no process logged for {run_id}"
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def bucket_finishes(instance: dg.DagsterInstance, asset: str) -> list[tuple[int, int, int]]:
    """(generation, bucket, marker) of each bucket finish the sensor reported on ``asset``."""
    return [
        finish
        for r in instance.fetch_observations(dg.AssetKey(asset), limit=1000).records
        if r.asset_observation is not None
        for finish in finished_buckets(r.asset_observation)
    ]
