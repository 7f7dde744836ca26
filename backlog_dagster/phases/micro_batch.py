"""The realtime query's commit of one micro-batch, wherever Spark runs ``foreachBatch``.

A local Spark runs a query's ``foreachBatch`` function in the run's own process; Spark
Connect runs it on the server, in a Python process of its own, from a pickled copy. So
the commit shares nothing with the run that started the query: it is a frozen object
holding the pipeline's config and the run's lock holder, it opens its own sink (once per
process), and it reports only through the sink (the run reads its progress, dead letters
and late records there).

Orphans: a run whose process died leaves its query running on a shared Spark (a
Connect server outlives its clients). Before each commit the commit checks that its run
still holds the pipeline's run lock; when the lock is free or another run holds it, it
commits nothing and fails its query, which stops it. A commit already under way when
its run died is fenced by the sink's progress (``sink.base.check_commit``): each range of
offsets is committed once, whoever commits it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.implementations import open_source
from backlog_dagster.phases.bad_records import BadRecord, collect, refuse_bad_records
from backlog_dagster.phases.lag import lateness_us, watermark_lag
from backlog_dagster.phases.query_start import read_start
from backlog_dagster.phases.reference import Reference, read_reference
from backlog_dagster.phases.transform import (
    BucketSeen,
    LateWindows,
    earliest_window_end,
    earliest_window_ends,
    partial_results,
    watch_buckets,
    window_ends,
    without_rows,
)
from backlog_dagster.phases.watermark import arrival_watermarks, judged_by_arrival
from backlog_dagster.pipeline.config import PipelineConfig, WindowConfig
from backlog_dagster.sink import (
    Generation,
    GenerationEnded,
    ProgressConflict,
    Sink,
    SinkUnreachable,
    open_sink,
)
from backlog_dagster.source import Source
from backlog_dagster.source.records import APPENDED_COLUMN, BUCKET_COLUMN, OFFSET_COLUMN
from backlog_dagster.source.schema import TIMESTAMP
from backlog_dagster.source.spark import read_here, waiting
from backlog_dagster.spark.session import apply_sql_settings, is_connect
from backlog_dagster.waiting import until

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

#: Each commit's timings go here at DEBUG, as the record's ``micro_batch`` attribute (a
#: ``MicroBatchTimings``): where Spark runs the commit, its own log shows them.
timings_log = logging.getLogger(__name__)

#: How long a commit waits for its run to hold the run lock again (a run whose sink's
#: server restarted takes it again within its next status round) before it calls its
#: run gone.
LOCK_PATIENCE_S = 15.0

#: What a commit refusing a bad record says first: the run finds the refusal in its
#: query's error by it, wherever the commit ran (``refusal_in``).
REFUSED = "backlog-dagster refused the micro-batch: "
#: What a commit says first when the sink's progress moved under its query (a query
#: whose run died committed a batch it had begun): the run starts its query again from
#: the progress the sink holds (``moved_under``).
MOVED = "backlog-dagster found the progress moved: "
#: What a commit says first when it cannot open the sink where it runs (on Spark
#: Connect: the server's host, which may not reach what the run's host reaches).
UNREACHABLE = "backlog-dagster cannot reach the sink from where the commit runs: "


@dataclass(frozen=True)
class MicroBatchTimings:
    """Where one micro-batch's commit spent its time. Spark's own share (finding the
    latest offsets, planning, its offset and commit logs) is in the query's progress."""

    batch_id: int
    records: int
    #: Reading the batch's range from the query's offset log, for a small batch its
    #: records from the source where the commit runs (``_records_of``), and what the
    #: source's index says of each bucket (``transform.watch_buckets``).
    read_s: float
    #: The late check and the reference data.
    prepare_s: float
    #: The Spark job: transform, aggregate, collect (and read the records from the
    #: source, for a batch too large to read where the commit runs).
    aggregate_s: float
    #: The sink's transaction: merge the results and move the progress.
    sink_commit_s: float


#: The queries (by checkpoint folder) whose session took their ``session_settings``, in
#: this process.
_settings_taken: set[str] = set()


