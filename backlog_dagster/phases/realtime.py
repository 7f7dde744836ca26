"""The realtime phase: a Structured Streaming query that continues exactly at the markers.

State handoff (FLIP-327): the backlog left its per-key state in the sink as mergeable
partial results. Each micro-batch here aggregates only its own records into partials
and merges them into that state, so no key restarts from zero and nothing before the
markers is read again.

Exactly once: each micro-batch's results and the offsets it covered commit in one sink
transaction, and every query starts from the offsets the sink holds (not from Spark's
own checkpoint), so a crash at any point either committed a batch or left no trace of
it, and the next run reads it again. The commit (``phases.micro_batch``) runs wherever
Spark runs ``foreachBatch`` (here, or on a Spark Connect server), so this run learns
what was committed from the sink, and a query whose run died commits nothing more.

The run ends by itself when a newer generation replaces the one it started in (the
switch went back into backlog, or a reset): a batch it could still try to commit lands
nowhere (its commit sees the newer generation, or the sink refuses it), and the query
stops.

Event-time windows: a record whose window ended at or before the watermark
(``phases.watermark``: per bucket the latest event time less the allowed lateness, the
smallest over the active buckets) is late. It is not merged: it goes to the sink's late
table with its bucket, offset, event time and that watermark. Where the event time is
the log's record time, the watermark is taken as it stood when the record was appended:
lateness then does not depend on how far behind the run is, how micro-batches were cut
or when a run crashed. For another event-time column the log cannot tell event time by
arrival, and the watermark is taken at the committed progress when the batch runs.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from backlog_dagster import implementations
from backlog_dagster import sink as sinks
from backlog_dagster.implementations import open_source
from backlog_dagster.phases.lag import watermark_lag
from backlog_dagster.phases.lock import PhaseAlreadyRunning, exclusive_run
from backlog_dagster.phases.markers import current_generation
from backlog_dagster.phases.micro_batch import (
    MicroBatchCommit,
    moved_under,
    refusal_in,
    unreachable_in,
)
from backlog_dagster.phases.progress import realtime_lag
from backlog_dagster.phases.query_start import QueryStart, start_file, write_start
from backlog_dagster.phases.transform import check_against_source, read_schema
from backlog_dagster.phases.truncation import handle_truncation, removed_unread
from backlog_dagster.phases.watermark import judged_by_arrival
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, Sink, SinkUnreachable
from backlog_dagster.source import Source
from backlog_dagster.spark.session import (
    Reopen,
    connect_session_closed,
    reopened_after_restart,
    runs_elsewhere,
)
from backlog_dagster.waiting import until

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import DataStreamReader, DataStreamWriter, StreamingQuery


class BacklogNotFinished(RuntimeError):
    """The realtime phase was asked to start before every bucket reached its marker."""


@dataclass
class RealtimeStatus:
    """What the realtime run reports at a steady cadence."""

    batches: int = 0
    records: int = 0
    late_records: int = 0
    #: Records set aside in the dead-letter table.
    bad_records: int = 0
    offsets: dict[int, int] = field(default_factory=dict)
    offset_lag: dict[int, int] = field(default_factory=dict)
    watermark: str | None = None
    #: Now less the latest event time committed: the watermark lag net of the allowed
    #: lateness, the input's seconds realtime trails by.
    input_lag_s: float | None = None
    #: Records committed per second since the status before (Spark's own rate counts
    #: only what its scan read, and a small micro-batch is read by the commit).
    records_per_s: float = 0.0
    #: Micro-batches of the queries before the current one (after a truncation restart).
    batches_before_restart: int = 0
    #: When ``records`` was counted before (monotonic s), and what it was.
    counted: tuple[float, int] | None = None


#: With ``max_records_per_trigger: auto``: a micro-batch reads at most this many records
#: per second of the checkpoint interval, and at least ``AUTO_READ_LIMIT_FLOOR``. Realtime
#: catches up at most at the limit over the interval: with a fixed 100,000 records at the
#: example's 2 s, that was 50,000 records/s, of which the live input took 20,000, while
#: Spark took 0.8 s for a 100,000-record micro-batch in a warm process (bench notes in
#: ``phases.micro_batch``).
AUTO_READ_LIMIT_PER_S = 250_000
AUTO_READ_LIMIT_FLOOR = 100_000


#: What Spark says when a new Python worker (the one that runs a query's
#: ``foreachBatch`` at its start, its stream reader's once it runs) did not connect back
#: within its fixed 10 s: on a machine busy with
#: backlogs its start can take longer (it imports PySpark and pandas first: 1.0 s of CPU
#: on an idle machine, past 10 s at a load of 13 on 2 cores). The query did not start;
#: starting it again is safe, where the run would otherwise fail and the sensor start
#: another, whose Dagster process and Spark session cost more than the wait.
WORKER_SLOW_TO_START = "Python worker failed to connect back"
#: What Spark says when one of its Python workers died under a running query: on a Spark
#: Connect server the one running the query's ``foreachBatch`` (killed, or out of
#: memory), or a stream reader's. A commit under way landed whole or left nothing (one
#: sink transaction), so the query goes on from the sink's progress, as after a worker
#: slow to start, rather than the run failing for the sensor to start another.
WORKER_EXITED = "Python worker exited unexpectedly"
QUERY_START_ATTEMPTS = 6
#: The waits between attempts grow from the first to the longest (s): a busy machine's
#: load comes in waves (runs starting, other backlogs' chunks), and each attempt costs
#: the machine a Python process start. Six attempts span about two minutes.
QUERY_START_FIRST_WAIT_S = 5
QUERY_START_LONGEST_WAIT_S = 30


def read_limit(config: PipelineConfig, interval: float) -> int | None:
    """The realtime query's read limit (records per micro-batch) at ``interval`` s."""
    limit = config.realtime.max_records_per_trigger
    if limit == "auto":
        return max(AUTO_READ_LIMIT_FLOOR, round(AUTO_READ_LIMIT_PER_S * interval))
    return limit


