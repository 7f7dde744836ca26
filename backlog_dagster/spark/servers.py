"""Long-lived Spark processes, started from the pyspark installation (through
``spark.home.launch_home``): a Spark Connect server and a standalone cluster (a master
and its workers).

Pipelines attach to them with ``spark_master: sc://host:port`` (Connect) or
``spark://host:port`` (standalone); a run then pays no JVM start of its own on Connect,
and runs its executors on the workers on a standalone cluster. ``backlog-dagster spark
connect-server`` and ``backlog-dagster spark cluster`` run them in the foreground; the
demo and the tests start them with the functions here.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from backlog_dagster.spark import connect_main
from backlog_dagster.spark.home import launch_home
from backlog_dagster.spark.session import LAUNCH_CONF, SESSION_CONF
from backlog_dagster.waiting import until

#: Spark's Connect service as a plugin of the server's application
#: (``spark.connect_main``), its sessions sharing Spark's compiled code and Python workers.
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

#: The fair scheduler's pools: jobs without a pool of their own (every session's) share
#: the default pool fairly, so a long backlog job does not hold up another pipeline's
#: micro-batches until it ends (Spark's default pool is first in, first out).
FAIR_POOLS = """<?xml version="1.0"?>
<allocations>
  <pool name="default"><schedulingMode>FAIR</schedulingMode><weight>1</weight></pool>