class RunGone(RuntimeError):
    """The run that started this query no longer holds the pipeline's run lock."""


@dataclass(frozen=True)
class MicroBatchCommit:
    """``foreachBatch``'s function: merge one micro-batch into the sink, exactly once.

    ``config`` must carry every setting the commit needs resolved (see
    ``sink.for_other_processes``): the process it runs in may not have the run's
    environment.

    A micro-batch's range is the query's own: the offsets Spark logged for it (and for
    the batch before, or where the query started) in the query's checkpoint. Offsets are
    positions (``source.base``): a range may end on a Kafka transaction marker, and may
    hold no record at all, yet progress must reach its end.
    """

    config: PipelineConfig
    #: The run lock holder of the run that started the query.
    holder: str
    #: The query's checkpoint folder, on the machine where Spark runs the query; its
    #: run writes the generation the query commits into (no other) and where it starts
    #: there (``phases.query_start``).
    checkpoint: str = ""
    #: The query's read limit (records per micro-batch; None: none).
    read_limit: int | None = None
    #: The Dagster run that started the query, if one did: while the query waits for its
    #: start, it ends once that run stops beating.
    run_id: str | None = None
    #: SQL settings (None: unset) put on the query's own session at its first
    #: micro-batch, for a query started while its session had other phase's settings
    #: (``realtime.arm_beside``). Spark gives a query a copy of its session as it starts,
    #: and the work of ``foreachBatch`` runs there, locally and on Spark Connect alike.
    session_settings: Mapping[str, str | None] = field(default_factory=dict)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self.session_settings and self.checkpoint not in _settings_taken:
            apply_sql_settings(batch.sparkSession, self.session_settings)
            _settings_taken.add(self.checkpoint)
        sink = _sink_for(self.config)
        checkpoint = Path(self.checkpoint)
        end = _logged_offsets(checkpoint, batch_id)
        if end is None:
            self._check_still_wanted(sink)
            return
        _await_own_lock(sink, self.holder, self.config.name)
        begun = read_start(checkpoint)
        held = sink.current_generation()
        assert held is not None and begun is not None  # Spark read from the start on
        if held.number != begun.generation:
            # A newer generation (the switch went back, or a reset) took over from its
            # progress: a batch of this query is not to land in it. The run sees the new
            # generation itself and stops its query.
            return
        started = time.monotonic()
        start = batch_start(checkpoint, batch_id, begun.offsets)
        schema = _schema_of(batch, self.checkpoint)
        with open_source(self.config) as topic:
            windowed = self.config.transform.window is not None
            records, as_arrow = _records_of(batch, schema, topic, start, end, windowed)
            # Read twice (its late records, then the aggregation): Spark's scan is kept;
            # records read here are looked at as Arrow.
            kept = windowed and as_arrow is None
            if kept:
                records = records.persist()
            watched = watch_buckets(records, self.config, topic, start, end)
        read = time.monotonic()
        try:
            self._commit(
                sink,
                held,
                watched,
                _Read(batch_id, start, end, schema.names, as_arrow, started, read),
            )
        finally:
            if kept:
                records.unpersist()

    def _check_still_wanted(self, sink: Sink) -> None:
        """A query waiting for its start whose run stopped beating fails, which ends it:
        on a shared Spark a run killed while its query waited leaves the query behind."""
        if self.run_id is None:
            return
        beat = sink.last_beat(self.run_id)
        silent = None if beat is None else time.time() - beat
        if silent is not None and silent > self.config.switch.heartbeat_timeout:
            raise RunGone(
                f"pipeline {self.config.name}: run {self.run_id}, which started this "
                f"realtime query, has been silent for {silent:.0f} s; the query stops "
                "before it began"
            )

    def _commit(
        self,
        sink: Sink,
        held: Generation,
        watched: tuple[DataFrame, Callable[[], dict[int, BucketSeen] | None]],
        batch: _Read,
    ) -> None:
        config, start, end = self.config, batch.start, batch.end
        records, seen = watched
        on_time, late, late_windows = _split_late(
            records, config, held, batch.as_arrow, self.read_limit
        )
        reference = _reference_for(config, sink)
        prepared = time.monotonic()
        aggregated = collect(
            partial_results(on_time, config, late_windows, reference, batch.columns)
        )
        aggregated_at = time.monotonic()
        try:
            refuse_bad_records(config, aggregated.dead_letters)
        except BadRecord as bad:
            raise BadRecord(f"{REFUSED}{bad}") from None
        read = seen() or {}
        # A bucket born since the query started begins at its first record read (the
        # stream reader started it at its earliest offset; anything before is markers).
        begins = {b: start.get(b, read[b].low if b in read else end[b]) for b in end}
        moved = sorted(b for b in end if end[b] > begins[b])
        if not moved:
            return
        new = {b: (begins[b], begins[b]) for b in moved if b not in held.buckets}
        if new:
            held = sink.track_buckets(held.number, new)
        try:
            sink.commit(
                held.number,
                {b: begins[b] for b in moved},
                {b: end[b] for b in moved},
                aggregated.results,
                late,
                {b: read[b].event_time_us if b in read else None for b in moved},
                aggregated.dead_letters,
                None if reference is None else reference.version,
            )
        except GenerationEnded:
            # The run sees the new generation itself and stops its query.
            return
        except ProgressConflict as conflict:
            raise RuntimeError(f"{MOVED}{conflict}") from None
        timings = MicroBatchTimings(
            batch.batch_id,
            sum(end[b] - begins[b] for b in moved),
            batch.read_at - batch.started,
            prepared - batch.read_at,
            aggregated_at - prepared,
            time.monotonic() - aggregated_at,
        )
        _log_timings(config.name, timings)