def streaming_settings(config: PipelineConfig, shuffle_partitions: int | None) -> dict[str, str]:
    """A small fixed shuffle partition count, no adaptive re-planning per micro-batch; a
    key the phase's ``spark_conf`` sets itself is left to it."""
    partitions = shuffle_partitions or config.realtime.shuffle_partitions
    settings = {
        "spark.sql.shuffle.partitions": str(partitions),
        "spark.sql.adaptive.enabled": "false",
    }
    return {key: value for key, value in settings.items() if key not in config.realtime.spark_conf}


@dataclass(frozen=True)
class RealtimeRun:
    """How a run drives its realtime query: where its checkpoint goes, when it stops,
    where it says what it does, and the run's own settings over the pipeline's."""

    #: The query's checkpoint folder (the run's own: it is emptied before each start).
    checkpoint_dir: Path
    should_stop: Callable[[], bool] = lambda: False
    log: Callable[[str], None] = print
    on_status: Callable[[RealtimeStatus], None] = lambda status: None
    #: Seconds between two ``on_status`` calls.
    status_every_s: float = 5.0
    #: The micro-batch interval (s); None: the pipeline's ``realtime.checkpoint_interval``.
    checkpoint_interval: float | None = None
    shuffle_partitions: int | None = None

    def interval(self, config: PipelineConfig) -> float:
        return self.checkpoint_interval or config.realtime.checkpoint_interval


