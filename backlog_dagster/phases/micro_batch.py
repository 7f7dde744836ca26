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

import functools
import operator
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.log.schema import TIMESTAMP
from backlog_dagster.phases.bad_records import BadRecord, collect, refuse_bad_records
from backlog_dagster.phases.lag import lateness_us, watermark_lag
from backlog_dagster.phases.transform import (
    BucketSeen,
    observe_buckets,
    partial_results,
    window_end,
)
from backlog_dagster.phases.watermark import arrival_watermarks, judged_by_arrival
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, GenerationEnded, ProgressConflict, Sink, open_sink
from backlog_dagster.source import open_source
from backlog_dagster.spark.records import APPENDED_COLUMN, BUCKET_COLUMN, OFFSET_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

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


class RunGone(RuntimeError):
    """The run that started this query no longer holds the pipeline's run lock."""


@dataclass(frozen=True)
class MicroBatchCommit:
    """``foreachBatch``'s function: merge one micro-batch into the sink, exactly once.

    ``config`` must carry every setting the commit needs resolved (see
    ``sink.for_other_processes``): the process it runs in may not have the run's
    environment.
    """

    config: PipelineConfig
    #: The run lock holder of the run that started the query.
    holder: str

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        sink = _sink_for(self.config)
        _await_own_lock(sink, self.holder, self.config.name)
        held = sink.current_generation()
        assert held is not None
        windowed = self.config.transform.window is not None
        if windowed:
            batch = batch.persist()  # read twice: its late records, then the aggregation
        try:
            self._commit(sink, held, batch)
        finally:
            if windowed:
                batch.unpersist()

    def _commit(self, sink: Sink, held: Generation, batch: DataFrame) -> None:
        config = self.config
        observed, seen = observe_buckets(batch, config, sorted(held.buckets))
        on_time, late = _split_late(observed, config, held)
        aggregated = collect(partial_results(on_time, config))
        try:
            refuse_bad_records(config, aggregated.dead_letters)
        except BadRecord as bad:
            raise BadRecord(f"{REFUSED}{bad}") from None
        read = seen()
        if read is None:  # a bucket born since the generation was read: look it up
            read = _buckets_read(batch, config)
            new = {b: (s.low, s.low) for b, s in read.items() if b not in held.buckets}
            held = sink.track_buckets(held.number, new)
        if not read:
            return
        try:
            sink.commit(
                held.number,
                {b: s.low for b, s in read.items()},
                {b: s.high + 1 for b, s in read.items()},
                aggregated.results,
                late,
                {b: s.event_time_us for b, s in read.items()},
                aggregated.dead_letters,
            )
        except GenerationEnded:
            # The run sees the new generation itself and stops its query.
            return
        except ProgressConflict as conflict:
            raise RuntimeError(f"{MOVED}{conflict}") from None


def refusal_in(error: str) -> BadRecord | None:
    """The bad record a commit refused, found in its query's error text, if that is why
    the query failed (the error crossed Spark, from the driver or a Connect server)."""
    start = error.find(REFUSED)
    if start < 0:
        return None
    return BadRecord(error[start + len(REFUSED) :].splitlines()[0])


def moved_under(error: str) -> bool:
    """Whether the query failed because the sink's progress moved under it."""
    return MOVED in error


_sinks: dict[str, Sink] = {}
_sinks_lock = threading.Lock()


def _sink_for(config: PipelineConfig) -> Sink:
    """One open sink per pipeline and process, kept for the query's later micro-batches."""
    key = config.model_dump_json()
    with _sinks_lock:
        if key not in _sinks:
            _sinks[key] = open_sink(config)
        return _sinks[key]


def _await_own_lock(sink: Sink, holder: str, pipeline: str) -> None:
    deadline = time.monotonic() + LOCK_PATIENCE_S
    while not sink.holds_run_lock(holder):
        if time.monotonic() >= deadline:
            raise RunGone(
                f"pipeline {pipeline}: the run that started this realtime query "
                f"({holder}) no longer holds the run lock (now: "
                f"{sink.lock_holder() or 'nobody'}); this query commits nothing and stops"
            )
        time.sleep(0.5)


