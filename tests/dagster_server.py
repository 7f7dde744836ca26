"""A real ``dagster dev`` (webserver, daemon, code server) on loopback, for tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

from backlog_dagster.components import dev_server

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def dagster_dev(home: Path, data: Path) -> Iterator[DagsterGraphQLClient]:
    """Run ``dagster dev -w workspace.yaml`` until the block ends; yield a GraphQL client."""
    with dev_server.dagster_dev(ROOT, home, data) as server:
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
