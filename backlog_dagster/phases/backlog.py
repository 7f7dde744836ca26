"""The backlog phase: every record from the start offsets up to the markers, for throughput.

A Spark *batch* plan, not micro-batches: adaptive query execution on, shuffle partitions
sized to the data, each chunk aggregated in one pass so each key's result is written
once per chunk. No watermark: event-time windows take every record, however late.

- ``checkpoint_interval == 0``: one chunk, the whole backlog, committed once at the end.
  A failure leaves nothing in the sink and the next run starts from the start.
- ``checkpoint_interval > 0``: chunks sized to take about that long, and at least about
  2 s (``phases.chunks``, from the latest Spark jobs' timings; a chunk that took under
  half the interval reads on in another job, their results merged); each chunk's
  results and progress commit together, and a failure resumes from the last commit. A
  chunk commits on a thread of its own while the next chunk's Spark job runs (the sink
  is used by one thread at a time), so the sink's commit does not add to each chunk's
  time; chunks still commit in order, and the next one is counted only once the one
  before is in.

With ``backlog.watermark_lag_threshold``, reaching the markers with the watermark still
lagging by more than the threshold (records kept arriving while the backlog ran) takes
new markers at the log's end and goes on in the same run: a new run would spend its
Spark start again, and when one round takes longer than the threshold the lag would
never come down (measured: rounds ending 130 to 141 s behind against a 120 s threshold).

With markers, the same happens when more than ``backlog.residual_records`` records
arrived while the backlog ran (``policy.residual_says_backlog``): realtime would clear
them far slower than a batch round does.

On a Spark Connect server that starts again under the run (``run_backlog``'s
``reopen``), the run goes on in a new session from the sink's last commit, as the next
run would have, without waiting for the sensor to start one.

Each commit also records, per bucket, the latest event time read: the watermark the
lag strategy measures (observed in the same Spark job, not by a second pass). With
``backlog.boundary: none`` the switch may end the backlog before the markers; the run
then stops at its next commit and the realtime phase continues from there.
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backlog_dagster.implementations import open_source
from backlog_dagster.phases.background import in_background
from backlog_dagster.phases.bad_records import Aggregated, collect, merged, refuse_bad_records
from backlog_dagster.phases.chunks import chunk_rate, goes_on, next_chunk_records
from backlog_dagster.phases.lock import exclusive_run
from backlog_dagster.phases.markers import current_generation, extend_markers
from backlog_dagster.phases.progress import RunProgress, previous_chunk_rate
from backlog_dagster.phases.reference import Reference, read_reference
from backlog_dagster.phases.transform import (
    check_against_source,
    partial_results,
    read_schema,
    watch_buckets,
)
from backlog_dagster.phases.truncation import handle_truncation, removed_unread
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.results import ResultLayout, layout_of
from backlog_dagster.sink import BucketState, Generation, Sink, open_sink
from backlog_dagster.source import Source
from backlog_dagster.source.spark import share_read_limit
from backlog_dagster.spark.session import (
    Reopen,
    reopened_after_restart,
    runs_elsewhere,
)
from backlog_dagster.spark.task_progress import TasksDone, watching_tasks

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: A backlog read in one chunk (``checkpoint_interval: 0``) commits only at its end, so
#: until then its progress and ETA come from its finished read tasks: it reads in at
#: least this many, records allowing (``one_chunk_read_tasks``). Chunks commit every
#: interval and read in as many tasks as Spark runs at once (``source.spark.read_ranges``
#: says why not more).
ONE_CHUNK_READ_TASKS = 8
#: ... each of at least this many records: each read task hands the shuffle a row per
#: key it saw, so small tasks cost. Measured on the example's 100,000 customers, 4,000,000
#: records on 2 cores, the job alone (medians of 9): 0.92 s in 2 or 4 tasks, 1.06 s in 8;
#: the whole backlog run (one warm session, medians of 16, the order alternating): 527 ms
#: in 2 tasks, 545 ms in 4 (the median pair 25 ms apart; the runs spread over 200 ms). A
#: backlog of under 16,000,000 records takes seconds at the JVM reader's rate, so fewer
#: progress steps cost little.
ONE_CHUNK_RECORDS_PER_TASK = 2_000_000


@dataclass
class BacklogReport:
    generation: int
    rows_read: int = 0
    rows_written: int = 0
    #: Records set aside in the dead-letter table by this run.
    bad_records: int = 0
    #: Records skipped because retention removed them before this run read them.
    skipped_records: int = 0
    chunks: int = 0
    seconds: float = 0.0
    #: Each Spark job: (records, seconds from its start until the next job could start:
    #: the job, and any wait for the chunk before to commit). The next job is sized by
    #: them (``phases.chunks``).
    job_timings: list[tuple[int, float]] = field(default_factory=list)
    #: Each chunk committed, read by one job or more: (records, seconds from the start of
    #: its first job until the next chunk's could start).
    chunk_timings: list[tuple[int, float]] = field(default_factory=list)
    #: Each committed chunk's sink commit (s), made while the next chunk's job ran.
    chunk_commits_s: list[float] = field(default_factory=list)
    #: The rate of the pipeline's previous backlog run's last chunks, as it left it in
    #: the sink (``RunProgress.chunk_rate``): this run's first chunk is sized by it.
    previous_chunk_rate: float | None = None
    buckets: dict[int, BucketState] = field(default_factory=dict)
    #: Per bucket, the parts of the source its backlog was read from ("archive, log").
    read_from: dict[int, str] = field(default_factory=dict)
    #: The Spark settings the batch plan ran with: the phase's spark_conf and those the
    #: backlog sets itself (the last round's).
    spark_settings: dict[str, str] = field(default_factory=dict)
    #: When the first chunk began (Unix s): the run's reading rate counts from there.
    reading_since: float | None = None
    #: The chunk under way: per bucket its start and its end offsets (None between chunks).
    chunk: tuple[dict[int, int], dict[int, int]] | None = None
    #: Per bucket, the end of the last chunk whose Spark job ended (its commit may still
    #: be in flight): what the run has read, for its published progress.
    read_to: dict[int, int] = field(default_factory=dict)
    #: Times the run went on in a new session because its Spark Connect server started
    #: again under it (``run_backlog``'s ``reopen``).
    server_restarts: int = 0

    @property
    def records_per_second(self) -> float:
        return self.rows_read / self.seconds if self.seconds else 0.0


def batch_settings(config: PipelineConfig, records: int) -> dict[str, str]:
    """The backlog's Spark settings: adaptive query execution as configured (on unless
    turned off), shuffle partitions sized to the data unless set. A key the phase's
    ``spark_conf`` sets itself is left to it."""
    backlog = config.backlog
    if backlog.shuffle_partitions == "auto":
        partitions = max(1, min(200, math.ceil(records / backlog.records_per_shuffle_partition)))
    else:
        partitions = backlog.shuffle_partitions
    adaptive = str(backlog.adaptive_query_execution).lower()
    settings = {
        "spark.sql.adaptive.enabled": adaptive,
        "spark.sql.adaptive.coalescePartitions.enabled": adaptive,
        "spark.sql.shuffle.partitions": str(partitions),
    }
    return {key: value for key, value in settings.items() if key not in backlog.spark_conf}


def run_backlog(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    *,
    checkpoint_interval: float | None = None,
    log: Callable[[str], None] = print,
    run_id: str = "",
    reopen: Reopen | None = None,
) -> BacklogReport:
    """Process the backlog up to the markers; return what was done.

    Refused (``PhaseAlreadyRunning``) while another run of the pipeline is going. While
    it works, the run publishes its progress in the sink every ``switch.status_every``
    (``phases.progress``), as ``run_id`` when given. ``reopen``: a new session like
    ``spark``, for when ``spark`` is a Spark Connect session whose server started again
    under the backlog (``server_restarted``): the run then closes ``spark`` and goes on
    in a new session from the sink's last commit rather than failing
    (``BacklogReport.server_restarts``). The caller stops the last session ``reopen``
    gave, or hands it on (``stopping_reopened`` stops them all).
    """
    with exclusive_run(sink, config, "backlog"):
        return _run_backlog(spark, config, sink, checkpoint_interval, log, run_id, reopen)


def _run_backlog(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    checkpoint_interval: float | None,
    log: Callable[[str], None],
    run_id: str,
    reopen: Reopen | None,
) -> BacklogReport:
    interval = (
        config.backlog.checkpoint_interval if checkpoint_interval is None else checkpoint_interval
    )
    started = time.monotonic()
    with open_source(config) as topic:
        check_against_source(config, topic)
        if runs_elsewhere(spark):
            topic.check_reachable(spark)
        generation = current_generation(sink, topic, config, log)
        generation, skipped = _past_removed(sink, topic, config, generation, log)
        read_from = _parts(topic, generation)
    report = BacklogReport(
        generation.number,
        skipped_records=skipped,
        read_from=read_from,
        previous_chunk_rate=previous_chunk_rate(sink),
    )
    # Read to the markers, then to new ones while the watermark lag or the records that
    # arrived meanwhile ask for them.
    residual = None
    while True:
        try:
            with publishing_progress(spark, config, report, run_id or "backlog", log):
                while True:
                    generation = _read_to_markers(
                        spark, config, sink, generation, interval, report, log
                    )
                    with open_source(config) as topic:
                        extended = extend_markers(sink, topic, config, log, residual)
                    if extended is None:
                        break
                    generation = extended
                    residual = _left(generation)
                    report.generation = generation.number
            break
        except Exception as lost:
            # The chunk's Spark job went with the server, and any chunk committed before
            # it is in the sink (a failed job waits for the commit in flight): go on from
            # there in a new session on the server started again, as the next run would.
            reopened = reopened_after_restart(spark, lost, reopen, log, "backlog")
            if reopened is None:
                raise
            spark = reopened
            report.server_restarts += 1
            report.chunk = None
            with open_source(config) as topic:
                generation = current_generation(sink, topic, config, log)
            report.generation = generation.number
    report.seconds = time.monotonic() - started
    report.buckets = generation.buckets
    return report


@contextmanager
def publishing_progress(
    spark: SparkSession,
    config: PipelineConfig,
    report: BacklogReport,
    run_id: str,
    log: Callable[[str], None],
) -> Iterator[None]:
    """While the block runs, publish the run's ``RunProgress`` in the sink every
    ``switch.status_every``, from a thread with a sink connection of its own: the
    records of the chunk under way are estimated from Spark's finished read tasks, so
    a backlog committed in one chunk shows progress too."""
    with watching_tasks(spark) as tasks_done:

        def keep_publishing(stop: threading.Event) -> None:
            estimate = _Estimate(report, tasks_done)
            with open_sink(config) as sink, open_source(config) as topic:

                def publish_for_show() -> None:
                    try:
                        progress = estimate.progress(run_id, topic)
                        sink.publish_progress(run_id, progress.to_json())
                    except Exception as error:  # progress is for show: never fail the run
                        log(f"backlog: progress not published: {error}")

                while not stop.wait(config.switch.status_every):
                    publish_for_show()
                # Once more as the run ends: all it read, and the rate of its last chunks,
                # which the pipeline's next backlog run sizes its first chunk by.
                publish_for_show()

        with in_background("backlog-progress", keep_publishing):
            yield


@dataclass
class _Estimate:
    """A backlog run's progress as it goes: what it committed and read, the share of the
    chunk under way its finished read tasks say, and how fast records arrive."""

    report: BacklogReport
    tasks_done: TasksDone
    #: (time, records held by the source): the arrival rate over the last half minute.
    held: deque[tuple[float, int]] = field(default_factory=deque)
    #: The chunk last estimated, and the most of its read tasks seen done: between the
    #: Spark jobs of one chunk no job is active, and its estimate must not go back.
    estimated: tuple[object, float] = (None, 0.0)

    def progress(self, run_id: str, topic: Source) -> RunProgress:
        now, report = time.time(), self.report
        read_to, rows_read = self._read_so_far()
        return RunProgress(
            run_id=run_id,
            generation=report.generation,
            started_at=report.reading_since or now,
            at=now,
            records_read=rows_read,
            read_to=read_to,
            arrival_per_s=self._arrival_per_s(now, sum(topic.latest_offsets().values())),
            chunk_rate=(
                chunk_rate(timings)
                if (timings := report.job_timings)
                else report.previous_chunk_rate
            ),
        )

    def _arrival_per_s(self, now: float, held_now: int) -> float:
        held = self.held
        held.append((now, held_now))
        while len(held) > 2 and now - held[1][0] >= 30:
            held.popleft()
        (first_at, first), (last_at, last) = held[0], held[-1]
        return max(0.0, (last - first) / (last_at - first_at) if last_at > first_at else 0.0)

    def _read_so_far(self) -> tuple[dict[int, int], int]:
        """Per bucket how far the run read, and how many records, with the chunk under
        way counted by its share of read tasks done."""
        # One read each: the run replaces them whole.
        report = self.report
        chunk, read_to, rows_read = report.chunk, dict(report.read_to), report.rows_read
        if chunk is not None:
            done = self.tasks_done() or 0.0
            share = max(self.estimated[1] if self.estimated[0] is chunk else 0.0, done)
            self.estimated = (chunk, share)
            start, end = chunk
            under_way = {b: int((end[b] - low) * share) for b, low in start.items()}
            read_to |= {b: start[b] + n for b, n in under_way.items()}
            rows_read += sum(under_way.values())
        return read_to, rows_read


def _read_to_markers(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    generation: Generation,
    interval: float,
    report: BacklogReport,
    log: Callable[[str], None],
) -> Generation:
    """Read, aggregate and commit chunk by chunk up to the markers; the generation after."""
    left = _left(generation)
    _set_batch_settings(spark, config, left, report, log)
    if left:
        log(f"backlog: {left:,} records to read up to the markers, {_chunking(interval, report)}")
    reference = _reference_of(config, sink, left, log)
    committed = _Commits(report, log, realtime=_moved_to_realtime(sink, config))
    # One source for the loop (the commit thread opens its own): opened anew for each
    # job it cost a log's bucket files opened three times over, a Kafka admin client each.
    with (
        open_source(config) as topic,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="backlog-commit") as committer,
    ):
        chunks = _Chunks(spark, config, sink, topic, committer, committed, reference)
        chunks.generation, chunks.interval = generation, interval
        chunks.tasks = one_chunk_read_tasks(left) if interval == 0 else None
        while chunks.left > 0 and not committed.realtime and chunks.read_one_job():
            pass
        committed.wait()
    if committed.realtime:
        log("backlog: the switch moved the pipeline to realtime; stopping here")
    return chunks.generation


def _set_batch_settings(
    spark: SparkSession,
    config: PipelineConfig,
    left: int,
    report: BacklogReport,
    log: Callable[[str], None],
) -> None:
    """The batch plan's settings on the session, as the report and the log give them."""
    settings = batch_settings(config, left)
    for key, value in settings.items():
        spark.conf.set(key, value)
    report.spark_settings = {**config.backlog.spark_conf, **settings}
    log("backlog: Spark settings " + ", ".join(f"{k}={v}" for k, v in settings.items()))


