"""A real ``dagster dev`` (webserver, daemon, code server) on loopback, for tests."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
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


def copy_example(project: Path, edit: Callable[[dict[str, Any]], bool]) -> None:
    """Copy the example project to ``project``; ``edit`` changes each pipeline's attributes
    in place, and returns False to leave that pipeline out."""
    shutil.copytree(
        ROOT / "definitions",
        project / "definitions",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("workspace.yaml", "pyproject.toml"):  # dg finds the project by the latter
        shutil.copy(ROOT / name, project / name)
    for defs in (project / "definitions" / "defs").glob("*/defs.yaml"):
        document = yaml.safe_load(defs.read_text())
        if edit(document["attributes"]):
            defs.write_text(yaml.safe_dump(document, sort_keys=False))
        else:
            shutil.rmtree(defs.parent)