@dataclass(frozen=True)
class _Read:
    """A micro-batch as it was read: its id, offsets and columns (and the records as
    Arrow, when read here), and when its reading began and ended (monotonic s)."""

    batch_id: int
    start: dict[int, int]
    end: dict[int, int]
    columns: list[str]
    as_arrow: pa.Table | None
    started: float
    read_at: float


def _log_timings(pipeline: str, timings: MicroBatchTimings) -> None:
    timings_log.debug(
        "%s micro-batch %d: %d records; read here %.3f s, prepare %.3f s, aggregate "
        "%.3f s, sink commit %.3f s",
        pipeline,
        timings.batch_id,
        timings.records,
        timings.read_s,
        timings.prepare_s,
        timings.aggregate_s,
        timings.sink_commit_s,
        extra={"micro_batch": timings},
    )


#: A micro-batch of up to this many records is read where its commit runs
#: (``source.spark.read_here``); a larger one is Spark's own scan. By whether the
#: pipeline has windows (``True``): a windowed batch read here is checked for late
#: records as Arrow, and through Spark's scan it is kept and read twice, the late check
#: being a Spark job of its own. Measured in one warm process (medians of 8 to 16
#: micro-batches): customer_totals at 10,000 records saved about 40 ms of 278 reading
#: here; at 20,000 Spark's scan took 313 and 378 ms where reading here took 367 and 422;
#: at 40,000, 436 and 457 against 630 and 543. region_minutes at 40,000: 1,097 ms read
#: here, 1,572 ms through the scan, with 40 % more CPU time.
READ_HERE_MAX_RECORDS = {False: 15_000, True: 200_000}


#: A micro-batch of up to this many records, read here, is aggregated in one Spark task:
#: one partition holds every key, so the plan has no shuffle (a stage per aggregation,
#: its tasks and shuffle files) and no partial aggregation before it. Measured in one
#: warm local session (customer_totals' aggregation of records handed over as Arrow,
#: medians of 150): 10,000 records 55 ms and 86 ms of CPU in one task against 72 ms and
#: 117 ms over two tasks and a shuffle; 40,000 records 143 ms against 178 ms. Spark's
#: scan of a Python data source on a Connect server is left as Spark plans it: one task
#: there did not pay (BENCHMARKS.md).
ONE_TASK_MAX_RECORDS = 50_000