def _reference_of(
    config: PipelineConfig, sink: Sink, left: int, log: Callable[[str], None]
) -> Reference | None:
    """The reference data the backlog joins, when it joins one and has records to read."""
    join = config.transform.join
    if join is None or left == 0:
        return None
    reference = read_reference(config, sink)
    log(
        f"backlog: joining {join.describe()}, {reference.table.num_rows:,} rows, "
        f"version {reference.version}"
    )
    return reference


@dataclass
class _Chunks:
    """The backlog's chunks as they are read and committed (``_read_to_markers``): a
    chunk reads in one or more Spark jobs, then commits on the commit thread while the
    next chunk's first job reads."""

    spark: SparkSession
    config: PipelineConfig
    sink: Sink
    topic: Source
    committer: ThreadPoolExecutor
    committed: _Commits
    reference: Reference | None
    generation: Generation = field(init=False)
    #: The checkpoint interval chunks are sized to (s; 0: one chunk).
    interval: float = field(init=False)
    tasks: int | None = field(init=False)
    #: The chunk being read, its commit still to come, when it reads on in another job.
    reading: _Reading | None = None
    layout: ResultLayout = field(init=False)

    def __post_init__(self) -> None:
        self.layout = layout_of(self.config.transform)

    @property
    def left(self) -> int:
        return _left(self.generation)

    @property
    def report(self) -> BacklogReport:
        return self.committed.report

    def read_one_job(self) -> bool:
        """Read the next job's records (after committing what a gap left by retention
        needs in first); False when nothing is left to read."""
        budget = self._budget()
        self._commit_before_a_gap()
        self._skip_removed()
        if self.left == 0:
            return False
        start = {b: s.reached for b, s in self.generation.buckets.items()}
        grant = share_read_limit(
            {str(b): max(0, s.marker - s.reached) for b, s in self.generation.buckets.items()},
            budget,
        )
        end = _within_held(self.topic, start, {b: start[b] + grant[str(b)] for b in start})
        job_started = time.monotonic()
        self.report.reading_since = self.report.reading_since or time.time()
        self.report.chunk = (start, end)
        try:
            aggregated, event_times = _aggregate(
                self.spark, self.config, self.topic, start, end, self.reference, self.tasks
            )
        except Exception:
            self.report.chunk = None
            self._commit_reading()
            self.committed.wait()
            # A range may have vanished under the job (retention): say so, or skip it.
            if not removed_unread(self.generation, self.topic):
                raise
            self._skip_removed()
            return True
        cut_short = any(end[b] < start[b] + grant[str(b)] for b in start)  # a hole
        self._read((start, end), job_started, aggregated, event_times, cut_short)
        return True

    def _budget(self) -> int:
        """How many records the next job reads: all that are left for one chunk, else
        what fits the rest of the chunk's interval."""
        if self.interval == 0:
            return self.left
        return next_chunk_records(
            self.interval,
            self.report.job_timings,
            self.left,
            self.report.previous_chunk_rate,
            0.0 if self.reading is None else time.monotonic() - self.reading.began,
        )

    def _commit_before_a_gap(self) -> None:
        """Where retention removed records not read yet, what was read (good: in before
        the gap) commits first; the sink moves past the gap after it."""
        in_hand = self.committed.pending is not None or self.reading is not None
        if in_hand and removed_unread(self.generation, self.topic):
            self._commit_reading()
            self.committed.wait()

    def _skip_removed(self) -> None:
        self.generation, skipped = _past_removed(
            self.sink, self.topic, self.config, self.generation, self.committed.log
        )
        self.report.skipped_records += skipped

    def _read(
        self,
        job: tuple[dict[int, int], dict[int, int]],
        job_started: float,
        aggregated: Aggregated,
        event_times: dict[int, int | None],
        cut_short: bool,
    ) -> None:
        """Count a job's records in, and commit its chunk unless it reads on."""
        start, end = job
        records = sum(end[b] - start[b] for b in start)
        report = self.report
        report.read_to = {**report.read_to, **end}
        report.rows_read += records
        report.chunk = None
        refuse_bad_records(self.config, aggregated.dead_letters)
        self.committed.wait()
        # Its job, and any wait for the chunk before it: when the next job can start.
        report.job_timings.append((records, time.monotonic() - job_started))
        self.generation = _reached(self.generation, end)
        self.reading = (
            _Reading(job_started, start, end, (aggregated,), event_times)
            if self.reading is None
            else self.reading.then(start, end, aggregated, event_times)
        )
        if (
            self.left > 0
            and not cut_short
            and not self.committed.realtime
            and goes_on(self.interval, time.monotonic() - self.reading.began)
        ):
            return
        self._commit_reading()

    def _commit_reading(self) -> None:
        """Commit the chunk being read, if one is, on the commit thread, once the chunk
        before it is in."""
        chunk, self.reading = self.reading, None
        if chunk is None:
            return
        self.committed.wait()
        seconds = time.monotonic() - chunk.began
        self.report.chunk_timings.append((chunk.records, seconds))
        aggregated = merged(chunk.jobs, self.layout)
        done = functools.partial(
            _commit,
            self.sink,
            self.config,
            self.generation,
            chunk,
            aggregated,
            None if self.reference is None else self.reference.version,
            seconds,
            _held_by(self.topic, self.generation),
        )
        self.committed.pending = _InFlight(self.committer.submit(done), aggregated)


