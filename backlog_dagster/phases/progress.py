"""Where a pipeline is, in numbers and words: the backlog's progress and ETA, the
realtime lag.

A backlog run publishes what only it knows (``RunProgress``: how far it has read,
counting chunks not committed yet and the share of the chunk under way that Spark's
finished tasks stand for, and how fast records arrive)
in the sink beside its heartbeat. This module combines that with the committed progress
into ``BacklogProgress``, the one place the percentages, the rate and the ETA are
computed, for the sensor's observations and tick reasons and for ``pipeline status``.

The ETA is to the switch. Under the markers strategy the backlog ends at the markers,
and records arriving meanwhile are realtime's: they do not move the switch. Under the
watermark-lag strategy the backlog goes on through what arrived (new markers, more
rounds), so it gains on the input only at its rate less the arrival rate.
"""

from __future__ import annotations

import calendar
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from backlog_dagster.phases.lag import Lag, lateness_us
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, PhaseChange, Sink

#: How the cause of a generation begins when it took new markers at the log's end after
#: the last ones were reached (``phases.markers.extend_markers``): a new round of the
#: same backlog, reading what arrived during the one before.
NEW_ROUND = "every bucket reached its marker"

#: A run's published progress older than this many heartbeats is not used: the run
#: may be gone (the sensor decides that by the heartbeat timeout).
STALE_AFTER_BEATS = 3


@dataclass(frozen=True)
class RunProgress:
    """What the backlog run under way publishes at each heartbeat."""

    run_id: str
    generation: int
    #: Unix seconds: when the run began to read (its first chunk; the Spark start and
    #: the planning before it are not reading), and when this was published.
    started_at: float
    at: float
    #: Records this run has read so far: chunks whose Spark job ended (committed or
    #: not yet), and the share of the chunk under way that Spark's finished tasks stand
    #: for.
    records_read: int
    #: Per bucket, the offset this run has read up to, counted as ``records_read``: a
    #: chunk whose commit is in flight beside the next chunk's job counts as read.
    read_to: dict[int, int] = field(default_factory=dict)
    #: Records/s arriving at the source lately (0 when nothing arrives).
    arrival_per_s: float = 0.0
    #: Records/s of the run's latest Spark jobs, their fixed costs counted
    #: (``phases.chunks.chunk_rate``); None before its first job ended. It stays in
    #: the sink after the run: the pipeline's next backlog run sizes its first chunk by it.
    chunk_rate: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "read_to": {str(b): n for b, n in self.read_to.items()}}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> RunProgress:
        values = dict(data)
        values["read_to"] = {int(b): int(n) for b, n in data.get("read_to", {}).items()}
        return RunProgress(**values)


@dataclass(frozen=True)
class BucketProgress:
    bucket: int
    done: int
    total: int

    @property
    def percent(self) -> float:
        return 100.0 if self.total <= 0 else 100.0 * min(self.done, self.total) / self.total


@dataclass(frozen=True)
class BacklogProgress:
    """The backlog of one generation: done of total, per bucket, rate and ETA."""

    generation: int
    done: int
    total: int
    buckets: tuple[BucketProgress, ...]
    #: The run's records/s since it began to read; None before it has read anything.
    records_per_s: float | None
    arrival_per_s: float
    #: Seconds to the switch; None when unknown (no rate yet, or not gaining).
    eta_s: float | None
    #: 1, or the round of a backlog that took new markers at the log's end (``NEW_ROUND``).
    round: int = 1

    @property
    def percent(self) -> float:
        return 100.0 if self.total <= 0 else 100.0 * min(self.done, self.total) / self.total

    def describe(self) -> str:
        """The pipeline's state in one line, as every page says it:
        ``catching up 63 % (1,234,567 of 1,950,000 records), ETA 40 s``, or in a later
        round ``catching up, round 2: 0 % (0 of 396,051 records that arrived during
        round 1)``. The rate is beside it (``read_rate``)."""
        counts = f"{self.percent:.0f} % ({self.done:,} of {self.total:,} records"
        if self.round > 1:
            line = (
                f"catching up, round {self.round}: {counts} that arrived during round "
                f"{self.round - 1})"
            )
        else:
            line = f"catching up {counts})"
        if self.eta_s is not None:
            line += f", ETA {readable_duration(self.eta_s)}"
        elif self.records_per_s and self.done < self.total:
            line += ", not gaining on the input"
        return line


