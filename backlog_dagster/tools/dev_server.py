"""Run ``dagster dev`` on the project's workspace, on loopback, for the demo and tests."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from backlog_dagster.pipeline.paths import DATA_ENV
from backlog_dagster.spark.servers import free_port
from backlog_dagster.waiting import until

#: Dagster's run, event-log and schedule storage on PostgreSQL (dagster-postgres), its
#: server named by ``DAGSTER_POSTGRES_URL``; copy it to ``$DAGSTER_HOME/dagster.yaml``.
POSTGRES_INSTANCE = Path("deploy") / "dagster-postgres.yaml"
#: A project's own Dagster instance settings, in its root (where ``dagster dev`` reads
#: them when ``DAGSTER_HOME`` is unset).
PROJECT_INSTANCE = "dagster.yaml"


@dataclass(frozen=True)
class DevServer:
    port: int
    log: Path
    #: The ``dagster dev`` process; the daemon, webserver, code server and runs are under it.
    pid: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def workspace_command() -> list[str]:
    """``dagster dev`` of this Python on the project's ``workspace.yaml``."""
    return [str(Path(sys.executable).with_name("dagster")), "dev", "-w", "workspace.yaml"]


@contextmanager
def dagster_dev(
    project: Path,
    home: Path,
    data: Path,
    timeout: float = 300,
    command: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
) -> Iterator[DevServer]:
    """Webserver, daemon and code server with ``DAGSTER_HOME=home``; stopped on exit."""
    server, process = start_dagster_dev(project, home, data, timeout, command, environment)
    try:
        yield server
    finally:
        stop_dagster_dev(process)


def start_dagster_dev(
    project: Path,
    home: Path,
    data: Path,
    timeout: float = 300,
    command: Sequence[str] | None = None,
    environment: Mapping[str, str] | None = None,
) -> tuple[DevServer, subprocess.Popen[bytes]]:
    """Start ``dagster dev`` (``command``, by default ``workspace_command``; ``dg dev``
    takes the same host and port options) in a session of its own, in ``environment``
    (by default this process's), and wait until its webserver answers.

    Its output goes to ``home/dagster-dev.log`` (appended to, so a restart keeps the
    earlier output). The project's instance settings go under the home's own
    (``with_project_instance``).
    """
    home.mkdir(parents=True, exist_ok=True)
    with_project_instance(project, home)
    port, log_path = free_port(), home / "dagster-dev.log"
    with log_path.open("a") as log:
        process = subprocess.Popen(
            [*(command or workspace_command()), "--host", "127.0.0.1", "--port", str(port)],
            cwd=project,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={
                **(os.environ if environment is None else environment),
                "DAGSTER_HOME": str(home),
                DATA_ENV: str(data),
            },
        )
    server = DevServer(port, log_path, process.pid)
    try:
        _wait_until_up(server, process, timeout)
    except BaseException:
        stop_dagster_dev(process)
        raise
    return server, process


def with_project_instance(project: Path, home: Path) -> None:
    """Add to ``home``'s ``dagster.yaml`` each section of the project's that it lacks:
    ``dagster dev`` with ``DAGSTER_HOME`` set reads only the home's file (which may hold
    a PostgreSQL storage, say, written there before)."""
    settings = project / PROJECT_INSTANCE
    if not settings.exists():
        return
    target = home / PROJECT_INSTANCE
    own = (yaml.safe_load(target.read_text()) or {}) if target.exists() else {}
    merged = {**yaml.safe_load(settings.read_text()), **own}
    if merged != own:
        target.write_text(yaml.safe_dump(merged, sort_keys=False))


def stop_dagster_dev(process: subprocess.Popen[bytes], patience: float = 60) -> None:
    """SIGTERM the whole session (daemon, webserver, code server, runs) and wait for every
    process of it, not only ``dagster dev``; SIGKILL what is left after ``patience`` s.

    A code server goes on shutting down after ``dagster dev`` has ended: it reports the
    runs it launched to Dagster's storage first. Left to itself once the caller went on to
    stop that storage's server, it waited for it for ever (seen after the tests)."""
    session = _processes(processes_under(process.pid))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + patience
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=patience)
    _, left = psutil.wait_procs(session, timeout=max(0.0, deadline - time.monotonic()))
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for survivor in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            survivor.kill()
    process.wait()