def run_realtime(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    status_sink: Sink,
    run: RealtimeRun,
    *,
    armed: ArmedQuery | None = None,
    source_reached: bool = False,
    reopen: Reopen | None = None,
) -> RealtimeStatus:
    """Run micro-batches until ``run.should_stop()``; ``status_sink`` is a second
    connection. ``armed``: the query ``armed_realtime`` started for this run (same config,
    checkpoint folder, interval and shuffle partitions), to go on with instead of
    starting one. ``source_reached``: this session's executors have read the source
    already (the backlog step's session, handed over), so the query start skips that
    check's job. ``reopen``: a new session like ``spark``, for when ``spark`` is a Spark
    Connect session whose server started again under the query (``server_restarted``):
    the run then closes ``spark`` and goes on in a new session rather than failing. The
    caller stops the sessions ``reopen`` gave (``stopping_reopened``).

    Refused (``PhaseAlreadyRunning``) while another run of the pipeline is going.
    """
    holder = _new_holder() if armed is None else armed.holder
    with exclusive_run(sink, config, "realtime", holder=holder):
        generation, schema, stream_reader = _prepared(
            spark, config, sink, run.log, reach=not (source_reached or armed is not None)
        )
        state = _Realtime(
            spark, config, _commit_for(config, holder), (sink, status_sink), run, reopen
        )
        state.generation, state.schema, state.stream_reader = generation, schema, stream_reader
        return _run_realtime(state, None if armed is None else armed.query)


@dataclass(frozen=True)
class ArmedQuery:
    """A realtime query started before it is known where it starts (``armed_realtime``)."""

    query: StreamingQuery
    #: The run lock holder its commits check for: the run that goes on with it.
    holder: str


@contextmanager
def armed_realtime(
    spark: SparkSession,
    config: PipelineConfig,
    run: RealtimeRun,
    *,
    run_id: str | None = None,
    session_settings: Mapping[str, str | None] | None = None,
) -> Iterator[ArmedQuery]:
    """Start the pipeline's realtime query reading nothing, for ``run_realtime`` to go
    on with once the switch says where it starts (``phases.query_start``): so that the
    switch does not wait for a query to start. ``run_id``: the Dagster run arming it;
    the query ends if that run stops beating before the switch. The realtime phase's
    settings go on ``spark``, or, given ``session_settings`` (where a backlog still
    runs on ``spark``: ``arm_beside``), those go on the query's own session with its
    first micro-batch. The query stops on leaving the context, if it is still going.
    """
    with open_source(config) as topic:
        schema = _query_schema(spark, config, topic)
        reader = topic.stream_reader(spark)
    interval = run.interval(config)
    if session_settings is None:
        _apply_settings(spark, config, run.shuffle_partitions, run.log)
    holder = _new_holder()
    shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
    commit = replace(
        _commit_for(config, holder), run_id=run_id, session_settings=dict(session_settings or {})
    )
    query = _start_query(reader, config, schema, commit, interval, run.checkpoint_dir, run.log)
    run.log(
        f"realtime: query armed (micro-batches every {interval:g} s); it reads from the switch on"
    )
    try:
        yield ArmedQuery(query, holder)
    finally:
        _stop(query, spark)


def arm_beside(
    stack: ExitStack,
    spark: SparkSession,
    config: PipelineConfig,
    run: RealtimeRun,
    *,
    run_id: str,
    session_settings: Mapping[str, str | None],
) -> Callable[[], ArmedQuery | None]:
    """``armed_realtime`` in a thread, beside a backlog that runs on ``spark``; what it
    returns waits for the query: None when arming failed (said in the log; the realtime
    run then starts its query itself). The query stops when ``stack`` closes, unless its
    ``pop_all()`` took it over.

    A query's start is mostly waiting (Spark starts a Python process for its
    ``foreachBatch``, another for its stream reader, each importing PySpark, then plans
    its first micro-batch: 6.8 to 8.5 s on an idle Connect server), which the backlog's
    work fills. The backlog's SQL settings stay on ``spark``: the query takes the
    realtime phase's (``session_settings``, with ``streaming_settings``) on its own
    copy of the session, with its first micro-batch.
    """
    settings = {**session_settings, **streaming_settings(config, run.shuffle_partitions)}
    own = ExitStack()

    def arm() -> ArmedQuery:
        return own.enter_context(
            armed_realtime(spark, config, run, run_id=run_id, session_settings=settings)
        )

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="realtime-arming")
    arming = pool.submit(arm)
    pool.shutdown(wait=False)
    # Last in, first out: wait for the arming to end before stopping what it started.
    stack.callback(own.close)
    stack.callback(wait, [arming])

    def armed() -> ArmedQuery | None:
        try:
            return arming.result()
        except Exception as error:  # the realtime run starts its query the usual way
            run.log(f"realtime: the query was not armed during the backlog ({error})")
            return None

    return armed