def _records_of(
    batch: DataFrame,
    schema: StructType,
    topic: Source,
    start: dict[int, int],
    end: dict[int, int],
    windowed: bool,
) -> tuple[DataFrame, pa.Table | None]:
    """The micro-batch's records: read here when small and every bucket's start is known
    (a bucket born since the query started begins where Spark's reader found it), then
    also as the Arrow table Spark was handed; else the query's own scan, and None.

    On Spark Connect, records read here would reach the server as a local relation,
    which its optimizer evaluates row by row (``ConvertToLocalRelation``; with turning
    the uploaded Arrow back into rows, 31 % of a Connect server's CPU samples while it
    ran the three example pipelines' micro-batches): there Spark's scan feeds the job,
    and a windowed micro-batch is also read here, for its late check as Arrow.
    """
    most = READ_HERE_MAX_RECORDS[windowed]
    if not set(end) <= set(start):
        return batch, None
    count = sum(end[b] - start[b] for b in end)
    small = count <= most
    spark = batch.sparkSession
    if is_connect(spark):
        as_arrow = read_here(topic, schema, start, end) if windowed and small else None
        return batch, as_arrow
    if not small:
        return batch, None
    table = read_here(topic, schema, start, end)
    return _in_one_task(spark.createDataFrame(table, schema), table.num_rows), table


def _in_one_task(records: DataFrame, count: int) -> DataFrame:
    """``records`` in one partition when they are few enough (``ONE_TASK_MAX_RECORDS``)."""
    return records.coalesce(1) if count <= ONE_TASK_MAX_RECORDS else records


_schemas: dict[str, StructType] = {}


def _schema_of(batch: DataFrame, checkpoint: str) -> StructType:
    """A micro-batch's schema: its query's, the same for each of its micro-batches.

    On Spark Connect asking is a round trip and an analysis on the server (measured with
    the three example pipelines' queries on one Connect server: about 25 ms of a
    micro-batch's commit), and the commit runs in a Python process of its query's own:
    there the first micro-batch's answer is kept (by the query's checkpoint) for the
    rest. A local Spark answers in the run's process at once, for every query it runs.
    """
    if not is_connect(batch.sparkSession):
        return batch.schema
    if checkpoint not in _schemas:
        _schemas[checkpoint] = batch.schema
    return _schemas[checkpoint]


def batch_start(checkpoint: Path, batch_id: int, starting: Mapping[int, int]) -> dict[int, int]:
    """Where micro-batch ``batch_id`` starts, per bucket, as the query planned it: where
    the one before ended, or ``starting`` (where the query started) for the first batch
    that read anything.

    Spark writes each micro-batch's end offsets to ``<checkpoint>/offsets/<id>`` before
    it runs the batch (its offset log: a version line, the batch's metadata, then one
    line per source, ours as the JSON the stream reader returned).
    """
    before = None if batch_id == 0 else _logged_offsets(checkpoint, batch_id - 1)
    return dict(starting) if before is None else before


def _logged_offsets(checkpoint: Path, batch_id: int) -> dict[int, int] | None:
    """Micro-batch ``batch_id``'s end offsets; None while its query waited for its start."""
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
        logged = json.loads(lines[2])
        return None if waiting(logged) else {int(b): int(o) for b, o in logged.items()}
    except (OSError, IndexError, ValueError, AttributeError) as error:
        raise RuntimeError(
            f"cannot read micro-batch {batch_id}'s offsets from the query's checkpoint "
            f"({path}: {error}); the checkpoint must be on the machine where Spark runs "
            "the query"
        ) from error


def refusal_in(error: str) -> BadRecord | None:
    """The bad record a commit refused, found in its query's error text, if that is why
    the query failed (the error crossed Spark, from the driver or a Connect server)."""
    start = error.find(REFUSED)
    if start < 0:
        return None
    return BadRecord(error[start + len(REFUSED) :].splitlines()[0])


