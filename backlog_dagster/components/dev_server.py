"""Run ``dagster dev`` on the project's workspace, on loopback, for the demo and tests."""

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
from dataclasses import dataclass
from pathlib import Path

from backlog_dagster.components.pipeline import DATA_ENV


@dataclass(frozen=True)
class DevServer:
    port: int
    log: Path
    #: The ``dagster dev`` process; the daemon, webserver, code server and runs are under it.
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def dagster_dev(project: Path, home: Path, data: Path, timeout: float = 300) -> Iterator[DevServer]:
    """Webserver, daemon and code server with ``DAGSTER_HOME=home``; stopped on exit."""
    home.mkdir(parents=True, exist_ok=True)
    port, log_path = _free_port(), home / "dagster-dev.log"
    with log_path.open("w") as log:
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
            cwd=project,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "DAGSTER_HOME": str(home), DATA_ENV: str(data)},
        )
        server = DevServer(port, log_path, process.pid)
        try:
            _wait_until_up(server, process, timeout)
            yield server
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _wait_until_up(server: DevServer, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=2):
                return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dagster dev did not start; see {server.log}") from None
            time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