</allocations>
"""

#: Cores an application gets on the standalone cluster unless it asks for more
#: (``spark.cores.max``): Spark's default gives the first application every core, and a
#: realtime query never lets go of them, so the next pipeline's runs would wait forever.
DEFAULT_APP_CORES = 1

#: A session whose client went away (its run's process died) is closed, and its
#: queries stopped, after this long without a call; a live run calls every second.
CONNECT_SESSION_TIMEOUT = "5m"


@dataclass(frozen=True)
class SparkServer:
    """One long-lived Spark process: what it is, where to reach it, its log."""

    name: str
    url: str
    port: int
    log: Path
    process: subprocess.Popen[bytes]


#: Where ``free_port`` looks: below Linux's default range of ports handed out for
#: ``bind(port 0)`` and outgoing connections (32768-60999), so a port picked here and
#: bound a few seconds later (``dagster dev``'s webserver, a server started again on its
#: port) is not taken meanwhile by another process's ephemeral socket, such as a Spark
#: JVM's py4j gateway.
PICKED_PORTS = range(20000, 32768)


def free_port() -> int:
    """A loopback port that is free now, picked at random from ``PICKED_PORTS``."""
    pick = random.SystemRandom()
    for _ in range(100):
        port = pick.choice(PICKED_PORTS)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PICKED_PORTS.start}-{PICKED_PORTS.stop - 1}")


def start_connect_server(
    port: int,
    folder: Path,
    master: str = "local[*]",
    conf: Mapping[str, str] = {},
    host: str = "127.0.0.1",
) -> SparkServer:
    """A Spark Connect server on ``host:port`` running its jobs on ``master``.

    Every client gets a session of its own (its SQL settings, its temporary views and
    streaming queries); the server's Spark is shared under the fair scheduler, and so are
    the classes it generates and compiles for query plans and its Python workers
    (``spark.connect_main``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    pools = folder / "fair-pools.xml"
    pools.write_text(FAIR_POOLS)
    settings = {
        **SESSION_CONF,
        **LAUNCH_CONF,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.session.manager.defaultSessionTimeout": CONNECT_SESSION_TIMEOUT,
        "spark.scheduler.mode": "FAIR",
        "spark.scheduler.allocation.file": str(pools),
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.sql.artifact.isolation.enabled": "false",
        **conf,
    }
    plugins = ",".join(p for p in (settings.get("spark.plugins", ""), CONNECT_PLUGIN) if p)
    settings = {**settings, "spark.plugins": plugins}
    command = ["bin/spark-submit", "--name", "backlog-dagster", "--master", master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command += [connect_main.__file__]
    return _start("connect server", f"sc://{host}:{port}", port, command, folder)


def start_master(port: int, folder: Path, host: str = "127.0.0.1") -> SparkServer:
    """A standalone cluster's master on ``host:port`` (its web UI on a free port)."""
    command = ["bin/spark-class", MASTER_CLASS, "--host", host, "--port", str(port)]
    command += ["--webui-port", str(free_port())]
    options = {"SPARK_MASTER_OPTS": f"-Dspark.deploy.defaultCores={DEFAULT_APP_CORES}"}
    return _start("master", f"spark://{host}:{port}", port, command, folder, options)


def start_worker(
    master: str, folder: Path, cores: int = 2, memory: str = "2g", host: str = "127.0.0.1"
) -> SparkServer:
    """A standalone worker: a JVM of its own that starts executors for applications."""
    port = free_port()
    command = ["bin/spark-class", WORKER_CLASS, master, "--host", host, "--port", str(port)]
    command += ["--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory]
    command += ["--work-dir", str(folder / "work")]
    return _start(f"worker {port}", master, port, command, folder)


def _start(
    name: str,
    url: str,
    port: int,
    command: list[str],
    folder: Path,
    options: Mapping[str, str] = {},
) -> SparkServer:
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{name.replace(' ', '-')}.log"
    home = launch_home()
    environment = {
        **os.environ,
        "SPARK_HOME": str(home),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOG_DIR": str(folder),
        "SPARK_WORKER_DIR": str(folder / "work"),
        **options,
    }
    with log.open("ab") as output:
        process = subprocess.Popen(
            [str(home / command[0]), *command[1:]],
            stdout=output,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    return SparkServer(name, url, port, log, process)


def wait_until_listening(server: SparkServer, timeout: float = 120) -> None:
    """Wait until the server accepts connections; its log's end if it died or took too long."""

    def listening() -> bool:
        try:
            socket.create_connection(("127.0.0.1", server.port), 1).close()
        except OSError:
            return False
        return True

    exited = lambda: server.process.poll() is not None  # noqa: E731
    if not until(listening, timeout, 0.5, gives_up=exited):
        tail = server.log.read_text(errors="replace").splitlines()[-20:]
        state = "exited" if exited() else "is not listening"
        raise RuntimeError(
            f"Spark {server.name} ({server.url}) {state}; the end of its log "
            f"({server.log.name}):\n" + "\n".join(tail)
        )


def stop(server: SparkServer, signal_number: int = signal.SIGTERM) -> None:
    """Stop the server's process group (its JVM and the Python workers it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal_number)
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()


@contextmanager
def connect_server(
    folder: Path,
    port: int | None = None,
    master: str = "local[*]",
    conf: Mapping[str, str] = {},
    warm_up: Callable[[SparkServer], None] | None = None,
) -> Iterator[SparkServer]:
    """A Spark Connect server on loopback for the block; ``warm_up`` runs on it once it
    listens, before the block (``tools.sample_run.warm_up_server`` warms its JIT)."""
    server = start_connect_server(port or free_port(), folder, master, conf)
    try:
        wait_until_listening(server)
        if warm_up is not None:
            warm_up(server)
        yield server
    finally:
        stop(server)


@contextmanager
def standalone_cluster(
    folder: Path, workers: int = 2, cores: int = 2, memory: str = "2g", port: int | None = None
) -> Iterator[tuple[SparkServer, list[SparkServer]]]:
    """A master and ``workers`` workers on loopback for the block."""
    master = start_master(port or free_port(), folder)
    started = [master]
    try:
        wait_until_listening(master)
        for _ in range(workers):
            started.append(start_worker(master.url, folder, cores, memory))
        for worker in started[1:]:
            wait_until_listening(worker)
        yield master, started[1:]
    finally:
        for server in reversed(started):
            stop(server)
