"""Watermark lag: how far the pipeline's event time trails the wall clock (FLIP-328).

Each bucket's watermark is the latest event time committed from it (the sink keeps it
with the bucket's progress), less the window's allowed lateness for windowed pipelines.
The pipeline's watermark is the smallest over its *active* buckets, as a Flink source's
is over its splits; its lag is now minus that.

- A bucket is idle when it has nothing left to read and nothing was appended to it for
  ``source.idle_timeout``; idle buckets do not count, and when every bucket is idle the
  source is idle and the lag strategy does not hold the pipeline in backlog.
- A bucket with records to read but none committed yet (a backlog that has not made its
  first commit) has no watermark: its next record's time stands in for it, which is the
  offset lag expressed as time.

Reads only the sink and the log's SQLite files: cheap enough for every sensor tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from backlog_dagster.log import Topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink.base import Generation


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


def watermark_lag(generation: Generation, topic: Topic, config: PipelineConfig, now: float) -> Lag:
    """The pipeline's watermark lag at Unix time ``now``."""
    window = config.transform.window
    lateness_us = 0 if window is None else round(window.allowed_lateness * 1_000_000)
    bounds = topic.bounds()
    idle: list[int] = []
    active: list[int] = []
    watermarks: list[int] = []
    for bucket, state in generation.buckets.items():
        held = bounds.get(bucket)
        unread = held is not None and held.latest > state.reached
        appended = topic.last_append_time(bucket) if held is not None else None
        if not unread and (appended is None or now - appended >= config.source.idle_timeout):
            idle.append(bucket)
            continue
        active.append(bucket)
        if state.event_time_us is not None:
            watermarks.append(state.event_time_us - lateness_us)
        elif unread and held is not None:
            next_offset = max(state.reached, held.earliest)
            watermarks.append(topic.record_time(bucket, next_offset) - lateness_us)
    watermark = min(watermarks) if watermarks else None
    return Lag(
        seconds=None if watermark is None else now - watermark / 1_000_000,
        watermark_us=watermark,
        idle_buckets=tuple(idle),
        active_buckets=tuple(active),
    )
