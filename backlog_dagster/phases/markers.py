"""Boundary markers: where the backlog ends, per bucket, fixed when the pipeline starts.

The markers are the log's end offsets at the moment the pipeline first starts (or is
reset), written durably to the sink before any backlog work. They are never recomputed
from the log's new end after a failure or restart: a known bug of the Fluss proposal,
which kept them in memory.

Buckets that appear after the markers were taken hold only records newer than the
markers, so they have nothing in the backlog: each is tracked with start and marker at
its earliest offset when first seen (finished at once), and the realtime phase reads it
from there.

A later generation may *continue* one instead of starting over (``continue_backlog``):
the way back from realtime into backlog takes new markers at the log's end and starts
each bucket at its committed progress, keeping the results.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from backlog_dagster.errors import UserError
from backlog_dagster.phases.lag import watermark_lag
from backlog_dagster.phases.policy import lag_says_backlog, residual_says_backlog
from backlog_dagster.phases.progress import NEW_ROUND
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, Sink
from backlog_dagster.source import Source


class DefinitionChanged(RuntimeError, UserError):
    """The sink holds state of a different pipeline definition."""


def definition_of(config: PipelineConfig) -> str:
    """What decides the results: a change here makes the sink's state meaningless."""
    # Not the path (a moved topic is the same topic) nor how bad records, retention and
    # idleness are handled: none of these changes what a result means.
    source = config.source.model_dump(mode="json", include={"event_time", "record_schema", "start"})
    if config.source.kafka is not None:
        # Another kind of source or topic has other offsets (the embedded log's own
        # definitions stay as they were).
        source |= {"kind": "kafka", "topic": config.source.kafka.topic}
    return json.dumps(
        {"source": source, "transform": config.transform.model_dump(mode="json")}, sort_keys=True
    )


def take_markers(topic: Source, config: PipelineConfig) -> dict[int, tuple[int, int]]:
    """``{bucket: (start offset, marker)}`` from the log as it is now."""
    bounds = topic.bounds()
    start = config.source.start
    if start.timestamp is not None:
        starts = {b: topic.offset_for_time(b, start.timestamp_us) for b in bounds}
    elif start.offsets is None:
        starts = {b: v.earliest for b, v in bounds.items()}
    else:
        unknown = sorted(set(start.offsets) - set(bounds))
        if unknown:
            raise ValueError(
                f"pipeline {config.name}: source.start.offsets names bucket(s) {unknown}, "
                f"which topic {topic.name} does not have"
            )
        starts = {b: start.offsets.get(b, v.earliest) for b, v in bounds.items()}
    markers = {}
    for bucket, offset in starts.items():
        low, high = bounds[bucket].earliest, bounds[bucket].latest
        if not low <= offset <= high:
            raise ValueError(
                f"pipeline {config.name}: bucket {bucket} start offset {offset} is outside "
                f"the offsets the log holds [{low}, {high}]"
            )
        markers[bucket] = (offset, high)
    return markers


def current_generation(
    sink: Sink, topic: Source, config: PipelineConfig, log: Callable[[str], None]
) -> Generation:
    """The pipeline's markers: taken now if it never started (or its definition changed
    before anything was committed), else as stored."""
    definition = definition_of(config)
    generation = sink.current_generation()
    if generation is None:
        generation = sink.start_generation(take_markers(topic, config), "first start", definition)
        log(f"generation {generation.number}: boundary markers taken: {_describe(generation)}")
        return generation
    if generation.definition != definition and sink.is_empty():
        # Nothing was committed under the old definition (it may never have run):
        # starting over loses nothing, so no reset is asked for.
        generation = sink.start_generation(
            take_markers(topic, config), "definition changed before any result", definition
        )
        log(
            f"generation {generation.number}: the definition changed before any result was "
            f"committed; new boundary markers taken: {_describe(generation)}"
        )
        return generation
    if generation.definition != definition:
        raise DefinitionChanged(
            f"pipeline {config.name}: the sink holds results of a different definition "
            f"(source start or transform changed since generation {generation.number}). "
            f"Run `backlog-dagster pipeline reset` to start over with the new definition."
        )
    new = {
        b: (bounds.earliest, bounds.earliest)
        for b, bounds in topic.bounds().items()
        if b not in generation.buckets
    }
    if new:
        generation = sink.track_buckets(generation.number, new)
        log(
            f"generation {generation.number}: tracking new bucket(s) {sorted(new)}, "
            "with no backlog (their records are newer than the markers)"
        )
    return generation


def reset(
    sink: Sink, topic: Source, config: PipelineConfig, reason: str, log: Callable[[str], None]
) -> Generation:
    """Start over: new markers at the log's end, results cleared."""
    generation = sink.start_generation(take_markers(topic, config), reason, definition_of(config))
    log(
        f"generation {generation.number} ({reason}): boundary markers taken: "
        f"{_describe(generation)}"
    )
    return generation


def continue_backlog(
    sink: Sink,
    topic: Source,
    config: PipelineConfig,
    reason: str,
    lag_s: float | None,
    log: Callable[[str], None],
) -> Generation:
    """Back into backlog, results kept: new markers at the log's end, from the progress made.

    The way back from realtime, or a backlog that reached its markers while the
    watermark still lags: each bucket starts where its committed progress stands.
    """
    generation = sink.continue_generation(topic.latest_offsets(), reason, lag_s)
    assert generation is not None
    log(f"generation {generation.number} ({reason}): new markers: {_describe(generation)}")
    return generation


def extend_markers(
    sink: Sink,
    topic: Source,
    config: PipelineConfig,
    log: Callable[[str], None],
    previous_residual: int | None = None,
) -> Generation | None:
    """New markers at the log's end when every bucket reached its markers but the backlog
    should read on: the watermark lag is above the threshold (FLIP-328), or more records
    arrived meanwhile than realtime should start with (``residual_says_backlog``;
    ``previous_residual``: the records this round began with, when it is not the first).

    The results are kept. None, changing nothing, when neither holds, nothing new was
    appended, or the phase is no longer backlog (the switch won the race: the check and
    the new markers are one transaction).
    """
    generation = sink.current_generation()
    if generation is None or not generation.finished:
        return None
    latest = topic.latest_offsets()
    residual = sum(max(0, latest.get(b, 0) - s.reached) for b, s in generation.buckets.items())
    if residual == 0:
        return None
    threshold = config.backlog.watermark_lag_threshold
    lag = None if threshold is None else watermark_lag(generation, topic, config, time.time())
    if lag is not None and lag_says_backlog(lag, config):
        reason = (
            f"{NEW_ROUND}, but {lag.describe()} is above the threshold "
            f"{threshold:g} s: new markers at the log's end"
        )
    elif residual_says_backlog(residual, config, previous_residual):
        reason = (
            f"{NEW_ROUND}, but {residual:,} records arrived meanwhile, "
            f"more than backlog.residual_records ({config.backlog.residual_records:,}): "
            "new markers at the log's end, read in batch"
        )
    else:
        return None
    lag_s = None if lag is None else lag.seconds
    extended = sink.continue_generation(latest, reason, lag_s, if_phase="backlog")
    if extended is not None:
        log(f"generation {extended.number} ({reason}): new markers: {_describe(extended)}")
    return extended


def _describe(generation: Generation) -> str:
    return ", ".join(
        f"bucket {b.bucket} [{b.start}, {b.marker})" for b in generation.buckets.values()
    )