def _new_holder() -> str:
    return f"realtime run {uuid.uuid4().hex[:12]}"


def _commit_for(config: PipelineConfig, holder: str) -> MicroBatchCommit:
    return MicroBatchCommit(
        implementations.for_other_processes(sinks.for_other_processes(config)), holder
    )


def _query_schema(
    spark: SparkSession, config: PipelineConfig, topic: Source, reach: bool = True
) -> str | None:
    """Check the pipeline against the source (and, with ``reach``, that Spark's executors
    reach it: a Spark job); the schema the query reads in."""
    check_against_source(config, topic)
    if reach and runs_elsewhere(spark):
        topic.check_reachable(spark)
    return read_schema(
        config,
        topic,
        arrival=config.transform.window is not None and judged_by_arrival(config, topic),
    )


def _apply_settings(
    spark: SparkSession,
    config: PipelineConfig,
    shuffle_partitions: int | None,
    log: Callable[[str], None],
) -> None:
    """Set the streaming settings on the session (a query keeps those it started with)."""
    settings = streaming_settings(config, shuffle_partitions)
    for key, value in settings.items():
        spark.conf.set(key, value)
    log("realtime: Spark settings " + ", ".join(f"{k}={v}" for k, v in settings.items()))


@dataclass
class _Realtime:
    """One realtime run across the queries it starts (``_run_realtime``): the session
    it is on (a new one after its Spark Connect server started again), the generation it
    reads and what it has reported."""

    spark: SparkSession
    config: PipelineConfig
    commit: MicroBatchCommit
    #: The run's sink (it holds the run lock) and a second connection, for status.
    sinks: tuple[Sink, Sink]
    run: RealtimeRun
    reopen: Reopen | None
    generation: Generation = field(init=False)
    schema: str | None = field(init=False)
    #: A new reader each time the query (re)starts.
    stream_reader: Callable[[SparkSession], DataStreamReader] = field(init=False)
    status: RealtimeStatus = field(default_factory=RealtimeStatus)
    counts: _Counts = field(init=False)
    #: Queries of this run stopped by a Python worker slow to start once they ran, or
    #: one that died (``_python_worker_lost``).
    worker_stops: int = 0
    #: The session the streaming settings were last set on.
    settled: SparkSession | None = None

    def __post_init__(self) -> None:
        self.counts = _Counts.now(self.status_sink)

    @property
    def sink(self) -> Sink:
        return self.sinks[0]

    @property
    def status_sink(self) -> Sink:
        return self.sinks[1]

    def replaced(self) -> bool:
        return _replaced(self.generation, self.status_sink, self.run.log)

    def afresh(self) -> None:
        """Before a query starts again: an empty checkpoint, and its batches counted."""
        shutil.rmtree(self.run.checkpoint_dir, ignore_errors=True)
        self.status.batches_before_restart = self.status.batches


def _prepared(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    log: Callable[[str], None],
    *,
    reach: bool,
) -> tuple[Generation, str | None, Callable[[SparkSession], DataStreamReader]]:
    """The generation realtime goes on with (after any truncation is handled), the
    schema its query reads in and how to make its reader. ``BacklogNotFinished`` while
    the backlog has not reached its markers."""
    with open_source(config) as topic:
        schema = _query_schema(spark, config, topic, reach=reach)
        generation = current_generation(sink, topic, config, log)
        generation = handle_truncation(sink, topic, config, generation, log)
        stream_reader = topic.stream_reader
    if not generation.finished and config.backlog.boundary == "markers":
        left = {
            b.bucket: b.marker - b.reached for b in generation.buckets.values() if not b.finished
        }
        raise BacklogNotFinished(
            f"pipeline {config.name}: the backlog has not reached the markers yet "
            f"(records left per bucket: {left}); run the backlog first"
        )
    return generation, schema, stream_reader


