"""``backlog-dagster log …``: create, fill, inspect and trim topics of the embedded log."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from backlog_dagster.log.schema import SchemaError, parse_ddl
from backlog_dagster.log.topic import Payload, Topic, TopicError, create_topic
from backlog_dagster.log.workload import (
    ORDERS_SCHEMA,
    ORDERS_TIMESTAMP,
    produce_backlog,
    produce_live,
)

console = Console(stderr=True)
topic_path = click.argument("topic", type=click.Path(path_type=Path))


def open_topic(path: Path) -> Topic:
    try:
        return Topic(path)
    except TopicError as error:
        raise click.ClickException(str(error)) from error


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


@click.group("log")
def log_group() -> None:
    """The embedded bucketed log: a directory per topic, no server."""


@log_group.command("create")
@topic_path
@click.option("--schema", "ddl", required=True, help="Record schema as Spark DDL.")
@click.option(
    "--timestamp-column", required=True, help="The TIMESTAMP column records are timed by."
)
@click.option("--buckets", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--payload",
    type=click.Choice([p.value for p in Payload]),
    default="arrow",
    show_default=True,
    help="arrow: typed columns; json: one JSON text per record.",
)
def create(topic: Path, ddl: str, timestamp_column: str, buckets: int, payload: str) -> None:
    """Create an empty topic."""
    try:
        create_topic(
            topic,
            parse_ddl(ddl),
            timestamp_column=timestamp_column,
            buckets=buckets,
            payload=Payload(payload),
        ).close()
    except (SchemaError, TopicError) as error:
        raise click.ClickException(str(error)) from error
    console.print(f"created topic {topic} with {buckets} buckets")


@log_group.command("describe")
@topic_path
def describe(topic: Path) -> None:
    """Buckets, their earliest and latest offsets, and sizes."""
    with open_topic(topic) as log:
        table = Table(title=f"topic {log.name} ({log.payload.value} payload)")
        for column in ("bucket", "earliest", "latest", "records", "size"):
            table.add_column(column, justify="right")
        total_records = total_bytes = 0
        for info in log.describe():
            total_records += info.bounds.records
            total_bytes += info.size_bytes
            table.add_row(
                str(info.bucket),
                f"{info.bounds.earliest:,}",
                f"{info.bounds.latest:,}",
                f"{info.bounds.records:,}",
                _size(info.size_bytes),
            )
        table.add_row("all", "", "", f"{total_records:,}", _size(total_bytes), style="bold")
        Console().print(table)


@log_group.command("produce")
@topic_path
@click.option(
    "--records",
    type=click.IntRange(min=0),
    default=1_000_000,
    show_default=True,
    help="Backlog records to append.",
)
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True),
    default=5.0,
    show_default=True,
    help="The backlog's event times span this many days up to now.",
)
@click.option(
    "--buckets",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Buckets, if the topic has to be created.",
)
@click.option(
    "--live-rate",
    type=click.FloatRange(min=0),
    default=0.0,
    help="After the backlog, append this many records/s stamped now, until stopped.",
)
@click.option(
    "--live-seconds",
    type=click.FloatRange(min=0),
    default=None,
    help="Stop the live producer after this long (default: on Ctrl-C or SIGTERM).",
)
@click.option("--seed", type=int, default=1, show_default=True)
def produce(
    topic: Path,
    records: int,
    days: float,
    buckets: int,
    live_rate: float,
    live_seconds: float | None,
    seed: int,
) -> None:
    """Append the reference ``orders`` workload: a backlog, then optionally a live rate."""
    if not (topic / "topic.sqlite").exists():
        create_topic(
            topic, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=buckets
        ).close()
    with open_topic(topic) as log:
        if log.schema != ORDERS_SCHEMA:
            raise click.ClickException(f"topic {topic} does not have the orders schema")
        next_id = sum(b.latest for b in log.bounds().values())
        started = time.monotonic()
        with progress_bar() as bar:
            task = bar.add_task("backlog", total=records, rate="")

            def advance(done: int) -> None:
                rate = done / max(time.monotonic() - started, 1e-9)
                bar.update(task, completed=done, rate=f"{rate:,.0f} rec/s")

            next_id = produce_backlog(
                log, records, days, seed=seed, first_order_id=next_id, on_progress=advance
            )
        if live_rate > 0:
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
                        log,
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


@log_group.command("append")
@topic_path
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "file_format",
    type=click.Choice(["parquet", "csv", "jsonl"]),
    default=None,
    help="The file's format; default: from its extension (.parquet, .csv, .jsonl/.json).",
)
@click.option("--bucket", type=click.IntRange(min=0), default=None, help="Append to this bucket.")
@click.option(
    "--key",
    default=None,
    help="Spread records over the buckets by this column's value (the same value, the "
    "same bucket, as a Kafka producer keys them).",
)
def append(
    topic: Path, file: Path, file_format: str | None, bucket: int | None, key: str | None
) -> None:
    """Append your own records from a Parquet, CSV or JSON-lines file.

    The file needs the topic's columns (others are ignored); CSV and JSON values are
    parsed as the topic's types. Give --bucket, or --key to spread them by a column.
    """
    from backlog_dagster.log.files import read_records, split_by_key

    with open_topic(topic) as log:
        buckets = log.buckets()
        if (bucket is None) == (key is None) and len(buckets) > 1:
            raise click.UsageError("give one of --bucket or --key")
        try:
            records = read_records(file, log.schema, file_format)
            parts = (
                {bucket if bucket is not None else buckets[0]: records}
                if key is None
                else split_by_key(records, key, buckets)
            )
            for target, part in sorted(parts.items()):
                first, end = log.append(target, part)
                console.print(
                    f"bucket {target}: {end - first:,} records at offsets [{first:,}, {end:,})"
                )
        except (ValueError, TopicError) as error:
            raise click.ClickException(str(error)) from error


@log_group.command("tail")
@topic_path
@click.option("--bucket", type=int, required=True)
@click.option(
    "-n",
    "--lines",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Start this many records before the end.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing records as they arrive.")
def tail(topic: Path, bucket: int, lines: int, follow: bool) -> None:
    """Print a bucket's last records, one per line, with their offsets."""
    with open_topic(topic) as log:
        try:
            bounds = log.bucket(bucket).bounds()
        except TopicError as error:
            raise click.ClickException(str(error)) from error
        offset = max(bounds.earliest, bounds.latest - lines)
        try:
            while True:
                latest = log.bucket(bucket).bounds().latest
                for batch in log.read(bucket, offset, latest):
                    for row in batch.to_pylist():
                        click.echo(f"{offset}\t{row}")
                        offset += 1
                if not follow:
                    return
                time.sleep(0.5)
        except KeyboardInterrupt:
            return


