"""When the pipeline changes phase: the strategies of FLIP-309/328 and the way back.

Backlog → realtime: the pipeline is in backlog while *any* configured strategy says so
(FLIP-328's rule) and switches when none does:
- markers (``backlog.boundary: markers``): some bucket has not reached its marker;
- watermark lag (``backlog.watermark_lag_threshold``): the lag exceeds the threshold and
  the source is not idle.

At the markers, the backlog run itself may go on in batch to new markers at the log's
end: while the watermark lag holds (FLIP-328), and, with markers, while more records
arrived during the round than ``backlog.residual_records`` (``residual_says_backlog``):
what piled up while the backlog ran is caught up at batch speed, not by realtime.

Realtime → backlog (no FLIP has this): the watermark lag stayed above the threshold for
``switch.grace_period`` (a slow realtime run, or none at all, let records pile up), and
the pipeline has been in realtime for at least ``switch.min_time_in_realtime``, doubled
for each way back in the last hour. Going back repeatedly means realtime cannot keep up
with the input (FLIP-328's own argument against two thresholds): the doubling keeps such
a pipeline from switching endlessly, and ``flapping`` says so, to be shown as a warning.

Everything here is a pure function of its inputs, so the policy is tested on synthetic
timelines; the switch sensor feeds it the sink's state and the log's lag.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from backlog_dagster.phases.lag import Lag
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import PhaseChange

#: Way backs older than this do not count towards flapping or the doubling.
FLAP_WINDOW_S = 3600.0
#: This many way backs within the window is flapping.
FLAPPING_WAY_BACKS = 2
#: An offset lag must grow by at least this many records to count as growing: a lag of
#: a micro-batch or two comes and goes.
MIN_LAG_GROWTH = 10_000


@dataclass(frozen=True)
class Decision:
    phase: str
    #: Why the phase changes; None when it stays.
    cause: str | None
    #: Since when (Unix s) the lag has been above the threshold in realtime, if it is.
    lag_above_since: float | None


def over_threshold(lag: Lag | None, config: PipelineConfig) -> tuple[float, float] | None:
    """The watermark lag and the threshold (s) when a threshold is set and the lag is
    above it; else None."""
    threshold = config.backlog.watermark_lag_threshold
    if threshold is None or lag is None or lag.seconds is None or lag.seconds <= threshold:
        return None
    return lag.seconds, threshold


def lag_says_backlog(lag: Lag | None, config: PipelineConfig) -> bool:
    return lag is not None and not lag.idle and over_threshold(lag, config) is not None


def residual_says_backlog(residual: int, config: PipelineConfig, previous: int | None) -> bool:
    """At its markers, whether the backlog reads on to new ones: more records arrived
    while it ran than ``backlog.residual_records``, and fewer than at the start of this
    round (``previous``, None for the first), so that the rounds come to an end even
    when batch cannot outrun the input."""
    limit = config.backlog.residual_records
    if config.backlog.boundary != "markers" or limit == 0 or residual <= limit:
        return False
    return previous is None or residual < previous


def way_backs(history: Sequence[PhaseChange], now: float) -> int:
    """Realtime → backlog changes made by the lag strategy within the flap window."""
    count = 0
    for before, after in pairwise(history):
        if (
            before.phase == "realtime"
            and after.phase == "backlog"
            and after.lag_s is not None
            and 0 <= now - after.changed_at <= FLAP_WINDOW_S
        ):
            count += 1
    return count


def flapping(history: Sequence[PhaseChange], now: float) -> bool:
    return way_backs(history, now) >= FLAPPING_WAY_BACKS


def min_time_in_realtime(
    config: PipelineConfig, history: Sequence[PhaseChange], now: float
) -> float:
    return config.switch.min_time_in_realtime * 2 ** way_backs(history, now)


def decide(
    config: PipelineConfig,
    *,
    phase: str,
    markers_reached: bool,
    lag: Lag | None,
    history: Sequence[PhaseChange],
    lag_above_since: float | None,
    now: float,
) -> Decision:
    """The phase the pipeline should be in now, and why it changes if it does."""
    threshold = config.backlog.watermark_lag_threshold
    lagging = lag_says_backlog(lag, config)
    if phase == "backlog":
        if config.backlog.boundary == "markers" and not markers_reached:
            return Decision("backlog", None, None)
        if lagging:
            return Decision("backlog", None, None)
        reasons = []
        if config.backlog.boundary == "markers":
            reasons.append("every bucket reached its marker")
        if threshold is not None and lag is not None:
            reasons.append(
                "the source is idle"
                if lag.idle
                else f"{lag.describe()} is within the threshold {threshold:g} s"
            )
        return Decision("realtime", " and ".join(reasons), None)
    if not lagging:
        return Decision("realtime", None, None)
    assert lag is not None and lag.seconds is not None and threshold is not None
    since = now if lag_above_since is None else lag_above_since
    entered = max((c.changed_at for c in history if c.phase == "realtime"), default=now)
    if now - since < config.switch.grace_period:
        return Decision("realtime", None, since)
    if now - entered < min_time_in_realtime(config, history, now):
        return Decision("realtime", None, since)
    cause = (
        f"{lag.describe()} above the threshold {threshold:g} s for {now - since:.0f} s: "
        "back into backlog from the committed offsets to new markers at the log's end"
    )
    return Decision("backlog", cause, None)


def lag_grew(samples: Sequence[tuple[float, int]], window_s: float, now: float) -> bool:
    """The offset lag grew over the last ``window_s``: the samples (time, records behind)
    cover the window, every one in its last third is above every one in its first
    third, and the lag rose by at least ``MIN_LAG_GROWTH``. Realtime then clears less
    than arrives, whatever its checkpoint interval."""
    recent = [(t, lag) for t, lag in samples if t >= now - window_s]
    if not recent or recent[0][0] > now - 0.9 * window_s:
        return False
    first = [lag for t, lag in recent if t <= now - 2 * window_s / 3]
    last = [lag for t, lag in recent if t >= now - window_s / 3]
    return (
        bool(first and last)
        and min(last) > max(first)
        and recent[-1][1] - recent[0][1] >= MIN_LAG_GROWTH
    )
