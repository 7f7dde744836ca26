"""``backlog-dagster log …``: create, fill, inspect and trim topics of the embedded log."""

from __future__ import annotations

import time
from pathlib import Path

import click
from dateutil.parser import isoparse
from rich.console import Console
from rich.table import Table

from backlog_dagster.archive.layout import ArchiveFile, Format, archived_end
from backlog_dagster.log.topic import Payload, Topic, TopicError, create_topic
from backlog_dagster.source.schema import SchemaError, parse_ddl
from backlog_dagster.tools.log_archive import RECORDS_PER_FILE, archive_before
from backlog_dagster.tools.produce import console, produce_reference, workload_options
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP

topic_path = click.argument("topic", type=click.Path(path_type=Path))


def open_topic(path: Path) -> Topic:
    try:
        return Topic(path)
    except TopicError as error:
        raise click.ClickException(str(error)) from error


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
@workload_options
@click.option(
    "--buckets",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Buckets, if the topic has to be created.",
)
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
        produce_reference(log, records, days, live_rate, live_seconds, seed, next_id)


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
    micros = _moment_us(before_time)
    with open_topic(topic) as log:
        for bucket in log.buckets():
            offset = log.offset_for_time(bucket, micros)
            bounds = log.bucket(bucket).truncate_before(offset)
            console.print(f"bucket {bucket}: earliest offset now {bounds.earliest:,}")


@log_group.command("archive")
@topic_path
@click.argument("archive_dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--before-time",
    required=True,
    help="Archive every record older than this ISO-8601 time (with zone).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "json"]),
    default="parquet",
    show_default=True,
)
@click.option(
    "--records-per-file",
    type=click.IntRange(min=1),
    default=RECORDS_PER_FILE,
    show_default=True,
)
@click.option(
    "--truncate", is_flag=True, help="Then drop the archived records from the log (retention)."
)
def archive(
    topic: Path,
    archive_dir: Path,
    before_time: str,
    fmt: Format,
    records_per_file: int,
    truncate: bool,
) -> None:
    """Write a topic's older records to ARCHIVE_DIR in Kafka Connect's layout
    (<topic>/partition=<p>/<topic>+<p>+<startOffset>.<ext>), going on from what is there."""
    micros = _moment_us(before_time)
    with open_topic(topic) as log:
        before = {b: log.offset_for_time(b, micros) for b in log.buckets()}

        def report(archived: ArchiveFile, records: int) -> None:
            console.print(f"wrote {archived.path} ({records:,} records)")

        written = archive_before(log, archive_dir, before, fmt, records_per_file, report)
        for bucket, (first, end) in written.items():
            console.print(f"bucket {bucket}: archived offsets [{first:,}, {end:,})")
        if not written:
            console.print("nothing new to archive")
        if truncate:
            for bucket, end in before.items():
                held = archived_end(archive_dir, log.name, bucket)
                if held is not None:
                    bounds = log.bucket(bucket).truncate_before(min(end, held))
                    console.print(f"bucket {bucket}: earliest offset now {bounds.earliest:,}")


def _moment_us(text: str) -> int:
    try:
        moment = isoparse(text)
    except ValueError as error:
        raise click.BadParameter(f"not an ISO-8601 time: {text!r}") from error
    if moment.tzinfo is None:
        raise click.BadParameter("give a time zone, e.g. 2026-11-20T00:00:00+00:00")
    return int(moment.timestamp() * 1_000_000)


def _size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.1f} {unit}"
        value /= 1024
    return f"{size} B"
