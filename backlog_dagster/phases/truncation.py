"""Retention removed records the pipeline had not read yet: stop and say so, or skip them.

Found on the driver, from the log's earliest offsets against the progress the sink
holds, before each backlog chunk, when the realtime query starts, and after a Spark
job failed on a range that vanished while it read. Never silent: with
``source.on_truncation: fail`` (the default) the run stops naming every bucket and
range; with ``skip`` the sink records each skipped range (``backlog_skips``) in the
same transaction that moves the progress past it, and the run logs and counts it.
"""

from __future__ import annotations

from collections.abc import Callable

from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, Sink
from backlog_dagster.source import Source


class LogTruncated(RuntimeError, UserError):
    """Retention removed unread records, and the pipeline was not told to skip them."""


def removed_unread(generation: Generation, topic: Source) -> dict[int, tuple[int, int]]:
    """``{bucket: (reached, next held)}`` where the source no longer holds the next record
    (below the log's earliest offset, or a hole between an archive and the log)."""
    bounds = topic.bounds()
    gaps = {}
    for bucket, state in generation.buckets.items():
        if bucket in bounds:
            first, _ = topic.held_from(bucket, state.reached)
            if first > state.reached:
                gaps[bucket] = (state.reached, first)
    return gaps


def handle_truncation(
    sink: Sink,
    topic: Source,
    config: PipelineConfig,
    generation: Generation,
    log: Callable[[str], None],
) -> Generation:
    """The generation as it stands after dealing with removed records, if there are any."""
    gaps = removed_unread(generation, topic)
    if not gaps:
        return generation
    count = sum(high - low for low, high in gaps.values())
    ranges = "; ".join(f"bucket {b} offsets [{low}, {high})" for b, (low, high) in gaps.items())
    if config.source.on_truncation == "fail":
        raise LogTruncated(
            f"pipeline {config.name}: retention removed {count} record(s) the pipeline had "
            f"not read yet: {ranges}. Set source.on_truncation: skip to go on from the "
            "earliest offsets the log holds (the skipped records are logged and counted), "
            "or run `backlog-dagster pipeline reset` to start over from what the log holds."
        )
    sink.skip(generation.number, gaps)
    log(f"skipped {count} record(s) that retention removed before they were read: {ranges}")
    current = sink.current_generation()
    assert current is not None
    return current
