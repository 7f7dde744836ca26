"""The realtime phase: a Structured Streaming query that continues exactly at the markers.

State handoff (FLIP-327): the backlog left its per-key state in the sink as mergeable
partial results. Each micro-batch here aggregates only its own records into partials
and merges them into that state, so no key restarts from zero and nothing before the
markers is read again.

Exactly once: each micro-batch's results and the offsets it covered commit in one sink
transaction, and every query starts from the offsets the sink holds (not from Spark's
own checkpoint), so a crash at any point either committed a batch or left no trace of
it, and the next run reads it again.

The run ends by itself when a newer generation replaces the one it started in (the
switch went back into backlog, or a reset): a batch it could still try to commit is
refused by the sink, and the query stops.

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

import functools
import json
import operator
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from backlog_dagster.log.schema import TIMESTAMP
from backlog_dagster.phases.bad_records import BadRecord, collect, refuse_bad_records
from backlog_dagster.phases.lag import lateness_us, watermark_lag
from backlog_dagster.phases.lock import exclusive_run
from backlog_dagster.phases.markers import current_generation
from backlog_dagster.phases.transform import (
    BucketSeen,
    check_against_source,
    observe_buckets,
    partial_results,
    read_schema,
    window_end,
)
from backlog_dagster.phases.truncation import handle_truncation, removed_unread
from backlog_dagster.phases.watermark import arrival_watermarks, judged_by_arrival
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, GenerationEnded, Sink
from backlog_dagster.source import open_source
from backlog_dagster.spark.records import APPENDED_COLUMN, BUCKET_COLUMN, OFFSET_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamReader, StreamingQuery


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
    watermark_lag_s: float | None = None
    records_per_s: float = 0.0
    first_batch_committed_at: float | None = None


def streaming_settings(config: PipelineConfig, shuffle_partitions: int | None) -> dict[str, str]:
    """A small fixed shuffle partition count, no adaptive re-planning per micro-batch."""
    partitions = shuffle_partitions or config.realtime.shuffle_partitions
    return {"spark.sql.shuffle.partitions": str(partitions), "spark.sql.adaptive.enabled": "false"}


def run_realtime(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    status_sink: Sink,
    *,
    checkpoint_dir: Path,
    should_stop: Callable[[], bool],
    log: Callable[[str], None] = print,
    on_status: Callable[[RealtimeStatus], None] = lambda status: None,
    status_every_s: float = 5.0,
    checkpoint_interval: float | None = None,
    shuffle_partitions: int | None = None,
) -> RealtimeStatus:
    """Run micro-batches until ``should_stop()``; ``status_sink`` is a second connection.

    Refused (``PhaseAlreadyRunning``) while another run of the pipeline is going.
    """
    with exclusive_run(sink, config, "realtime"):
        return _run_realtime(
            spark,
            config,
            sink,
            status_sink,
            checkpoint_dir,
            should_stop,
            log,
            on_status,
            status_every_s,
            checkpoint_interval,
            shuffle_partitions,
        )


def _run_realtime(
    spark: SparkSession,
    config: PipelineConfig,
    sink: Sink,
    status_sink: Sink,
    checkpoint_dir: Path,
    should_stop: Callable[[], bool],
    log: Callable[[str], None],
    on_status: Callable[[RealtimeStatus], None],
    status_every_s: float,
    checkpoint_interval: float | None,
    shuffle_partitions: int | None,
) -> RealtimeStatus:
    with open_source(config) as topic:
        check_against_source(config, topic)
        schema = read_schema(
            config,
            topic,
            arrival=config.transform.window is not None and judged_by_arrival(config, topic),
        )
        generation = current_generation(sink, topic, config, log)
        generation = handle_truncation(sink, topic, config, generation, log)
        # A new reader each time the query (re)starts below.
        new_stream_reader = topic.stream_reader
    if not generation.finished and config.backlog.boundary == "markers":
        left = {
            b.bucket: b.marker - b.reached for b in generation.buckets.values() if not b.finished
        }
        raise BacklogNotFinished(
            f"pipeline {config.name}: the backlog has not reached the markers yet "
            f"(records left per bucket: {left}); run the backlog first"
        )
    for key, value in streaming_settings(config, shuffle_partitions).items():
        spark.conf.set(key, value)
    interval = checkpoint_interval or config.realtime.checkpoint_interval
    status = RealtimeStatus()
    superseded: list[str] = []
    refused: list[BadRecord] = []

    def commit_batch(batch: DataFrame, batch_id: int) -> None:
        if refused:
            return  # the run is stopping on a bad record; commit nothing after it
        held = sink.current_generation()
        assert held is not None
        windowed = config.transform.window is not None
        if windowed:
            batch = batch.persist()  # read twice: its late records, then the aggregation
        try:
            observed, seen = observe_buckets(batch, config, sorted(held.buckets))
            on_time, late = _split_late(observed, config, held)
            aggregated = collect(partial_results(on_time, config))
            try:
                refuse_bad_records(config, aggregated.dead_letters)
            except BadRecord as bad:
                refused.append(bad)
                return
            read = seen()
            if read is None:  # a bucket born since the generation was read: look it up
                read = _buckets_read(batch, config)
                new = {b: (s.low, s.low) for b, s in read.items() if b not in held.buckets}
                held = sink.track_buckets(held.number, new)
                log(f"realtime: tracking new bucket(s) {sorted(new)}")
            if not read:
                return
            begin = {b: s.low for b, s in read.items()}
            end = {b: s.high + 1 for b, s in read.items()}
            event_times = {b: s.event_time_us for b, s in read.items()}
            try:
                committed = sink.commit(
                    held.number,
                    begin,
                    end,
                    aggregated.results,
                    late,
                    event_times,
                    aggregated.dead_letters,
                )
            except GenerationEnded as ended:
                superseded.append(str(ended))
                return
            if committed:
                status.batches += 1
                status.records += sum(end[b] - begin[b] for b in end)
                status.late_records += 0 if late is None else late.num_rows
                status.bad_records += aggregated.dead_letters.num_rows
                if status.first_batch_committed_at is None:
                    status.first_batch_committed_at = time.time()
        finally:
            if windowed:
                batch.unpersist()

    while True:
        start = {str(b): s.reached for b, s in sorted(generation.buckets.items())}
        log(f"realtime: starting at offsets {start}, micro-batches every {interval:g} s")
        query = _start_query(
            new_stream_reader(spark), config, schema, start, commit_batch, interval, checkpoint_dir
        )
        try:
            next_report = time.monotonic()
            while not should_stop() and not refused:
                if query.awaitTermination(1):
                    break
                current = status_sink.current_generation()
                if superseded or (current is not None and current.number != generation.number):
                    log(
                        f"realtime: generation {generation.number} was replaced "
                        f"({current.reason if current else 'gone'}); stopping"
                    )
                    break
                if time.monotonic() >= next_report:
                    _refresh(status, query.lastProgress, config, status_sink)
                    on_status(status)
                    next_report = time.monotonic() + status_every_s
            error = query.exception()
        finally:
            query.stop()
        if refused:
            raise refused[0]
        if error is None:
            break
        # The query failed: if retention removed records under it, say so or skip them
        # and start the query again from the progress the sink holds.
        with open_source(config) as topic:
            held = status_sink.current_generation()
            if held is None or not removed_unread(held, topic):
                raise RuntimeError(f"pipeline {config.name}: the realtime query failed: {error}")
            generation = handle_truncation(sink, topic, config, held, log)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
    _refresh(status, query.lastProgress, config, status_sink)
    return status


def _start_query(
    reader: DataStreamReader,
    config: PipelineConfig,
    schema: str | None,
    start: dict[str, int],
    commit_batch: Callable[[DataFrame, int], None],
    interval: float,
    checkpoint_dir: Path,
) -> StreamingQuery:
    stream = reader.option("startingOffsets", json.dumps(start))
    if schema:
        stream = stream.schema(schema)
    if config.realtime.max_records_per_trigger:
        stream = stream.option("maxRecordsPerTrigger", config.realtime.max_records_per_trigger)
    return (
        stream.load()
        .writeStream.queryName(f"{config.name}_realtime")
        .foreachBatch(commit_batch)
        .trigger(processingTime=f"{interval} seconds")
        .option("checkpointLocation", str(checkpoint_dir))
        .start()
    )


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
    """Records whose window was open, and (as Arrow) those it was not (see the module).

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


def _refresh(
    status: RealtimeStatus, progress: dict | None, config: PipelineConfig, sink: Sink
) -> None:
    generation = sink.current_generation()
    if generation is None:
        return
    status.offsets = {b: s.reached for b, s in generation.buckets.items()}
    with open_source(config) as topic:
        latest = topic.latest_offsets()
        # The same watermark lag the switch decides on, not a second definition of it.
        lag = watermark_lag(generation, topic, config, time.time())
    status.offset_lag = {b: latest[b] - status.offsets.get(b, 0) for b in latest}
    if progress:
        status.records_per_s = float(progress.get("processedRowsPerSecond") or 0.0)
    if lag.watermark_us is not None:
        status.watermark = datetime.fromtimestamp(lag.watermark_us / 1e6, UTC).isoformat()
        status.watermark_lag_s = lag.seconds