def _processes(pids: set[int]) -> list[psutil.Process]:
    """The processes of ``pids`` that are still there."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(pid))
    return found


def processes_under(root: int) -> set[int]:
    """Every live descendant of process ``root``."""
    try:
        return {child.pid for child in psutil.Process(root).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def process_kind(pid: int) -> str:
    """What a process under ``dagster dev`` is, from its command line; ``gone`` if it ended."""
    try:
        command = " ".join(psutil.Process(pid).cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "gone"
    for needle, kind in (
        ("java", "spark_jvm"),
        ("pyspark", "spark_python_worker"),
        ("dagster_webserver", "dagster_webserver"),
        ("dagster._daemon", "dagster_daemon"),
        ("code-server", "code_server"),
        ("api grpc", "code_server"),
        ("execute_run", "run_worker"),
        # The code server starts each run's worker as a spawned process; the jobs run
        # their one step in it (in-process executor).
        ("spawn_main", "run_worker"),
        ("tail -F", "compute_log_tail"),
        ("watch_orphans", "compute_log_tail"),
        ("resource_tracker", "multiprocessing_helper"),
    ):
        if needle in command:
            return kind
    return "dagster_dev"


def postgres_url(conninfo: str) -> str:
    """A libpq connection string as the URL ``POSTGRES_INSTANCE`` reads.

    It names the psycopg2 driver: dagster-postgres is written for it, and SQLAlchemy
    2.1 would otherwise pick psycopg 3 (installed for the sink), whose server-side
    parameters Dagster's ``NOTIFY`` statements do not take.
    """
    from urllib.parse import quote

    import psycopg

    parts = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = quote(str(parts.get("user") or os.environ.get("USER", "postgres")))
    password = f":{quote(str(parts['password']))}" if parts.get("password") else ""
    host, port = parts.get("host") or "localhost", parts.get("port") or 5432
    return f"postgresql+psycopg2://{user}{password}@{host}:{port}/{parts['dbname']}"


def copy_project(project: Path, target: Path, edit: Callable[[dict[str, Any]], bool]) -> None:
    """Copy ``project`` (its definitions, workspace, pyproject and Dagster instance
    settings) to ``target``; ``edit`` changes each pipeline's attributes in place, and
    returns False to leave it out."""
    shutil.copytree(
        project / "definitions",
        target / "definitions",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    for name in ("workspace.yaml", "pyproject.toml"):  # dg finds the project by the latter
        shutil.copy(project / name, target / name)
    if (project / PROJECT_INSTANCE).exists():
        shutil.copy(project / PROJECT_INSTANCE, target / PROJECT_INSTANCE)
    for defs in (target / "definitions" / "defs").glob("*/defs.yaml"):
        document = yaml.safe_load(defs.read_text())
        if edit(document["attributes"]):
            defs.write_text(yaml.safe_dump(document, sort_keys=False))
        else:
            shutil.rmtree(defs.parent)


def on_postgres(table_schema: str, dsn_env: str) -> Callable[[dict[str, Any]], bool]:
    """An ``edit`` for ``copy_project``: each pipeline's sink becomes a PostgreSQL one in
    ``table_schema``, its connection string read from ``dsn_env``."""

    def edit(attributes: dict[str, Any]) -> bool:
        table = attributes["sink"]["table"]
        attributes["sink"] = {
            "kind": "postgres",
            "dsn": {"env": dsn_env},
            "schema": table_schema,
            "table": table,
        }
        return True

    return edit


def on_spark(master_env: str) -> Callable[[dict[str, Any]], bool]:
    """An ``edit`` for ``copy_project``: each pipeline runs on the Spark whose URL (a
    Spark Connect server, a standalone master) the variable ``master_env`` holds."""

    def edit(attributes: dict[str, Any]) -> bool:
        attributes["spark_master"] = {"env": master_env}
        return True

    return edit


def on_kafka(pipeline: str, servers_env: str, topic: str) -> Callable[[dict[str, Any]], bool]:
    """An ``edit`` for ``copy_project``: ``pipeline`` reads the reference orders from the
    Kafka ``topic`` (JSON values), its brokers read from ``servers_env``."""
    from backlog_dagster.tools.kafka_workload import ORDERS_RECORD_SCHEMA

    def edit(attributes: dict[str, Any]) -> bool:
        if attributes["name"] == pipeline:
            attributes["source"] = {
                **{k: v for k, v in attributes["source"].items() if k != "path"},
                "kind": "kafka",
                "kafka": {"bootstrap_servers": {"env": servers_env}, "topic": topic},
                "record_schema": ORDERS_RECORD_SCHEMA,
            }
        return True

    return edit


def all_of(*edits: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any]], bool]:
    """One ``edit`` making each of ``edits``; the pipeline is kept if every one keeps it."""

    def edit(attributes: dict[str, Any]) -> bool:
        return all([change(attributes) for change in edits])

    return edit


def _wait_until_up(server: DevServer, process: subprocess.Popen[bytes], timeout: float) -> None:
    def up() -> bool:
        try:
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=2):
                return True
        except http.client.HTTPException as error:
            raise RuntimeError(
                f"port {server.port} answers, but not as dagster's webserver ({error!r:.120});"
                f" another process holds it; see {server.log}"
            ) from None
        except OSError:
            return False

    if not until(up, timeout, 0.5, gives_up=lambda: process.poll() is not None):
        raise RuntimeError(f"dagster dev did not start; see {server.log}")