def unreachable_in(error: str) -> str | None:
    """The sink's own error, if the query failed because its commit could not open it."""
    start = error.find(UNREACHABLE)
    if start < 0:
        return None
    return error[start + len(UNREACHABLE) :].splitlines()[0]


def moved_under(error: str) -> bool:
    """Whether the query failed because the sink's progress moved under it."""
    return MOVED in error


_sinks: dict[str, Sink] = {}
_sinks_lock = threading.Lock()


_references: dict[str, Reference] = {}


def _reference_for(config: PipelineConfig, sink: Sink) -> Reference | None:
    """``transform.join``'s reference data, read again once older than ``join.refresh``
    (kept per pipeline and process, like the sink, for the query's later micro-batches)."""
    join = config.transform.join
    if join is None:
        return None
    key = config.model_dump_json()
    held = _references.get(key)
    if held is None or time.time() - held.read_at >= join.refresh:
        held = _references[key] = read_reference(config, sink)
    return held


def _sink_for(config: PipelineConfig) -> Sink:
    """One open sink per pipeline and process, kept for the query's later micro-batches."""
    key = config.model_dump_json()
    with _sinks_lock:
        if key not in _sinks:
            try:
                _sinks[key] = open_sink(config)
            except SinkUnreachable as unreachable:
                raise SinkUnreachable(f"{UNREACHABLE}{unreachable}") from None
        return _sinks[key]


def _await_own_lock(sink: Sink, holder: str, pipeline: str) -> None:
    if not until(lambda: sink.holds_run_lock(holder), LOCK_PATIENCE_S, 0.5):
        raise RunGone(
            f"pipeline {pipeline}: the run that started this realtime query "
            f"({holder}) no longer holds the run lock (now: "
            f"{sink.lock_holder() or 'nobody'}); this query commits nothing and stops"
        )


def _split_late(
    batch: DataFrame,
    config: PipelineConfig,
    held: Generation,
    as_arrow: pa.Table | None = None,
    read_limit: int | None = None,
) -> tuple[DataFrame, pa.Table | None, LateWindows | None]:
    """Records whose window was open, and (as Arrow) those it was not (``phases.realtime``);
    ``read_limit`` is the query's (records per micro-batch).

    With sliding windows a record falls in several, and is late only for those that had
    closed: it stays in the batch, counting in the others, and the closed ones are
    returned by bucket and window end, for ``partial_results`` to leave out; the late
    table has each record that missed at least one window, once.

    ``held`` is the generation as committed before this batch: the batch starts at its
    progress, so the appends from there on are all it can hold. A record can only be
    late if its window closed under the largest watermark any of them is judged by: one
    filter finds these few candidates (``_late_candidates``), and each is checked
    against its own on the driver (a join with every append's watermark cost about
    100 ms a micro-batch). ``as_arrow``: the batch as the Arrow table it was read
    into where the commit runs, if it was.
    """
    window = config.transform.window
    if window is None:
        return batch, None, None
    with open_source(config) as topic:
        by_arrival = judged_by_arrival(config, topic)
        if by_arrival:
            marks = arrival_watermarks(
                topic,
                {b: s.reached for b, s in held.buckets.items()},
                lateness_us(config),
                config.source.idle_timeout,
                read_limit,
            )
        else:
            committed = watermark_lag(held, topic, config, time.time()).watermark_us
            marks = {} if committed is None else {ANY_ARRIVAL: committed}
    highest = max((m for m in marks.values() if m is not None), default=None)
    if highest is None:
        return batch, None, None
    candidates = _late_candidates(batch, as_arrow, config, highest, by_arrival)
    at_arrival = pa.array([marks.get(t) for t in candidates["appended_at"].to_pylist()], pa.int64())
    closed = pc.fill_null(pc.less_equal(candidates["window_end"], at_arrival), False)
    late = candidates.append_column("watermark", at_arrival.cast(TIMESTAMP)).filter(closed)
    if window.sliding:
        closed_windows = _closed(late, window)
        return batch, late.select(["bucket", "offset", "event_time", "watermark"]), closed_windows
    late = late.select(["bucket", "offset", "event_time", "watermark"])
    if late.num_rows == 0:
        return batch, late, None
    # An anti-join with the late records' ids: a filter naming each of them costs a
    # literal a record to build and to plan (measured: about 150 ms a micro-batch for
    # 60 late records).
    ids = late.select(["bucket", "offset"]).rename_columns([BUCKET_COLUMN, OFFSET_COLUMN])
    return without_rows(batch, ids), late, None


