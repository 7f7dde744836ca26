"""Watermark lag: how far the pipeline's event time trails the wall clock (FLIP-328).

The watermark is the one of ``phases.watermark``, taken now at the committed progress:
each bucket's latest event time committed (the sink keeps it with the bucket's
progress), less the allowed lateness, the smallest over the active buckets; its lag is
now minus that. A bucket with records to read but none committed yet (a backlog that
has not made its first commit) has no watermark: its next record's time stands in for
it, which is the offset lag expressed as time.

Reads only the sink and the log's SQLite files: cheap enough for every sensor tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from backlog_dagster.phases.watermark import BucketClock, combine
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation
from backlog_dagster.source import Source


@dataclass(frozen=True)
class Lag:
    """The watermark lag at one moment, and what it was computed from."""

    #: Now minus the watermark, in seconds; None when no active bucket has a watermark.
    seconds: float | None
    #: The pipeline's watermark (µs since the epoch), or None.
    watermark_us: int | None
    idle_buckets: tuple[int, ...]
    active_buckets: tuple[int, ...]

    @property
    def idle(self) -> bool:
        """Every bucket is idle: the source has nothing to read and nothing new arrives."""
        return not self.active_buckets

    def describe(self) -> str:
        if self.idle:
            return "source idle"
        if self.seconds is None:
            return "no watermark yet"
        return f"watermark lag {self.seconds:,.1f} s"


def watermark_lag(generation: Generation, topic: Source, config: PipelineConfig, now: float) -> Lag:
    """The pipeline's watermark lag at Unix time ``now``."""
    bounds = topic.bounds()
    clocks = {}
    for bucket, state in generation.buckets.items():
        held = bounds.get(bucket)
        unread = held is not None and held.latest > state.reached
        next_time = None
        if unread and state.event_time_us is None and held is not None:
            next_time = topic.record_time(bucket, max(state.reached, held.earliest))
        clocks[bucket] = BucketClock(
            state.event_time_us,
            topic.last_append_time(bucket) if held is not None else None,
            unread,
            next_time,
        )
    mark = combine(clocks, lateness_us(config), config.source.idle_timeout, now)
    return Lag(
        seconds=None if mark.watermark_us is None else now - mark.watermark_us / 1_000_000,
        watermark_us=mark.watermark_us,
        idle_buckets=mark.idle_buckets,
        active_buckets=mark.active_buckets,
    )


def lateness_us(config: PipelineConfig) -> int:
    """The window's allowed lateness in µs (0 without a window)."""
    window = config.transform.window
    return 0 if window is None else round(window.allowed_lateness * 1_000_000)
