"""The watermark: one definition, used at two moments.

Each bucket's watermark is the latest event time read from it, less the window's
allowed lateness; the pipeline's watermark is the smallest over its *active* buckets,
as a Flink source's is over its splits. A bucket is idle when it has nothing left to
read and received nothing for ``source.idle_timeout``: idle buckets do not hold the
watermark back, and when every bucket is idle there is none (the source is idle).

``combine`` is that definition. It is applied at two moments:

- *now, at the committed progress* (``phases.lag``): how far the pipeline trails the
  clock, which the switch decides on and the realtime run reports;
- *as each record arrived* (``arrival_watermarks``): whether a realtime record is late.
  A record is late when its window closed under the watermark as it stood the moment
  the record was appended to the log, with every bucket read up to that moment: the
  watermark a pipeline keeping up would have committed. So lateness depends on the log
  alone, not on how far behind realtime runs, where micro-batches were cut, or when a
  run crashed and restarted: the same input gives the same late records. The log can
  answer this for its record-time column, which it indexes per append; for another
  event-time column, lateness falls back to the committed progress when the batch runs
  (still the smallest over buckets, so a bucket that lags does not make its own
  on-time records late, but which records are late may depend on the batches' cuts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.source import Source
from backlog_dagster.source.records import TIMESTAMP_COLUMN


@dataclass(frozen=True)
class BucketClock:
    """What one bucket says of event time at a moment."""

    #: The latest event time (µs) read from the bucket up to the moment; None if none.
    event_time_us: int | None
    #: When the bucket last received a record, up to the moment; None if never.
    last_append: float | None
    #: The bucket holds records not read at the moment.
    unread: bool = False
    #: With nothing read yet but records unread: the next record's time, standing in.
    next_time_us: int | None = None


@dataclass(frozen=True)
class Watermark:
    """The pipeline's watermark at a moment, and which buckets it was taken over."""

    #: µs since the epoch; None when no active bucket has one.
    watermark_us: int | None
    idle_buckets: tuple[int, ...]
    active_buckets: tuple[int, ...]


def combine(
    clocks: Mapping[int, BucketClock], lateness_us: int, idle_timeout_s: float, now: float
) -> Watermark:
    """The pipeline's watermark at Unix time ``now`` from each bucket's clock then."""
    idle: list[int] = []
    active: list[int] = []
    marks: list[int] = []
    for bucket, clock in sorted(clocks.items()):
        quiet = clock.last_append is None or now - clock.last_append >= idle_timeout_s
        if not clock.unread and quiet:
            idle.append(bucket)
            continue
        active.append(bucket)
        latest = clock.event_time_us if clock.event_time_us is not None else clock.next_time_us
        if latest is not None:
            marks.append(latest - lateness_us)
    return Watermark(min(marks) if marks else None, tuple(idle), tuple(active))


def judged_by_arrival(config: PipelineConfig, topic: Source) -> bool:
    """Whether the log can give the pipeline's event time by arrival: it indexes its
    record-time column per append (also readable as ``_timestamp``)."""
    return config.source.event_time in (topic.timestamp_column, TIMESTAMP_COLUMN)


def arrival_watermarks(
    topic: Source,
    since: Mapping[int, int],
    lateness_us: int,
    idle_timeout_s: float,
    most: int | None = None,
) -> dict[int, int | None]:
    """``{append time (µs): watermark (µs) just before that append}`` for every append
    to the topic's buckets at or after the records at offsets ``since`` (the first
    unread record of each bucket), up to the append of a bucket's ``most``-th unread
    record at the latest (a micro-batch reads no more of a bucket than its read limit).

    The event time is the log's record time, which the log indexes per append. The
    watermark at an append counts, per bucket, the records appended strictly before it,
    and a bucket is active when it received something within the idle timeout up to
    and including that moment (so the appending bucket is).
    """
    bounds = topic.bounds()
    starts = [topic.append_time(b, offset) for b, offset in since.items()]
    known = [t for t in starts if t is not None]
    if not known:
        return {}
    until = float("inf")
    if most is not None:
        ends = [
            topic.append_time(b, min(offset + most, bounds[b].latest) - 1)
            for b, offset in since.items()
            if b in bounds and bounds[b].latest > offset
        ]
        until = max((t for t in ends if t is not None), default=until)
    history = {b: topic.arrivals(b, min(known), until) for b in bounds}
    latest = {b: h.max_time_before_us for b, h in history.items()}
    last = {b: h.last_append_before for b, h in history.items()}
    watermarks: dict[int, int | None] = {}
    for moment, appends in _by_moment((b, h.appends) for b, h in history.items()):
        for bucket, _ in appends:
            last[bucket] = moment
        clocks = {b: BucketClock(latest[b], last[b]) for b in history}
        mark = combine(clocks, lateness_us, idle_timeout_s, moment).watermark_us
        watermarks[round(moment * 1_000_000)] = mark
        for bucket, high in appends:
            before = latest[bucket]
            latest[bucket] = high if before is None else max(before, high)
    return watermarks


def _by_moment(
    appends: Iterable[tuple[int, list[tuple[float, int]]]],
) -> list[tuple[float, list[tuple[int, int]]]]:
    """Every bucket's appends merged into time order: ``[(moment, [(bucket, high)])]``."""
    moments: dict[float, list[tuple[int, int]]] = {}
    for bucket, items in appends:
        for moment, high in items:
            moments.setdefault(moment, []).append((bucket, high))
    return sorted(moments.items())
