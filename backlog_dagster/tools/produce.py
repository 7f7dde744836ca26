"""Producing the reference workload from the command line, into a topic of the embedded
log or a Kafka topic (any ``Appender``): a progress bar for the backlog, then a live rate
until stopped."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from backlog_dagster.tools.workload import Appender, produce_backlog, produce_live

console = Console(stderr=True)


def workload_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command that produces the workload: ``--records``, ``--days``,
    ``--live-rate``, ``--live-seconds`` and ``--seed``."""
    options = [
        click.option(
            "--records",
            type=click.IntRange(min=0),
            default=1_000_000,
            show_default=True,
            help="Backlog records to add.",
        ),
        click.option(
            "--days",
            type=click.FloatRange(min=0, min_open=True),
            default=5.0,
            show_default=True,
            help="The backlog's event times span this many days up to now.",
        ),
        click.option(
            "--live-rate",
            type=click.FloatRange(min=0),
            default=0.0,
            help="After the backlog, add this many records/s stamped now, until stopped.",
        ),
        click.option(
            "--live-seconds",
            type=click.FloatRange(min=0),
            default=None,
            help="Stop the live producer after this long (default: on Ctrl-C or SIGTERM).",
        ),
        click.option("--seed", type=int, default=1, show_default=True),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    )


def produce_reference(
    target: Appender,
    records: int,
    days: float,
    live_rate: float,
    live_seconds: float | None,
    seed: int,
    next_id: int,
) -> None:
    """The reference workload into ``target``, with a progress bar: a backlog, then the
    live rate until stopped (``live_seconds``, Ctrl-C or SIGTERM)."""
    started = time.monotonic()
    with progress_bar() as bar:
        task = bar.add_task("backlog", total=records, rate="")

        def advance(done: int) -> None:
            rate = done / max(time.monotonic() - started, 1e-9)
            bar.update(task, completed=done, rate=f"{rate:,.0f} rec/s")

        next_id = produce_backlog(
            target, records, days, seed=seed, first_order_id=next_id, on_progress=advance
        )
    if live_rate <= 0:
        return
    stop_at = time.monotonic() + live_seconds if live_seconds is not None else None
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    console.print(f"live: {live_rate:,.0f} records/s (Ctrl-C stops)")
    try:
        produced = (
            produce_live(
                target,
                live_rate,
                seed=seed + 1,
                first_order_id=next_id,
                should_stop=lambda: (
                    stopping or (stop_at is not None and time.monotonic() >= stop_at)
                ),
            )
            - next_id
        )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print(f"live: appended {produced:,} records")