def one_chunk_read_tasks(records: int) -> int:
    """The read tasks a one-chunk backlog of ``records`` asks for: up to
    ``ONE_CHUNK_READ_TASKS``, none under ``ONE_CHUNK_RECORDS_PER_TASK`` records (Spark
    reads in at least as many as it runs at once, and big reads in more: no task is
    over ``source.spark.DEFAULT_MAX_RECORDS_PER_PARTITION`` records)."""
    return max(1, min(ONE_CHUNK_READ_TASKS, records // ONE_CHUNK_RECORDS_PER_TASK))


def _chunking(interval: float, report: BacklogReport) -> str:
    """How the backlog is cut, for the log: ``chunks of about 2 s, the first sized by
    the previous backlog run's 2,400,000 records/s``."""
    if interval == 0:
        return "one chunk"
    if report.job_timings or not report.previous_chunk_rate:
        return f"chunks of about {interval:g} s"
    return (
        f"chunks of about {interval:g} s, the first sized by the previous backlog run's "
        f"{report.previous_chunk_rate:,.0f} records/s"
    )


@dataclass(frozen=True)
class _Reading:
    """A chunk read so far by one or more Spark jobs, its commit still to come."""

    #: When its first job started (``time.monotonic()``).
    began: float
    #: Per bucket, the offsets it starts and ends at.
    start: dict[int, int]
    end: dict[int, int]
    jobs: tuple[Aggregated, ...]
    #: Per bucket, the latest event time read.
    event_times: dict[int, int | None]

    @property
    def records(self) -> int:
        return sum(self.end[b] - self.start[b] for b in self.start)

    def then(
        self,
        start: dict[int, int],
        end: dict[int, int],
        job: Aggregated,
        event_times: dict[int, int | None],
    ) -> _Reading:
        """The chunk read on by ``job``, from ``start`` (where the chunk ended so far, or
        a bucket's start if it is new) to ``end``."""
        latest = {
            b: max(
                (t for t in (self.event_times.get(b), event_times.get(b)) if t is not None),
                default=None,
            )
            for b in self.event_times.keys() | event_times.keys()
        }
        began_at = {**start, **self.start}
        return _Reading(self.began, began_at, {**self.end, **end}, (*self.jobs, job), latest)


@dataclass(frozen=True)
class _InFlight:
    """A chunk whose commit runs on the commit thread while the next chunk's job runs."""

    commit: Future[_Committed]
    aggregated: Aggregated


@dataclass(frozen=True)
class _Committed:
    seconds: float
    #: What to log about the chunk.
    lines: tuple[str, ...]
    #: With ``backlog.boundary: none``: the switch moved the pipeline to realtime.
    realtime: bool


def _commit(
    sink: Sink,
    config: PipelineConfig,
    generation: Generation,
    chunk: _Reading,
    aggregated: Aggregated,
    joined: str | None,
    read_s: float,
    held_by: dict[int, str],
) -> _Committed:
    """Commit a chunk (on the commit thread, the only user of ``sink`` meanwhile) with
    ``aggregated``, its jobs' results merged; ``generation`` is as it stands after it,
    ``read_s`` the time its jobs took, ``held_by`` which part of the source holds each
    unfinished bucket's next record."""
    committing = time.monotonic()
    sink.commit(
        generation.number,
        chunk.start,
        chunk.end,
        aggregated.results,
        event_times=chunk.event_times,
        dead_letters=aggregated.dead_letters,
        joined=joined,
    )
    seconds = time.monotonic() - committing
    lines = []
    if aggregated.dead_letters.num_rows:
        lines.append(
            f"backlog: {aggregated.dead_letters.num_rows:,} bad record(s) in this chunk "
            f"went to {config.sink.table}_dead_letters"
        )
    lines.append(_progress_line(generation, chunk, read_s, seconds, held_by))
    return _Committed(seconds, tuple(lines), _moved_to_realtime(sink, config))


def _moved_to_realtime(sink: Sink, config: PipelineConfig) -> bool:
    """With ``backlog.boundary: none``: whether the switch moved the pipeline to realtime
    (the run then stops at its next commit)."""
    return config.backlog.boundary == "none" and sink.phase() == "realtime"


@dataclass
class _Commits:
    """The chunk whose commit is in flight, if one is, and what the committed chunks add
    to the report, as each commit is waited for."""

    report: BacklogReport
    log: Callable[[str], None]
    realtime: bool = False
    pending: _InFlight | None = None

    def wait(self) -> None:
        """Wait for the commit in flight, if any (raising what it raised), and count it."""
        chunk, self.pending = self.pending, None
        if chunk is None:
            return
        done = chunk.commit.result()
        report, dead = self.report, chunk.aggregated.dead_letters
        report.chunk_commits_s.append(done.seconds)
        report.rows_written += chunk.aggregated.results.num_rows
        report.bad_records += dead.num_rows
        report.chunks += 1
        for line in done.lines:
            self.log(line)
        self.realtime = self.realtime or done.realtime


def _within_held(topic: Source, start: dict[int, int], end: dict[int, int]) -> dict[int, int]:
    """``end``, cut where a bucket's stretch of held records ends first (a hole between
    archive files): the chunk commits up to the hole, and the next one deals with it."""
    cut = dict(end)
    for bucket, low in start.items():
        first, stretch_end = topic.held_from(bucket, low)
        if first == low and stretch_end is not None:
            cut[bucket] = min(end[bucket], stretch_end)
    return cut


def _parts(topic: Source, generation: Generation) -> dict[int, str]:
    """Per bucket, the parts of the source that hold its backlog, first to last."""
    parts = {}
    for b in generation.buckets.values():
        if b.reached >= b.marker:
            parts[b.bucket] = ""
            continue
        first, last = topic.held_by(b.bucket, b.reached), topic.held_by(b.bucket, b.marker - 1)
        parts[b.bucket] = first if first == last else f"{first}, {last}"
    return parts


def _left(generation: Generation) -> int:
    return sum(max(0, b.marker - b.reached) for b in generation.buckets.values())


def _past_removed(
    sink: Sink,
    topic: Source,
    config: PipelineConfig,
    generation: Generation,
    log: Callable[[str], None],
) -> tuple[Generation, int]:
    """The generation past any records retention removed unread, and how many it skipped."""
    before = sum(b.reached for b in generation.buckets.values())
    generation = handle_truncation(sink, topic, config, generation, log)
    return generation, sum(b.reached for b in generation.buckets.values()) - before


def _aggregate(
    spark: SparkSession,
    config: PipelineConfig,
    topic: Source,
    start: dict[int, int],
    end: dict[int, int],
    reference: Reference | None,
    tasks: int | None,
) -> tuple[Aggregated, dict[int, int | None]]:
    """The chunk's partial results, and each bucket's latest event time read (in at
    least ``tasks`` read tasks)."""
    records = topic.read_batch(spark, read_schema(config, topic), start, end, tasks)
    watched, seen = watch_buckets(records, config, topic, start, end)
    aggregated = collect(partial_results(watched, config, reference=reference))
    return aggregated, {b: s.event_time_us for b, s in (seen() or {}).items()}


def _reached(generation: Generation, end: dict[int, int]) -> Generation:
    buckets = {
        b: BucketState(s.bucket, s.start, s.marker, end.get(b, s.reached), s.event_time_us)
        for b, s in generation.buckets.items()
    }
    return Generation(
        generation.number, generation.created_at, generation.reason, generation.definition, buckets
    )


def _held_by(topic: Source, generation: Generation) -> dict[int, str]:
    """Which part of the source holds each unfinished bucket's next record, as the UI says
    it (asked on the reading thread: the commit thread's line says it)."""
    return {
        b.bucket: topic.held_by(b.bucket, b.reached)
        for b in generation.buckets.values()
        if b.reached < b.marker
    }


def _progress_line(
    generation: Generation,
    chunk: _Reading,
    read_s: float,
    commit_s: float,
    held_by: dict[int, str],
) -> str:
    """The line a chunk logs; an unfinished bucket says which part of the source it is in."""
    records, jobs = chunk.records, len(chunk.jobs)
    total = sum(b.marker - b.start for b in generation.buckets.values())
    done = sum(b.reached - b.start for b in generation.buckets.values())
    per_bucket = "  ".join(
        f"{b.bucket}:{_percent(b.reached - b.start, b.marker - b.start)}"
        + (f" {held_by[b.bucket]}" if b.bucket in held_by else "")
        for b in generation.buckets.values()
    )
    in_jobs = f", {jobs} Spark jobs" if jobs > 1 else ""
    return (
        f"backlog {_percent(done, total)} ({done:,}/{total:,}); chunk of {records:,} in "
        f"{read_s:.1f} s ({records / max(read_s, 1e-3):,.0f}/s{in_jobs}), then the sink's "
        f"commit {commit_s:.1f} s; buckets {per_bucket}"
    )


def _percent(done: int, total: int) -> str:
    return "100%" if total == 0 else f"{100 * done / total:.0f}%"
