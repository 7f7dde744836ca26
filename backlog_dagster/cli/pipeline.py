"""``backlog-dagster pipeline …``: run and inspect a declared pipeline without the UI."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from backlog_dagster.errors import UserError
from backlog_dagster.implementations import open_source
from backlog_dagster.phases.session import new_pipeline_session, pipeline_spark
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import PipelineFileError, load_pipeline, project_root_of
from backlog_dagster.pipeline.paths import data_root, with_paths_under
from backlog_dagster.sink import open_sink
from backlog_dagster.spark.session import stopping_reopened

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backlog_dagster.phases.progress import BacklogProgress
    from backlog_dagster.sink import Generation, PhaseChange
    from backlog_dagster.source import Source

console = Console(stderr=True)
defs_file = click.argument(
    "defs_yaml", type=click.Path(exists=True, dir_okay=False, path_type=Path)
)


def pipeline_of(path: Path) -> PipelineConfig:
    try:
        config = load_pipeline(path)
    except PipelineFileError as error:
        raise click.ClickException(str(error)) from error
    return with_paths_under(config, data_root(project_root_of(path)))


@contextmanager
def naming_the_file(path: Path) -> Iterator[None]:
    """A mistake the user can fix exits non-zero with its message, naming the file."""
    try:
        yield
    except UserError as error:
        raise click.ClickException(f"{path}: {error}") from None


@click.group("pipeline")
def pipeline_group() -> None:
    """Declared pipelines (a defs.yaml of type backlog_dagster.BacklogPipeline)."""


@pipeline_group.command("backlog")
@defs_file
@click.option(
    "--checkpoint-interval",
    type=float,
    default=None,
    help="Seconds between commits; overrides backlog.checkpoint_interval.",
)
def backlog(defs_yaml: Path, checkpoint_interval: float | None) -> None:
    """Run the backlog phase up to the boundary markers."""
    from backlog_dagster.phases.backlog import run_backlog

    config = pipeline_of(defs_yaml)
    with (
        naming_the_file(defs_yaml),
        pipeline_spark(config, "backlog") as spark,
        open_sink(config) as sink,
        stopping_reopened(lambda: new_pipeline_session(config, "backlog")) as reopen,
    ):
        _quiet(spark)
        report = run_backlog(
            spark,
            config,
            sink,
            checkpoint_interval=checkpoint_interval,
            log=console.print,
            reopen=reopen,
        )
    console.print(
        f"backlog of {config.name} done: {report.rows_read:,} records read, "
        f"{report.rows_written:,} rows written in {report.chunks} chunk(s), "
        f"{report.seconds:.1f} s, {report.records_per_second:,.0f} records/s"
    )


@pipeline_group.command("status")
@defs_file
def status(defs_yaml: Path) -> None:
    """Where the pipeline is (the backlog's progress and ETA, or the realtime lag), its
    markers, per-bucket progress, watermark lag and phase history."""
    from backlog_dagster.phases.lag import watermark_lag
    from backlog_dagster.phases.progress import (
        backlog_progress,
        clock,
        published_run,
        realtime_lag,
        realtime_where,
    )

    config = pipeline_of(defs_yaml)
    now = time.time()
    with naming_the_file(defs_yaml), open_sink(config) as sink:
        generation = sink.current_generation()
        history = sink.phase_history()
        run = published_run(sink, config, now)
        bad, skipped, dead_letters = (
            sink.dead_letter_count(),
            sink.skipped_records(),
            sink.dead_letter_table,
        )
    if generation is None:
        console.print(f"{config.name}: not started (no markers yet)")
        return
    progress = backlog_progress(generation, run, config, history)
    with open_source(config) as topic:
        Console().print(_bucket_table(config, generation, history[-1].phase, progress, topic))
        lag = watermark_lag(generation, topic, config, now)
        where = progress.describe()
        if history[-1].phase == "realtime":
            behind = realtime_lag(generation, topic.latest_offsets(), lag, config)
            where = f"{realtime_where(behind)} since {clock(history[-1].changed_at)}"
        console.print(where)
    threshold = config.backlog.watermark_lag_threshold
    console.print(
        f"{lag.describe()}"
        + ("" if threshold is None else f" (threshold {threshold:g} s)")
        + (f"; idle buckets {list(lag.idle_buckets)}" if lag.idle_buckets else "")
    )
    console.print(
        f"bad records: {bad:,} (in table {dead_letters}); records skipped because retention "
        f"removed them unread: {skipped:,}"
    )
    Console().print(_history_table(history))


def _bucket_table(
    config: PipelineConfig,
    generation: Generation,
    phase: str,
    progress: BacklogProgress,
    topic: Source,
) -> Table:
    """Per bucket: its range, how far it is, and where its next records are held."""
    done = {b.bucket: f"{b.percent:.0f} %" for b in progress.buckets}
    table = Table(
        title=f"{config.name}: {phase}, generation {generation.number} ({generation.reason})"
    )
    for column in ("bucket", "start", "marker", "reached", "done", "reading from"):
        table.add_column(column, justify="right")
    for b in generation.buckets.values():
        table.add_row(
            str(b.bucket),
            f"{b.start:,}",
            f"{b.marker:,}",
            f"{b.reached:,}",
            done[b.bucket],
            topic.held_by(b.bucket, b.reached) if b.reached < b.marker else "",
        )
    return table


def _history_table(history: list[PhaseChange]) -> Table:
    changes = Table(title="phase history")
    for column in ("generation", "phase", "changed at (UTC)", "watermark lag (s)", "cause"):
        changes.add_column(column)
    for change in history:
        changes.add_row(
            str(change.generation),
            change.phase,
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(change.changed_at)),
            "" if change.lag_s is None else f"{change.lag_s:,.1f}",
            change.cause,
        )
    return changes


@pipeline_group.command("reset")
@defs_file
@click.option("--reason", default="reset by the user", show_default=True)
@click.confirmation_option(
    prompt="Reset clears the pipeline's results and takes new markers. Go on?"
)
def reset(defs_yaml: Path, reason: str) -> None:
    """Start over: new boundary markers at the log's end (a new generation), results cleared."""
    from backlog_dagster.phases.markers import reset as reset_markers

    config = pipeline_of(defs_yaml)
    with naming_the_file(defs_yaml), open_sink(config) as sink, open_source(config) as topic:
        reset_markers(sink, topic, config, reason, console.print)


@pipeline_group.command("realtime")
@defs_file
@click.option(
    "--seconds",
    type=float,
    default=None,
    help="Stop after this long (default: on Ctrl-C or SIGTERM).",
)
def realtime(defs_yaml: Path, seconds: float | None) -> None:
    """Run the realtime phase from where the sink's progress stands, until stopped."""
    import signal
    import tempfile

    from backlog_dagster.phases.realtime import RealtimeRun, run_realtime

    config = pipeline_of(defs_yaml)
    stop_at = None if seconds is None else time.monotonic() + seconds
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    with (
        naming_the_file(defs_yaml),
        pipeline_spark(config, "realtime") as spark,
        open_sink(config) as sink,
        open_sink(config) as status_sink,
        tempfile.TemporaryDirectory(prefix="realtime-checkpoint-") as checkpoint,
        stopping_reopened(lambda: new_pipeline_session(config, "realtime")) as reopen,
    ):
        _quiet(spark)
        status = run_realtime(
            spark,
            config,
            sink,
            status_sink,
            RealtimeRun(
                checkpoint_dir=Path(checkpoint),
                should_stop=lambda: (
                    stopping or (stop_at is not None and time.monotonic() >= stop_at)
                ),
                log=console.print,
                on_status=lambda s: console.print(
                    f"realtime: {s.batches} batches, {s.records:,} records, lag "
                    f"{sum(s.offset_lag.values()):,} records, {s.records_per_s:,.0f} records/s"
                ),
            ),
            reopen=reopen,
        )
    console.print(
        f"realtime of {config.name} stopped: {status.batches} batches, "
        f"{status.records:,} records, {status.late_records:,} late"
    )


def _quiet(spark: SparkSession) -> None:
    """Spark's warnings would drown the progress lines (a remote session logs elsewhere)."""
    from pyspark.sql.utils import is_remote

    if not is_remote():
        spark.sparkContext.setLogLevel("ERROR")