def _buckets_read(batch: DataFrame, config: PipelineConfig) -> dict[int, BucketSeen]:
    """Per bucket, the offsets and latest event time in ``batch``: a job of its own."""
    from pyspark.sql import functions as F

    rows = (
        batch.groupBy(BUCKET_COLUMN)
        .agg(
            F.min(OFFSET_COLUMN).alias("low"),
            F.max(OFFSET_COLUMN).alias("high"),
            F.max(F.unix_micros(F.col(config.source.event_time))).alias("event_time"),
        )
        .collect()
    )
    return {r[BUCKET_COLUMN]: BucketSeen(r["low"], r["high"], r["event_time"]) for r in rows}


def _split_late(
    batch: DataFrame, config: PipelineConfig, held: Generation
) -> tuple[DataFrame, pa.Table | None]:
    """Records whose window was open, and (as Arrow) those it was not (``phases.realtime``).

    ``held`` is the generation as committed before this batch: the batch starts at its
    progress, so the appends from there on are all it can hold. A record can only be
    late if its window closed under the largest watermark any of them is judged by: one
    filter finds these few candidates, and each is checked against its own on the
    driver (a join with every append's watermark cost about 100 ms a micro-batch).
    """
    from pyspark.sql import functions as F

    if config.transform.window is None:
        return batch, None
    with open_source(config) as topic:
        by_arrival = judged_by_arrival(config, topic)
        if by_arrival:
            marks = arrival_watermarks(
                topic,
                {b: s.reached for b, s in held.buckets.items()},
                lateness_us(config),
                config.source.idle_timeout,
                config.realtime.max_records_per_trigger,
            )
        else:
            committed = watermark_lag(held, topic, config, time.time()).watermark_us
            marks = {} if committed is None else {ANY_ARRIVAL: committed}
    highest = max((m for m in marks.values() if m is not None), default=None)
    if highest is None:
        return batch, None
    ends = window_end(config)
    # A record without an event time is not late: it goes on to the dead-letter table.
    maybe = F.coalesce(ends <= F.timestamp_micros(F.lit(highest)), F.lit(False))
    arrival = F.unix_micros(F.col(APPENDED_COLUMN)) if by_arrival else F.lit(ANY_ARRIVAL)
    candidates = (
        batch.where(maybe)
        .select(
            F.col(BUCKET_COLUMN).alias("bucket"),
            F.col(OFFSET_COLUMN).alias("offset"),
            F.col(config.source.event_time).alias("event_time"),
            F.unix_micros(ends).alias("window_end"),
            arrival.cast("long").alias("appended_at"),
        )
        .toArrow()
    )
    at_arrival = pa.array([marks.get(t) for t in candidates["appended_at"].to_pylist()], pa.int64())
    closed = pc.fill_null(pc.less_equal(candidates["window_end"], at_arrival), False)
    late = candidates.append_column("watermark", at_arrival.cast(TIMESTAMP)).filter(closed)
    late = late.select(["bucket", "offset", "event_time", "watermark"])
    if late.num_rows == 0:
        return batch, late
    by_bucket: dict[int, list[int]] = {}
    for bucket, offset in zip(late["bucket"].to_pylist(), late["offset"].to_pylist(), strict=True):
        by_bucket.setdefault(bucket, []).append(offset)
    is_late = functools.reduce(
        operator.or_,
        [
            (F.col(BUCKET_COLUMN) == b) & F.col(OFFSET_COLUMN).isin(offsets)
            for b, offsets in by_bucket.items()
        ],
    )
    return batch.where(~(maybe & is_late)), late


#: Where lateness is judged at the committed progress: one watermark for every record.
ANY_ARRIVAL = -1
