"""The machine's PostgreSQL server for tests: started if it is down, a fresh database
per test, dropped afterwards."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

#: The server on loopback (trust authentication for local users on this kind of machine).
SERVER = "host=127.0.0.1 port=5432 user=postgres"


def ensure_server(timeout: float = 60) -> None:
    """Start the machine's PostgreSQL cluster when it does not answer."""
    if _answers():
        return
    versions = sorted(Path("/etc/postgresql").iterdir())
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1].name, "main", "start"],
        check=False,
        capture_output=True,
    )
    deadline = time.monotonic() + timeout
    while not _answers():
        assert time.monotonic() < deadline, "PostgreSQL did not start"
        time.sleep(0.5)


def _answers() -> bool:
    try:
        with psycopg.connect(f"{SERVER} dbname=postgres", connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


@contextmanager
def fresh_database(server: str = SERVER) -> Iterator[str]:
    """A new, empty database on ``server``; yields its connection string."""
    name = f"backlog_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{server} dbname={name}"
    finally:
        with psycopg.connect(f"{server} dbname=postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