def _run_realtime(state: _Realtime, armed: StreamingQuery | None) -> RealtimeStatus:
    """Queries one after the other until the run stops: a query that failed starts again
    where that is safe (``_recovered``), and a Spark Connect server that started again
    under it is gone on from in a new session."""
    while True:
        try:
            query, error = _one_query(state, armed)
        except Exception as lost:
            # The server's queries went with it: go on in a new session on the server
            # started again, from the sink's progress, as the next run would have (the
            # old session is closed: the query's stop did not ask for it).
            log = state.run.log
            reopened = reopened_after_restart(state.spark, lost, state.reopen, log, "realtime")
            if reopened is None:
                raise
            armed, state.spark = None, reopened
            held = state.status_sink.current_generation()
            if held is None or state.replaced():
                return state.status
            state.generation = held
            state.afresh()
            continue
        armed = None
        # A query that failed once its generation was replaced ends the run as the
        # replacement does: what failed is the new generation's runs' to do.
        if error is None or state.replaced():
            break
        _refuse_the_unrecoverable(state, error)
        if not _recovered(state, error):
            break
        state.afresh()
    _refresh(
        state.status,
        state.counts,
        query.lastProgress,
        state.config,
        state.status_sink,
        state.run.log,
    )
    return state.status


def _one_query(
    state: _Realtime, armed: StreamingQuery | None
) -> tuple[StreamingQuery, BaseException | None]:
    """Start a query from where the generation is (or go on with the ``armed`` one) and
    watch it until the run stops or the query ends; the query, stopped, and its error.
    The settings and the start are in the same block: a server that started again
    before the query ran (under a standby waiting for its switch, an armed query or a
    query's start) is gone on from as under a running query."""
    run, config, spark = state.run, state.config, state.spark
    start = QueryStart(state.generation.number, _reached(state.generation))
    interval = run.interval(config)
    said = f"realtime: starting at offsets {start.offsets}, micro-batches every {interval:g} s"
    query: StreamingQuery | None = None
    try:
        if state.settled is not spark:
            _apply_settings(spark, config, run.shuffle_partitions, run.log)
            state.settled = spark
        if armed is not None and armed.isActive:
            run.log(f"{said} (the query armed before the switch)")
            write_start(run.checkpoint_dir, start)
            query = armed
        else:
            run.log(said)
            shutil.rmtree(run.checkpoint_dir, ignore_errors=True)
            write_start(run.checkpoint_dir, start)
            query = _start_query(
                state.stream_reader(spark),
                config,
                state.schema,
                state.commit,
                interval,
                run.checkpoint_dir,
                run.log,
            )
        _watch(state, query)
        return query, query.exception()
    finally:
        if query is not None:
            _stop(query, spark)


def _watch(state: _Realtime, query: StreamingQuery) -> None:
    """Until the run stops, the query ends or the generation is replaced: report the
    status every ``status_every_s``; ``PhaseAlreadyRunning`` once the run lock is lost."""
    run, sink = state.run, state.sink
    next_report = time.monotonic()
    while not run.should_stop():
        if _ended(query):
            return
        if not sink.keep_run_lock():
            raise PhaseAlreadyRunning(
                f"pipeline {state.config.name}: this realtime run lost the run lock to "
                f"{sink.lock_holder() or 'another run'}; stopping"
            )
        if state.replaced():
            return
        if time.monotonic() >= next_report:
            _refresh(
                state.status,
                state.counts,
                query.lastProgress,
                state.config,
                state.status_sink,
                run.log,
            )
            run.on_status(state.status)
            next_report = time.monotonic() + run.status_every_s