@log_group.command("add-buckets")
@topic_path
@click.argument("count", type=click.IntRange(min=1))
def add_buckets(topic: Path, count: int) -> None:
    """Add empty buckets; running readers discover them."""
    with open_topic(topic) as log:
        added = log.add_buckets(count)
    console.print(f"added buckets {added[0]}..{added[-1]}")


@log_group.command("truncate")
@topic_path
@click.option(
    "--before-time",
    required=True,
    help="Retention: drop every record older than this ISO-8601 time (with zone).",
)
def truncate(topic: Path, before_time: str) -> None:
    """Apply retention: each bucket's earliest offset moves to its first record at the time."""
    try:
        moment = datetime.fromisoformat(before_time)
    except ValueError as error:
        raise click.BadParameter(f"not an ISO-8601 time: {before_time!r}") from error
    if moment.tzinfo is None:
        raise click.BadParameter("give a time zone, e.g. 2026-11-20T00:00:00+00:00")
    micros = int(moment.timestamp() * 1_000_000)
    with open_topic(topic) as log:
        for bucket in log.buckets():
            offset = log.offset_for_time(bucket, micros)
            bounds = log.bucket(bucket).truncate_before(offset)
            console.print(f"bucket {bucket}: earliest offset now {bounds.earliest:,}")


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.1f} {unit}"
        value /= 1024
    return f"{size} B"
