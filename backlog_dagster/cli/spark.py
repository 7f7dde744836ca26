"""``backlog-dagster spark``: run a long-lived Spark in the foreground for pipelines to share."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import click

from backlog_dagster.spark import servers
from backlog_dagster.tools.sample_run import DEFAULT_WARM_UP_S, warming


@click.group("spark")
def spark_group() -> None:
    """A Spark that outlives runs: a Spark Connect server or a standalone cluster."""


@spark_group.command("connect-server")
@click.option("--port", type=int, default=15002, show_default=True)
@click.option(
    "--master",
    default="local[*]",
    show_default=True,
    help="Where the server runs its jobs: local[*], or a standalone master spark://host:port.",
)
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path),
    default=Path(".data/spark/connect"),
    show_default=True,
    help="Where its log and scheduler settings go.",
)
@click.option("--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting; repeatable.")
@click.option(
    "--warm-up",
    "warm_up_s",
    type=click.FloatRange(min=0),
    default=DEFAULT_WARM_UP_S,
    show_default=True,
    help="Seconds of sample realtime (after a sample backlog) the server runs before it "
    "says it is up, so its JIT has compiled what runs run; 0 skips it.",
)
def connect_server(
    port: int, master: str, folder: Path, conf: tuple[str, ...], warm_up_s: float
) -> None:
    """Run a Spark Connect server on 127.0.0.1 until interrupted.

    Point pipelines at it with spark_master: sc://127.0.0.1:PORT.
    """
    settings = dict(_setting(item) for item in conf)
    # A SIGTERM while the server starts or warms up stops it too, as Ctrl-C does.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    folder = folder.resolve()
    warm_up = warming(folder, warm_up_s, click.echo)
    with servers.connect_server(folder, port, master, settings, warm_up) as server:
        click.echo(f"Spark Connect server up: {server.url} (log: {server.log}); Ctrl-C stops it")
        _wait_for(server)


@spark_group.command("cluster")
@click.option("--port", type=int, default=7077, show_default=True, help="The master's port.")
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--cores", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--memory", default="2g", show_default=True, help="Each worker's memory.")
@click.option(
    "--dir",
    "folder",
    type=click.Path(path_type=Path),
    default=Path(".data/spark/cluster"),
    show_default=True,
    help="Where the logs and the workers' scratch space go.",
)
def cluster(port: int, workers: int, cores: int, memory: str, folder: Path) -> None:
    """Run a standalone cluster (a master and its workers) on 127.0.0.1 until interrupted.

    Point pipelines at it with spark_master: spark://127.0.0.1:PORT.
    """
    with servers.standalone_cluster(folder.resolve(), workers, cores, memory, port) as (
        master,
        started,
    ):
        click.echo(
            f"standalone master up: {master.url}, {len(started)} worker(s) of {cores} core(s) "
            f"and {memory} (logs in {folder}); Ctrl-C stops them"
        )
        _wait_for(master)


def _setting(item: str) -> tuple[str, str]:
    key, equals, value = item.partition("=")
    if not equals or not key:
        raise click.BadParameter(f"{item!r}: expected KEY=VALUE", param_hint="--conf")
    return key, value


def _exit_on_signal(number: int, frame: object) -> None:
    raise SystemExit(128 + number)


def _wait_for(server: servers.SparkServer) -> None:
    """Until Ctrl-C or SIGTERM, or the server's process ends by itself."""
    done = threading.Event()
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: done.set())
    while not done.wait(1):
        if server.process.poll() is not None:
            raise click.ClickException(
                f"Spark {server.name} exited (code {server.process.returncode}); see {server.log}"
            )