def _refuse_the_unrecoverable(state: _Realtime, error: BaseException) -> None:
    """A commit refused (a replay, a changed definition) or a sink its commits cannot
    open: the run fails saying so."""
    refused = refusal_in(str(error))
    if refused is not None:
        raise refused
    unreachable = unreachable_in(str(error))
    if unreachable is not None:
        where = "the Spark Connect server" if runs_elsewhere(state.spark) else "this process"
        raise SinkUnreachable(
            f"pipeline {state.config.name}: the realtime commits run where Spark runs "
            f"foreachBatch ({where}), and the sink cannot be opened there; nothing "
            f"was committed: {unreachable}"
        )


def _recovered(state: _Realtime, error: BaseException) -> bool:
    """Where the query can start again after ``error``, the generation it starts from:
    where retention removed records under it, say so or skip them; where another query
    (of a run that died) committed under it, or a Python worker died under it, go on from
    the sink's progress. False when the run was stopped meanwhile; any other error fails
    the run."""
    config, log = state.config, state.run.log
    with open_source(config) as topic:
        held = state.status_sink.current_generation()
        if held is not None and moved_under(str(error)):
            log("realtime: the sink's progress moved under the query; starting it again")
            state.generation = held
        elif held is not None and removed_unread(held, topic):
            state.generation = handle_truncation(state.sink, topic, config, held, log)
        elif (
            held is not None
            and (why := _python_worker_lost(error)) is not None
            and state.worker_stops < QUERY_START_ATTEMPTS - 1
        ):
            # The query stopped before, between or in a commit, and goes on from the
            # sink's progress, as the next run would.
            state.worker_stops += 1
            pause = slow_worker_wait(state.worker_stops)
            log(
                f"realtime: the query stopped: {why}; starting it again from the "
                f"sink's progress in {pause:.0f} s"
            )
            if _stopped_within(pause, state.run.should_stop):
                return False
            state.generation = held
        else:
            raise RuntimeError(f"pipeline {config.name}: the realtime query failed: {error}")
    return True


def _stop(query: StreamingQuery, started_on: SparkSession) -> None:
    """Stop the query; where its session is gone with its server, there is nothing to
    stop, and the client says so with an error."""
    if not connect_session_closed(started_on):
        query.stop()