def backlog_round(history: Sequence[PhaseChange]) -> int:
    """Which round the backlog under way is in: 1, and one more for each set of new
    markers taken at the log's end since it began (``NEW_ROUND``)."""
    rounds = 1
    for change in reversed(history):
        if change.phase != "backlog" or not change.cause.startswith(NEW_ROUND):
            break
        rounds += 1
    return rounds


def published_run(sink: Sink, config: PipelineConfig, now: float) -> RunProgress | None:
    """The progress the backlog run under way published, unless it is stale."""
    published = sink.published_progress()
    run = None if published is None else RunProgress.from_json(published)
    if run is None or now - run.at > STALE_AFTER_BEATS * config.switch.status_every:
        return None
    return run


def previous_chunk_rate(sink: Sink) -> float | None:
    """The chunk rate the pipeline's latest backlog run published, however long ago."""
    published = sink.published_progress()
    return None if published is None else RunProgress.from_json(published).chunk_rate


def backlog_progress(
    generation: Generation,
    run: RunProgress | None,
    config: PipelineConfig,
    history: Sequence[PhaseChange] = (),
) -> BacklogProgress:
    """The generation's backlog progress; ``run`` is the backlog run's published progress
    (ignored when it belongs to another generation), ``history`` the phase history (for
    the round)."""
    # With a watermark-lag threshold the backlog goes on through what arrives meanwhile.
    continues_rounds = config.backlog.watermark_lag_threshold is not None
    if run is not None and run.generation != generation.number:
        run = None
    read_to = {} if run is None else run.read_to
    buckets = tuple(
        BucketProgress(
            b.bucket,
            min(b.marker, max(b.reached, read_to.get(b.bucket, b.reached))) - b.start,
            b.marker - b.start,
        )
        for b in sorted(generation.buckets.values(), key=lambda s: s.bucket)
    )
    done, total = sum(b.done for b in buckets), sum(b.total for b in buckets)
    rate = None
    if run is not None and run.records_read > 0 and run.at > run.started_at:
        rate = run.records_read / (run.at - run.started_at)
    arrival = 0.0 if run is None else run.arrival_per_s
    return BacklogProgress(
        generation=generation.number,
        done=done,
        total=total,
        buckets=buckets,
        records_per_s=rate,
        arrival_per_s=arrival,
        eta_s=_eta(total - done, rate, arrival if continues_rounds else 0.0),
        round=backlog_round(history),
    )


def _eta(left: int, rate: float | None, arrival: float) -> float | None:
    if left <= 0:
        return 0.0
    if not rate or rate <= arrival:
        return None
    return left / (rate - arrival)


def readable_duration(seconds: float) -> str:
    """``0.8 s``, ``40 s``, ``3 min 20 s``, ``2 h 5 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def clock(unix_s: float) -> str:
    """``2026-12-02 04:12:03 UTC``: when something happened, in the one format every
    page, event and cursor of the project writes a time in."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))


def from_clock(text: str | float) -> float:
    """The Unix time ``clock`` wrote (a number, as cursors held before, passes as it is)."""
    if not isinstance(text, str):
        return float(text)
    return float(calendar.timegm(time.strptime(text, "%Y-%m-%d %H:%M:%S UTC")))


@dataclass(frozen=True)
class RealtimeLag:
    """How far realtime trails the input: records, and seconds of input."""

    records: int
    per_bucket: dict[int, int]
    #: Now less the latest event time committed (the watermark lag net of the allowed
    #: lateness); None before any commit.
    input_lag_s: float | None

    def describe(self) -> str:
        """``lag 0.8 s of input (12,345 records)``."""
        if self.input_lag_s is None:
            return f"lag {self.records:,} records"
        seconds = readable_duration(max(0.0, self.input_lag_s))
        return f"lag {seconds} of input ({self.records:,} records)"


def realtime_where(lag: RealtimeLag) -> str:
    """The pipeline's state in one line while it streams and keeps up:
    ``streaming, lag 0.8 s of input (12,345 records)`` (since when: ``phase_since``)."""
    return f"streaming, {lag.describe()}"


def realtime_lag(
    generation: Generation, latest: Mapping[int, int], mark: Lag | None, config: PipelineConfig
) -> RealtimeLag:
    """How far the committed progress trails the source's ``latest`` offsets; in seconds
    of input too when the watermark lag ``mark`` (``phases.lag``) is given."""
    reached = {b: s.reached for b, s in generation.buckets.items()}
    per_bucket = {b: max(0, end - reached.get(b, 0)) for b, end in latest.items()}
    seconds = None if mark is None else mark.seconds
    input_lag = None if seconds is None else seconds - lateness_us(config) / 1_000_000
    return RealtimeLag(sum(per_bucket.values()), per_bucket, input_lag)
