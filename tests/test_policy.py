"""The phase policy on synthetic timelines: the strategies, the way back, flapping."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from backlog_dagster.phases.lag import Lag
from backlog_dagster.phases.policy import decide, flapping, residual_says_backlog, way_backs
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import PhaseChange
from tests.pipelines import CUSTOMER_TOTALS, pipeline

TICK = 5.0


def lagging(seconds: float | None, idle: bool = False) -> Lag:
    return Lag(
        seconds=seconds,
        watermark_us=None,
        idle_buckets=(0,) if idle else (),
        active_buckets=() if idle else (0,),
    )


def configured(tmp_path: Path, **switch: Any) -> PipelineConfig:
    backlog = {"watermark_lag_threshold": switch.pop("threshold", 60)}
    backlog |= {k: switch.pop(k) for k in list(switch) if k == "boundary"}
    return pipeline(tmp_path, CUSTOMER_TOTALS, backlog=backlog, switch=switch)


def once(config: PipelineConfig, phase: str, markers_reached: bool, lag: Lag) -> str | None:
    """The cause if the policy changes the phase now, else None."""
    return decide(
        config,
        phase=phase,
        markers_reached=markers_reached,
        lag=lag,
        history=[PhaseChange(1, phase, 0.0, "test")],
        lag_above_since=None,
        now=1_000.0,
    ).cause


def test_lag_above_the_threshold_keeps_the_backlog(tmp_path: Path) -> None:
    config = configured(tmp_path, threshold=60)
    assert once(config, "backlog", True, lagging(61)) is None
    assert once(config, "backlog", True, lagging(60)) == (
        "every bucket reached its marker and watermark lag 60.0 s is within the threshold 60 s"
    )


def test_an_idle_source_does_not_hold_the_backlog(tmp_path: Path) -> None:
    config = configured(tmp_path, threshold=60)
    assert once(config, "backlog", True, lagging(10_000, idle=True)) == (
        "every bucket reached its marker and the source is idle"
    )
    # Active again with the same lag: checked afresh, back to holding the backlog.
    assert once(config, "backlog", True, lagging(10_000)) is None


def test_with_both_strategies_the_switch_waits_for_both(tmp_path: Path) -> None:
    config = configured(tmp_path, threshold=60)
    assert once(config, "backlog", False, lagging(1)) is None  # markers not reached
    assert once(config, "backlog", True, lagging(600)) is None  # lag too large
    assert once(config, "backlog", True, lagging(1)) is not None
    # boundary none: the markers do not hold the backlog, the lag alone decides
    lag_only = configured(tmp_path, threshold=60, boundary="none")
    assert once(lag_only, "backlog", False, lagging(1)) == (
        "watermark lag 1.0 s is within the threshold 60 s"
    )


def simulate(
    config: PipelineConfig,
    lag_step: Callable[[str, float], float],
    seconds: float,
) -> tuple[list[PhaseChange], list[bool]]:
    """Tick the policy every 5 s over a synthetic load; ``lag_step(phase, lag)`` moves the lag.

    Starts in realtime, markers reached. Returns the phase history and, per tick, whether
    the flapping warning was up.
    """
    history = [PhaseChange(1, "realtime", 0.0, "start")]
    lag, since, warnings = 0.0, None, []
    now = 0.0
    while now < seconds:
        now += TICK
        lag = lag_step(history[-1].phase, lag)
        decision = decide(
            config,
            phase=history[-1].phase,
            markers_reached=True,
            lag=lagging(lag),
            history=history,
            lag_above_since=since,
            now=now,
        )
        since = decision.lag_above_since
        if decision.cause is not None:
            history.append(PhaseChange(len(history) + 1, decision.phase, now, decision.cause, lag))
        warnings.append(flapping(history, now))
    return history, warnings


def test_realtime_goes_back_only_after_the_grace_period(tmp_path: Path) -> None:
    config = configured(tmp_path, threshold=60, grace_period=30, min_time_in_realtime=0)

    def stalls_after_a_minute(phase: str, lag: float) -> float:
        return lag + TICK if phase == "realtime" else 1.0  # the realtime run is down

    history, _ = simulate(config, stalls_after_a_minute, 200)
    back = history[1]
    assert back.phase == "backlog"
    # above 60 s from t=65 (lag 65), then 30 s of grace
    assert back.changed_at == 95.0
    assert back.cause.startswith("watermark lag 95.0 s above the threshold 60 s for 30 s")


def test_a_flapping_load_raises_the_warning_and_does_not_switch_endlessly(
    tmp_path: Path,
) -> None:
    """Realtime falls behind by 1 s per second of input; the backlog catches up in a tick."""
    config = configured(tmp_path, threshold=60, grace_period=30, min_time_in_realtime=120)

    def realtime_cannot_keep_up(phase: str, lag: float) -> float:
        return lag + TICK if phase == "realtime" else 5.0

    history, warnings = simulate(config, realtime_cannot_keep_up, 2 * 3600)
    backs = [c for c in history if c.phase == "backlog"]
    # Without the doubling this load would go back every 125 s: 57 times in two hours.
    assert len(backs) <= 8
    for back in backs:  # never more than five way backs in any hour
        assert sum(back.changed_at <= b.changed_at < back.changed_at + 3600 for b in backs) <= 5
    gaps = [b.changed_at - a.changed_at for a, b in itertools.pairwise(backs)]
    assert gaps[:4] == sorted(gaps[:4]) and gaps[3] >= 4 * gaps[0]  # the waits double
    assert any(warnings) and not warnings[0]
    first_warning = warnings.index(True)
    assert way_backs(history, (first_warning + 1) * TICK) == 2


def test_way_backs_older_than_an_hour_do_not_count() -> None:
    history = [
        PhaseChange(1, "realtime", 0.0, "switch"),
        PhaseChange(2, "backlog", 100.0, "lag", 90.0),
        PhaseChange(2, "realtime", 200.0, "switch"),
        PhaseChange(3, "backlog", 300.0, "lag", 90.0),
        PhaseChange(4, "backlog", 400.0, "reset"),  # not a way back: no realtime before
    ]
    assert way_backs(history, 400.0) == 2 and flapping(history, 400.0)
    assert way_backs(history, 3_750.0) == 1 and not flapping(history, 3_750.0)


def test_a_spark_conf_key_wins_over_the_phases_own_settings(tmp_path: Path) -> None:
    """backlog and realtime set shuffle partitions and adaptive execution themselves,
    except where the phase's spark_conf (the YAML's, with the run's over it) sets them."""
    from backlog_dagster.phases.backlog import batch_settings
    from backlog_dagster.phases.realtime import streaming_settings

    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    assert batch_settings(config, 5_000_000)["spark.sql.shuffle.partitions"] == "3"
    assert streaming_settings(config, None) == {
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.adaptive.enabled": "false",
    }
    conf = {"spark.sql.shuffle.partitions": "9", "spark.sql.adaptive.enabled": "true"}
    config = pipeline(
        tmp_path, CUSTOMER_TOTALS, backlog={"spark_conf": conf}, realtime={"spark_conf": conf}
    )
    assert batch_settings(config, 5_000_000) == {
        "spark.sql.adaptive.coalescePartitions.enabled": "true"
    }
    assert streaming_settings(config, 2) == {}


def test_at_its_markers_the_backlog_reads_on_while_much_arrived_and_less_each_round(
    tmp_path: Path,
) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS, backlog={"residual_records": 1_000})
    assert residual_says_backlog(5_000, config, None)
    assert not residual_says_backlog(1_000, config, None)
    assert residual_says_backlog(3_000, config, 5_000)
    # A round that did not shrink what is left: batch cannot outrun the input.
    assert not residual_says_backlog(6_000, config, 5_000)
    never = pipeline(tmp_path, CUSTOMER_TOTALS, backlog={"residual_records": 0})
    assert not residual_says_backlog(5_000, never, None)
    by_lag_alone = pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        backlog={"boundary": "none", "watermark_lag_threshold": 60, "residual_records": 1_000},
    )
    assert not residual_says_backlog(5_000, by_lag_alone, None)