def _ended(query: StreamingQuery) -> bool:
    """Whether the query has ended, waiting up to a second. Spark raises a failed query's
    error from ``awaitTermination``; ``query.exception()`` holds it for the caller."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(1))
    except StreamingQueryException:
        return True


def _stopped_within(seconds: float, should_stop: Callable[[], bool]) -> bool:
    """Wait ``seconds``, or less if ``should_stop()``; whether it did."""
    return until(should_stop, seconds, 1.0) or should_stop()


def _replaced(generation: Generation, status_sink: Sink, log: Callable[[str], None]) -> bool:
    """Whether a newer generation replaced ``generation`` (the switch went back, or a
    reset); says so when it did."""
    current = status_sink.current_generation()
    if current is None or current.number == generation.number:
        return False
    log(f"realtime: generation {generation.number} was replaced ({current.reason}); stopping")
    return True


def _start_query(
    reader: DataStreamReader,
    config: PipelineConfig,
    schema: str | None,
    commit: MicroBatchCommit,
    interval: float,
    checkpoint_dir: Path,
    log: Callable[[str], None],
) -> StreamingQuery:
    """The query, reading from where its start file says once it exists."""
    stream = reader.option("startingOffsetsFile", str(start_file(checkpoint_dir)))
    limit = read_limit(config, interval)
    commit = replace(commit, checkpoint=str(checkpoint_dir), read_limit=limit)
    if schema:
        stream = stream.schema(schema)
    if limit is not None:
        stream = stream.option("maxRecordsPerTrigger", limit)
    records = stream.load()
    writer = (
        records.writeStream.queryName(f"{config.name}_realtime")
        .foreachBatch(commit)
        .trigger(processingTime=f"{interval} seconds")
        .option("checkpointLocation", str(checkpoint_dir))
    )
    return start_query(writer, log)


def start_query(
    writer: DataStreamWriter,
    log: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> StreamingQuery:
    """``writer.start()``, again after a growing wait while Spark's new Python worker was
    too slow to start."""

    def say(state: RetryCallState) -> None:
        wait = state.next_action.sleep if state.next_action else 0
        log(
            f"realtime: the query did not start: Spark's new Python worker did not connect "
            f"back within Spark's fixed 10 s (a busy machine); starting it again in "
            f"{wait:.0f} s (attempt {state.attempt_number + 1} of {QUERY_START_ATTEMPTS})"
        )

    for attempt in Retrying(
        retry=retry_if_exception(_worker_slow_to_start),
        stop=stop_after_attempt(QUERY_START_ATTEMPTS),
        wait=lambda state: slow_worker_wait(state.attempt_number),
        sleep=sleep,
        before_sleep=say,
        reraise=True,
    ):
        with attempt:
            return writer.start()
    raise AssertionError("unreachable")  # pragma: no cover: Retrying returns or raises


def slow_worker_wait(attempt: int) -> float:
    """The wait (s) after the ``attempt``-th query that failed for a slow Python worker."""
    return float(min(QUERY_START_FIRST_WAIT_S * 2 ** (attempt - 1), QUERY_START_LONGEST_WAIT_S))


def _worker_slow_to_start(error: BaseException) -> bool:
    return WORKER_SLOW_TO_START in str(error)


def _python_worker_lost(error: BaseException) -> str | None:
    """Why the query stopped, when one of Spark's Python workers stopped it (a new one
    slow to start, or one that died): for the log; None otherwise."""
    if _worker_slow_to_start(error):
        return (
            "one of Spark's new Python workers did not connect back within Spark's fixed "
            "10 s (a busy machine)"
        )
    if WORKER_EXITED in str(error):
        return "one of Spark's Python workers exited unexpectedly (killed, or out of memory)"
    return None


@dataclass(frozen=True)
class _Counts:
    """What the sink held when the run started: the run's own counts are the growth."""

    reached: dict[int, int]
    skipped: int
    late: int
    bad: int

    @staticmethod
    def now(sink: Sink) -> _Counts:
        generation = sink.current_generation()
        reached = {} if generation is None else _reached(generation)
        return _Counts(reached, sink.skipped_records(), sink.late_count(), sink.dead_letter_count())


def _reached(generation: Generation) -> dict[int, int]:
    return {b: s.reached for b, s in generation.buckets.items()}


def _refresh(
    status: RealtimeStatus,
    before: _Counts,
    progress: dict | None,
    config: PipelineConfig,
    sink: Sink,
    log: Callable[[str], None],
) -> None:
    """The status from the sink: the commits may run in another process (``micro_batch``)."""
    generation = sink.current_generation()
    if generation is None:
        return
    new = sorted(set(generation.buckets) - set(status.offsets or before.reached))
    if new:
        log(f"realtime: tracking new bucket(s) {new}")
    status.offsets = _reached(generation)
    moved = sum(s.reached - before.reached.get(b, s.start) for b, s in generation.buckets.items())
    status.records = moved - (sink.skipped_records() - before.skipped)
    now = time.monotonic()
    if status.counted is not None and now > status.counted[0]:
        status.records_per_s = (status.records - status.counted[1]) / (now - status.counted[0])
    status.counted = (now, status.records)
    status.late_records = sink.late_count() - before.late
    status.bad_records = sink.dead_letter_count() - before.bad
    with open_source(config) as topic:
        # The same watermark lag the switch decides on, not a second definition of it.
        mark = watermark_lag(generation, topic, config, time.time())
        lag = realtime_lag(generation, topic.latest_offsets(), mark, config)
    status.offset_lag = lag.per_bucket
    status.input_lag_s = lag.input_lag_s
    if progress:
        status.batches = status.batches_before_restart + int(progress.get("batchId", -1)) + 1
    if mark.watermark_us is not None:
        status.watermark = datetime.fromtimestamp(mark.watermark_us / 1e6, timezone.utc).isoformat()
