"""A real ``dagster dev`` (webserver, daemon, code server) on loopback, for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dagster_graphql import DagsterGraphQLClient

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def dagster_dev(home: Path, data: Path, timeout: float = 180) -> Iterator[DagsterGraphQLClient]:
    """Run ``dagster dev -w workspace.yaml`` until the block ends; yield a GraphQL client."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = (home / "dagster-dev.log").open("w")
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("dagster")),
            "dev",
            "-w",
            "workspace.yaml",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "DAGSTER_HOME": str(home), "BACKLOG_DAGSTER_DATA": str(data)},
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dagster dev did not start; see {log.name}") from None
                time.sleep(0.5)
        yield DagsterGraphQLClient("127.0.0.1", port_number=port)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def wait_for_run(client: DagsterGraphQLClient, run_id: str, timeout: float = 600) -> str:
    """Poll until the run ends; return its final status name."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get_run_status(run_id).value
        if status in ("SUCCESS", "FAILURE", "CANCELED"):
            return status
        time.sleep(1)
    raise TimeoutError(f"run {run_id} did not finish in {timeout} s")