def _late_candidates(
    batch: DataFrame,
    as_arrow: pa.Table | None,
    config: PipelineConfig,
    highest: int,
    by_arrival: bool,
) -> pa.Table:
    """The records whose first window ends at or before ``highest`` (µs): bucket, offset,
    event time, that window's end and arrival (µs; ``ANY_ARRIVAL`` unless judged by
    arrival). Found in the records read here when they are (no Spark job: measured,
    70-140 ms a 10,000-record micro-batch), else by a filter on the batch. A record
    without an event time is not late: it goes on to the dead-letter table."""
    from pyspark.sql import functions as F

    window = config.transform.window
    assert window is not None
    event_time = config.source.event_time
    if as_arrow is not None and _utc_micros(as_arrow.schema.field(event_time).type):
        times = pc.cast(as_arrow[event_time], pa.int64())
        ends = earliest_window_ends(pc.fill_null(times, 0).to_numpy(), window)
        maybe = pc.is_valid(times).to_numpy(zero_copy_only=False) & (ends <= highest)
        rows = as_arrow.filter(pa.array(maybe))
        arrival = (
            pc.cast(rows[APPENDED_COLUMN], pa.int64())
            if by_arrival
            else pa.array([ANY_ARRIVAL] * rows.num_rows, pa.int64())
        )
        return pa.table(
            {
                "bucket": rows[BUCKET_COLUMN],
                "offset": rows[OFFSET_COLUMN],
                "event_time": rows[event_time],
                "window_end": pa.array(ends[maybe], pa.int64()),
                "appended_at": arrival,
            }
        )
    window_end = earliest_window_end(config)
    # The watermark is a literal, which Spark writes into the code it generates: new code
    # to compile every micro-batch as the watermark moves on. Joined as a one-row
    # broadcast instead it took longer all the same (a 300,000-record batch: 135 ms
    # against 109 ms with the compilations, medians of 35 in one warm local session).
    closes = F.coalesce(window_end <= F.timestamp_micros(F.lit(highest)), F.lit(False))
    arrival_us = F.unix_micros(F.col(APPENDED_COLUMN)) if by_arrival else F.lit(ANY_ARRIVAL)
    return (
        batch.where(closes)
        .select(
            F.col(BUCKET_COLUMN).alias("bucket"),
            F.col(OFFSET_COLUMN).alias("offset"),
            F.col(event_time).alias("event_time"),
            F.unix_micros(window_end).alias("window_end"),
            arrival_us.cast("long").alias("appended_at"),
        )
        .toArrow()
    )


def _utc_micros(kind: pa.DataType) -> bool:
    """Whether an Arrow column holds Spark TIMESTAMPs (µs since the epoch, in UTC)."""
    return pa.types.is_timestamp(kind) and kind.unit == "us" and kind.tz is not None


def _closed(late: pa.Table, window: WindowConfig) -> LateWindows:
    """Per (bucket, window end), the offsets of the late records whose window it was."""
    closed: dict[tuple[int, int], list[int]] = {}
    event_times = late["event_time"].cast(pa.int64()).to_pylist()
    watermarks = late["watermark"].cast(pa.int64()).to_pylist()
    rows = zip(late["bucket"].to_pylist(), late["offset"].to_pylist(), strict=True)
    for (bucket, offset), at, mark in zip(rows, event_times, watermarks, strict=True):
        for end in window_ends(at, window):
            if end <= mark:
                closed.setdefault((bucket, end), []).append(offset)
    return closed


#: Where lateness is judged at the committed progress: one watermark for every record.
ANY_ARRIVAL = -1
