"""The machine's PostgreSQL server for tests: started if it is down, a fresh database
per test, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg

from backlog_dagster.spark.servers import free_port

#: The server on loopback (trust authentication for local users on this kind of machine).
SERVER = "host=127.0.0.1 port=5432 user=postgres"


def _bin() -> Path:
    found = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True)
    return Path(found.stdout.strip())


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: as root, run its programs as ``postgres``."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


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


@dataclass(frozen=True)
class PrivateServer:
    """A PostgreSQL server of the test's own (its own data folder and port), which the
    test may restart without disturbing other tests."""

    folder: Path
    port: int

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres"

    def pg_ctl(self, *arguments: str) -> None:
        subprocess.run(
            [*_as_postgres(), str(_bin() / "pg_ctl"), "-D", str(self.folder / "data"), *arguments],
            check=True,
            capture_output=True,
        )

    def restart(self) -> None:
        """Stop (fast: every connection is ended) and start again."""
        self.pg_ctl("-m", "fast", "-w", "-l", str(self.folder / "server.log"), "restart")

    @property
    def _options(self) -> str:
        return (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=200"
        )


@contextmanager
def private_server() -> Iterator[PrivateServer]:
    """``initdb`` a new cluster in a folder of its own, start it on a free port, and
    remove it all afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="backlog-dagster-pg-"))
    server = PrivateServer(folder, free_port())
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
    try:
        initdb = [str(_bin() / "initdb"), "-D", str(folder / "data"), "-A", "trust"]
        subprocess.run(
            [*_as_postgres(), *initdb, "-U", "postgres", "--no-sync"],
            check=True,
            capture_output=True,
        )
        server.pg_ctl("-w", "-l", str(folder / "server.log"), "-o", server._options, "start")
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def wait_for_blocked_merge(dsn: str, table: str, timeout: float = 120) -> int:
    """The backend whose merge into ``table`` waits for a lock another session holds on
    it: its bulk load is done, its merge not. Returns the backend's process id."""
    deadline = time.monotonic() + timeout
    # Autocommit: each look reads the activity afresh (a transaction keeps one snapshot).
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s AND datname = current_database()",
                (f'MERGE INTO %"{table}" AS held%',),
            ).fetchone()
            if row is not None:
                return int(row[0])
            time.sleep(0.05)
        seen = watcher.execute(
            "SELECT application_name, state, wait_event_type, left(query, 80) "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    raise TimeoutError(
        f"no commit waited on its merge into {table} in {timeout:.0f} s; the database's "
        f"connections then (application, state, waiting on, query): {seen}"
    )


@contextmanager
def holding(
    dsn: str, table: str, schema: str = "example"
) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Hold an exclusive lock on a results table for the block: a commit then waits at
    its merge, its bulk load done. Yields the holding connection."""
    with psycopg.connect(dsn) as connection:
        connection.execute(f'LOCK TABLE "{schema}"."{table}" IN EXCLUSIVE MODE')
        try:
            yield connection
        finally:
            connection.rollback()


@contextmanager
def stopped_commits(dsn: str, pipeline: str, among: Callable[[], set[int]]) -> Iterator[int]:
    """SIGSTOP, for the block, the process (one of ``among()``) whose sink connection
    commits ``pipeline``'s micro-batches, at a moment it is between commits (its
    connection idle, no transaction open, so it holds no lock). Yields its id."""
    # A realtime run restarted meanwhile (its query's start waits for a slow Python
    # worker on a busy machine) has no commit process for minutes.
    deadline = time.monotonic() + 300
    server_port = int(psycopg.conninfo.conninfo_to_dict(dsn).get("port") or 5432)
    ports: dict[int, str] = {}
    workers: set[int] = set()
    with psycopg.connect(dsn, autocommit=True) as watcher:
        while True:
            assert time.monotonic() < deadline, (
                f"no idle commit process of {pipeline}: last seen, the sink connections' "
                f"client ports and states {ports}, the commit processes {workers}"
            )
            workers = among()
            ports = {
                int(port): state
                for port, state in watcher.execute(
                    "SELECT client_port, state FROM pg_stat_activity WHERE application_name = %s",
                    (f"backlog-dagster {pipeline}",),
                ).fetchall()
            }
            owner = next(
                (pid for pid in workers if _local_ports(pid, server_port) & set(ports)), None
            )
            if owner is None:
                time.sleep(0.5)
                continue
            os.kill(owner, signal.SIGSTOP)
            idle = watcher.execute(
                "SELECT bool_and(state = 'idle') FROM pg_stat_activity "
                "WHERE application_name = %s AND client_port = ANY(%s)",
                (f"backlog-dagster {pipeline}", sorted(_local_ports(owner, server_port))),
            ).fetchone()
            if idle is not None and idle[0]:
                break
            os.kill(owner, signal.SIGCONT)
            time.sleep(0.2)
    try:
        yield owner
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(owner, signal.SIGCONT)


def _local_ports(pid: int, server_port: int) -> set[int]:
    """The local ports of the process's TCP connections to ``server_port`` (none if it
    is gone). Only those: Linux gives two connections to different servers the same
    local port when it can, so another process's connection to the Connect server may
    share a sink connection's port."""
    import psutil

    try:
        connections = psutil.Process(pid).net_connections("tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in connections if c.raddr and c.raddr.port == server_port}


@contextmanager
def example_servers() -> Iterator[tuple[str, str, PrivateServer]]:
    """Dagster's database on the machine's server, and the sinks' on a private server
    the caller may restart: ``(dagster dsn, sink dsn, sink server)``."""
    ensure_server()
    with (
        fresh_database() as dagster_dsn,
        private_server() as sink_server,
        fresh_database(sink_server.dsn) as sink_dsn,
    ):
        yield dagster_dsn, sink_dsn, sink_server
