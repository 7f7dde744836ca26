"""The switch: a sensor per pipeline that decides its phase and keeps one run going.

Each tick (no Spark; well under Dagster's 60 s tick limit) reads the sink, and the log
where the watermark-lag strategy needs it:

- no markers yet → take them (the log's end offsets, durable before any work) and
  request the backlog run, which goes on as the realtime run once the switch is due
  (``switch.continue_as_realtime``, the default); or, with ``switch.standby``, a
  standby realtime run beside it (with ``switch.standby_lead`` set: once that run is
  reading and its ETA, when known, is within the lead);
- a bucket that reached its marker for the first time → one asset observation naming
  bucket, marker and offset reached (the Fluss seed's BacklogFinishEvent); the set of
  reported buckets lives in the cursor, so restarts of the sensor or daemon do not
  report a bucket twice;
- the phase the pipeline should be in (``phases.policy``: markers, watermark lag, the
  way back, its guard against flapping); a change is recorded in the sink's phase
  history (FLIP-309's isProcessingBacklog) with its cause and the lag it was decided on;
  the way back starts a new generation from the committed offsets to new markers;
- each phase-history row is reported once as a ``RecordAttributes`` observation on the
  asset of the phase entered, with the history so far, and both checks say the phase
  entered (once realtime is entered and reported, its run evaluates ``keeps_up``: a
  Dagster check counts against a materialization of the same run);
- one run of the phase at a time: requested when none is active (after the other
  phase's run has stopped), not restarted after a user cancelled a realtime run until
  the sensor is turned off and on. A backlog run that went on as the realtime run (its
  phase tag says so) is the realtime phase's run.

A backlog or realtime run that stopped beating its heartbeat in the sink (its process
died, which Dagster's default run launcher cannot see) is marked failed and restarted at
once, from the sink's progress; so is one left starting that never started (the daemon
was killed between marking it starting and launching it, or its process died before it
began), and a run being cancelled whose process is gone is marked cancelled: without
Dagster's run monitoring (off by default) either would stay active for ever.

Run keys make every request idempotent: two ticks never start two runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from backlog_dagster.components.observations import (
    backlog_observation,
    finish_observation,
    phase_metadata,
    phase_observation,
)
from backlog_dagster.implementations import open_source
from backlog_dagster.phases.lag import Lag, lateness_us, watermark_lag
from backlog_dagster.phases.markers import continue_backlog, current_generation, extend_markers
from backlog_dagster.phases.policy import (
    FLAP_WINDOW_S,
    decide,
    flapping,
    lag_grew,
    over_threshold,
    way_backs,
)
from backlog_dagster.phases.progress import (
    BacklogProgress,
    backlog_progress,
    clock,
    from_clock,
    published_run,
    readable_duration,
    realtime_lag,
    realtime_where,
)
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Generation, PhaseChange, Sink, open_sink
from backlog_dagster.source import Source, SourceError

#: A run whose own code failed within this long of its start failed early: the next
#: one waits after it ended, 5 s after the first such failure in a row and twice as
#: long after each next one, up to this; so a persistent failure (a missing topic,
#: say) does not launch a run every tick, and a passing one (a Spark Connect server
#: starting again) costs seconds. A run that failed after working longer, or whose
#: process died (killed, out of memory), is restarted at once: waiting changes nothing.
RETRY_AFTER_S = 30
FIRST_RETRY_AFTER_S = 5
#: The failure reasons Dagster tags a run with (``dagster/failure_reason``) when its own
#: code failed; a run whose process died has another reason, or none.
OWN_FAILURES = frozenset({"STEP_FAILURE", "RUN_EXCEPTION", "JOB_INITIALIZATION_FAILURE"})

#: A run's phase: the one it was requested for, or "realtime" once a backlog run went
#: on as the realtime run (``switch.continue_as_realtime``).
PHASE_TAG = "backlog_dagster/phase"
#: A realtime run's tags: waiting as a standby ("true") or not (it took over at the
#: switch, or never was one); and how it started ("standby", or "backlog" for a backlog
#: run that went on as the realtime run).
STANDBY_TAG = "backlog_dagster/standby"
STARTED_AS_TAG = "backlog_dagster/started_as"

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def job_names(config: PipelineConfig) -> dict[str, str]:
    """Each phase's job, named for what its runs do: with ``switch.continue_as_realtime``
    (the default) the backlog's job runs realtime too, once the switch is due, and says
    so (``<name>_backlog_then_realtime_job``); the realtime job is ``<name>_realtime_job``.
    A run's ``backlog_dagster/phase`` tag says which phase it is in now."""
    first = "backlog_then_realtime" if config.switch.continue_as_realtime else "backlog"
    return {"backlog": f"{config.name}_{first}_job", "realtime": f"{config.name}_realtime_job"}


#: Every name a pipeline's phase jobs can have, for ``runs_of_phase``.
JOB_SUFFIXES = ("_backlog_then_realtime_job", "_backlog_job", "_realtime_job")


def backlog_run_config(config: PipelineConfig) -> dict[str, Any]:
    """What the backlog run gets: the backlog checkpoint interval, batch shuffle settings."""
    backlog = config.backlog
    return {
        "ops": {
            f"{config.name}_backlog": {
                "config": {
                    "checkpoint_interval": backlog.checkpoint_interval,
                    "shuffle_partitions": str(backlog.shuffle_partitions),
                    "adaptive_query_execution": backlog.adaptive_query_execution,
                    "spark_conf": dict(backlog.spark_conf),
                }
            }
        }
    }


def realtime_run_config(config: PipelineConfig, standby_for: int | None = None) -> dict[str, Any]:
    """What the realtime run gets: the realtime interval, a small fixed shuffle.

    ``standby_for`` a generation: started while that generation's backlog runs (the
    field is left out otherwise).
    """
    realtime = config.realtime
    run_config: dict[str, Any] = {
        "checkpoint_interval": realtime.checkpoint_interval,
        "shuffle_partitions": realtime.shuffle_partitions,
        "spark_conf": dict(realtime.spark_conf),
    }
    if standby_for is not None:
        run_config["standby_for_generation"] = standby_for
    return {"ops": {f"{config.name}_realtime": {"config": run_config}}}


@dataclass(frozen=True)
class _Switch:
    """What a pipeline's switch sensor works with on every tick."""

    config: PipelineConfig
    #: Each phase's job, the run config it launches it with, and its asset.
    job_of: dict[str, str]
    run_config_of: dict[str, dict[str, Any]]
    asset_of: dict[str, dg.AssetKey]


def switch_sensor(
    config: PipelineConfig,
    jobs: list[dg.UnresolvedAssetJobDefinition],
    asset_of: Mapping[str, dg.AssetKey] | None = None,
) -> dg.SensorDefinition:
    """The pipeline's switch sensor, launching ``jobs`` and reporting on the assets
    ``asset_of`` each phase (else ``<name>_backlog`` and ``<name>_realtime``)."""
    name = config.name
    switch_of = _Switch(
        config,
        job_names(config),
        {"backlog": backlog_run_config(config), "realtime": realtime_run_config(config)},
        dict(asset_of or {p: dg.AssetKey(f"{name}_{p}") for p in ("backlog", "realtime")}),
    )

    @dg.sensor(
        name=f"{name}_switch",
        minimum_interval_seconds=max(1, round(config.switch.interval)),
        default_status=dg.DefaultSensorStatus.RUNNING
        if config.switch.running_by_default
        else dg.DefaultSensorStatus.STOPPED,
        jobs=jobs,
        description=f"Decides {name}'s phase from its buckets' progress and watermark lag, "
        "and keeps one run of that phase going.",
    )
    def switch(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        return _tick(context, switch_of)

    return switch


@dataclass
class _Seen:
    """What a tick found: the generation (after the decision), the cursor, where the
    pipeline is, the events to report, and whether a standby is due."""

    generation: Generation | None
    cursor: dict[str, Any]
    where: str = "no markers yet"
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = field(default_factory=list)
    standby_due: bool = False


def _tick(context: dg.SensorEvaluationContext, switch: _Switch) -> dg.SensorResult:
    """One tick: end runs that went silent, take markers, decide the phase, report where
    the pipeline is, and request the run (and standby) the phase needs."""
    config = switch.config
    cursor = json.loads(context.cursor or "{}")
    now = time.time()
    last = _last_runs(context, switch.job_of)
    with open_sink(config) as sink:
        died = _end_silent_runs(context, config, sink, last)
        generation, misfit = _markers(context, config, sink)
        if misfit:
            return dg.SensorResult(
                cursor=json.dumps(cursor), skip_reason=f"no markers taken: {misfit}"
            )
        seen = _Seen(generation, cursor)
        if generation is not None:
            seen = _look(context, switch, sink, generation, cursor, now, last)
        phase = sink.phase()
    number = 0 if seen.generation is None else seen.generation.number
    _end_standby_of_failing_backlog(context, config, number, last)
    _tags_follow(context, last, number)
    finished = seen.generation is not None and seen.generation.finished
    request, skip = _run_request(
        context, switch, seen.cursor, (phase, number, finished), last, died
    )
    requests = [] if request is None else [request]
    standby = _standby_request(context, config, phase, number, last, request, seen.standby_due)
    if standby is not None:
        requests.append(standby)
    # Where the pipeline is comes first in the cursor, which the sensor's page shows,
    # and in every tick's reason.
    cursor = {"where": seen.where, **{k: v for k, v in seen.cursor.items() if k != "where"}}
    where = seen.where
    return dg.SensorResult(
        run_requests=requests,
        asset_events=seen.events,
        cursor=json.dumps(cursor),
        skip_reason=None if requests else f"{where}; {skip}" if skip else where,
    )


def _end_silent_runs(
    context: dg.SensorEvaluationContext,
    config: PipelineConfig,
    sink: Sink,
    last: dict[str, dg.DagsterRun | None],
) -> set[str]:
    """End each phase's run that stopped beating (``_silent``); the phases whose run died."""
    died: set[str] = set()
    for phase, run in last.items():
        if run is not None and _silent(context, sink, run, config):
            died.add(phase)
            _end_silent_run(context, run, phase, config)
            last[phase] = context.instance.get_run_by_id(run.run_id)
    return died


def _look(
    context: dg.SensorEvaluationContext,
    switch: _Switch,
    sink: Sink,
    generation: Generation,
    cursor: dict[str, Any],
    now: float,
    last: dict[str, dg.DagsterRun | None],
) -> _Seen:
    """Decide the phase of ``generation`` and what the tick reports on it."""
    config, asset_of = switch.config, switch.asset_of
    cursor = _for_generation(cursor, generation.number)
    once: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    once += _finish_events(generation, cursor, asset_of["backlog"])
    paused = _cancelled_by_user(context, last["realtime"])
    generation, lag = _decide(context, config, sink, generation, cursor, now, paused, last)
    cursor = _for_generation(cursor, generation.number)
    history = sink.phase_history()
    once += _phase_events(history, cursor, asset_of, config)
    events = _not_stored_yet(context.instance, once)
    if history and history[-1].phase == "realtime":
        events += _after_materializations(context.instance, cursor, asset_of, history)
    run = last["realtime"]
    # While a realtime run is active it evaluates keeps_up itself (``realtime_keeps_up``).
    judged = run is not None and not run.is_finished
    where, reports = _where(config, sink, generation, (lag, judged), history, cursor, now, asset_of)
    standby_due = _standby_due(config, sink, generation, now)
    return _Seen(generation, cursor, where, events + reports, standby_due)


def _after_materializations(
    instance: dg.DagsterInstance,
    cursor: dict[str, Any],
    asset_of: dict[str, dg.AssetKey],
    history: list[PhaseChange],
) -> list[dg.AssetCheckEvaluation]:
    """While streaming, ``catches_up`` passes with "backlog finished": at the first tick
    in realtime and again after each later materialization of the backlog asset (a
    backlog run that went on past the switch materializes it as its backlog step ends),
    each evaluation aimed at that materialization (``_latest_materialization``)."""
    latest = _latest_materialization(instance, asset_of["backlog"])
    checked = cursor.setdefault(CHECKED_MATERIALIZATION, {})
    at = None if latest is None else latest.storage_id
    if "backlog" in checked and checked["backlog"] == at:
        return []
    checked["backlog"] = at
    said = f"backlog finished; {_said(history[-1])}"
    return [catches_up(asset_of["backlog"], True, said, latest)]


#: The cursor's key for the backlog asset's latest materialization the sensor has seen
#: (its storage id in Dagster's event log).
CHECKED_MATERIALIZATION = "checked_after"


def _latest_materialization(
    instance: dg.DagsterInstance, key: dg.AssetKey
) -> dg.EventLogRecord | None:
    """``key``'s latest materialization, if any.

    Dagster's catalog and lineage count a check as passed only when it was evaluated
    in the same run as the asset's latest materialization, or aimed at it, or (failing
    both) stored after it, by timestamps the event log keeps to the second
    (``AssetCheckExecutionRecord.targets_latest_materialization``).
    """
    records = instance.fetch_materializations(key, limit=1).records
    return records[0] if records else None


def _markers(
    context: dg.SensorEvaluationContext, config: PipelineConfig, sink: Sink
) -> tuple[Generation | None, str]:
    """The current generation; on the pipeline's first tick, its markers are taken here.

    Taking them in the tick (the log's end offsets: no Spark) rather than in the backlog
    run lets the standby realtime run start beside the backlog run, not a Spark start
    later. A definition that does not fit its source takes none (the second value says
    why); a topic that is not there yet is left to the backlog run to report.
    """
    from backlog_dagster.phases.transform import source_problems

    generation = sink.current_generation()
    if generation is not None:
        return generation, ""
    try:
        with open_source(config) as topic:
            problems = source_problems(config, topic)
            if problems:
                return None, "; ".join(str(p) for p in problems)
            return current_generation(sink, topic, config, context.log.info), ""
    except (SourceError, OSError, ValueError) as error:
        context.log.warning(f"{config.name}: no markers yet: {error}")
        return None, ""


def _last_run(context: dg.SensorEvaluationContext, job: str) -> dg.DagsterRun | None:
    """The job's newest active run, or else its newest run.

    A newer run can have ended while an older one goes on: one a user launched by hand
    that was refused because the older run holds the pipeline. It says nothing about
    the older run, which is the one to watch.
    """
    for statuses in (ACTIVE, None):
        runs = context.instance.get_runs(
            filters=dg.RunsFilter(job_name=job, statuses=statuses), limit=1
        )
        if runs:
            return runs[0]
    return None


def _last_runs(
    context: dg.SensorEvaluationContext, job_of: dict[str, str]
) -> dict[str, dg.DagsterRun | None]:
    """Each phase's run to watch (``_last_run`` of its job). A backlog run that went on
    as the realtime run (its phase tag says realtime) is the realtime phase's, unless a
    realtime run was requested after it (as when it died serving realtime)."""
    last = {phase: _last_run(context, job) for phase, job in job_of.items()}
    went_on, realtime = last["backlog"], last["realtime"]
    if went_on is None or went_on.tags.get(PHASE_TAG) != "realtime":
        return last
    instance = context.instance
    if realtime is None or (
        realtime.status not in ACTIVE
        and created_at(instance, went_on) > created_at(instance, realtime)
    ):
        realtime = went_on
    return {"backlog": None, "realtime": realtime}


def _phase_of_job(suffix: str) -> str:
    """The phase a run of the job ``suffix`` names is in when its tag does not say."""
    return "realtime" if suffix == "_realtime_job" else "backlog"


def created_at(instance: dg.DagsterInstance, run: dg.DagsterRun) -> float:
    record = instance.get_run_record_by_id(run.run_id)
    return 0.0 if record is None else record.create_timestamp.timestamp()


def runs_of_phase(
    instance: dg.DagsterInstance,
    pipeline: str,
    phase: str,
    statuses: list[dg.DagsterRunStatus] | None = None,
) -> list[dg.DagsterRun]:
    """The pipeline's runs of ``phase`` (with one of ``statuses``), the newest first: its
    phase job's, and for realtime its backlog runs that went on as the realtime run; a
    run's phase tag says which (a run launched by hand has none: its job's)."""
    records = [
        record
        for suffix in JOB_SUFFIXES
        for record in instance.get_run_records(
            filters=dg.RunsFilter(job_name=f"{pipeline}{suffix}", statuses=statuses)
        )
        if record.dagster_run.tags.get(PHASE_TAG, _phase_of_job(suffix)) == phase
    ]
    records.sort(key=lambda record: record.create_timestamp, reverse=True)
    return [record.dagster_run for record in records]


def _for_generation(cursor: dict[str, Any], number: int) -> dict[str, Any]:
    """The cursor, with its per-generation part started afresh when the generation changed."""
    if cursor.get("generation") == number:
        return cursor
    return {
        "generation": number,
        "finished": [],
        "backlog_attempt": 1,
        "realtime_attempt": 1,
        "reported": cursor.get("reported", 0),
        "lag_above_since": None,
    }


#: How many of an asset's newest observations a tick looks through for the ones it is
#: about to report (``_not_stored_yet``): a backlog run's progress reports, made while
#: the daemon was down, come between.
STORED_LOOKBACK = 500


def _finish_events(
    generation: Generation, cursor: dict[str, Any], key: dg.AssetKey
) -> list[dg.AssetObservation]:
    """One observation for the buckets that reached their markers since the last tick."""
    reached = [
        b
        for b in sorted(generation.buckets.values(), key=lambda b: b.bucket)
        if b.finished and b.bucket not in cursor["finished"]
    ]
    if not reached:
        return []
    cursor["finished"].extend(b.bucket for b in reached)
    left = sum(not b.finished for b in generation.buckets.values())
    return [finish_observation(key, generation.number, reached, left)]


def _not_stored_yet(
    instance: dg.DagsterInstance, events: list[dg.AssetObservation | dg.AssetCheckEvaluation]
) -> list[dg.AssetObservation | dg.AssetCheckEvaluation]:
    """``events`` (each reported once: a bucket's finish, a phase change) without the
    observations the instance already holds.

    The cursor says what was reported; but Dagster stores a tick's observations before
    its cursor, so a daemon killed between the two ticks again from the older cursor.
    An observation says what it reports in its description (the bucket and generation,
    the phase and its moment), so one already among its asset's newest is left out. The
    instance is asked only on a tick that has such events."""
    keys = {event.asset_key for event in events if isinstance(event, dg.AssetObservation)}
    stored = {
        (key, record.asset_observation.description)
        for key in keys
        for record in instance.fetch_observations(key, limit=STORED_LOOKBACK).records
        if record.asset_observation is not None
    }
    return [
        event
        for event in events
        if not isinstance(event, dg.AssetObservation)
        or (event.asset_key, event.description) not in stored
    ]


def _decide(
    context: dg.SensorEvaluationContext,
    config: PipelineConfig,
    sink: Sink,
    generation: Generation,
    cursor: dict[str, Any],
    now: float,
    paused: bool,
    last: dict[str, dg.DagsterRun | None],
) -> tuple[Generation, Lag | None]:
    """Apply the phase policy; returns the generation (a new one if it went back) and the
    watermark lag it was decided on (measured only where a threshold is set: for a
    Kafka topic it reads each partition's last record)."""
    threshold = config.backlog.watermark_lag_threshold
    with open_source(config) as topic:
        lag = None if threshold is None else watermark_lag(generation, topic, config, now)
        lag_s = None if lag is None else lag.seconds
        phase = sink.phase()
        decision = decide(
            config,
            phase=phase,
            markers_reached=generation.finished,
            lag=lag,
            history=sink.phase_history(),
            lag_above_since=_unix(cursor.get("lag_above_since")),
            now=now,
        )
        cursor["lag_above_since"] = _text(decision.lag_above_since)
        if lag is not None:
            # The state line's lag is this one, net of the window's allowed lateness.
            net = ""
            if lag.seconds is not None:
                input_s = max(0.0, lag.seconds - lateness_us(config) / 1_000_000)
                net = f": {readable_duration(input_s)} of input behind"
            context.log.info(
                f"{config.name}: {phase}, {lag.describe()} (threshold {threshold:g} s){net}"
            )
        if decision.cause is not None and not (phase == "realtime" and paused):
            if decision.phase == "realtime":
                sink.record_phase(generation.number, "realtime", decision.cause, lag_s)
            else:
                generation = continue_backlog(
                    sink, topic, config, decision.cause, lag_s, context.log.info
                )
        elif phase == "backlog" and not any(
            run is not None and run.status in ACTIVE and not _standby_of(run, generation.number)
            for run in last.values()
        ):
            # The backlog run takes new markers itself when it reaches them with the lag
            # still high; this covers a run that ended (or died) just there.
            generation = extend_markers(sink, topic, config, context.log.info) or generation
    return generation, lag


def _phase_events(
    history: list[PhaseChange],
    cursor: dict[str, Any],
    asset_of: dict[str, dg.AssetKey],
    config: PipelineConfig,
) -> list[dg.AssetObservation | dg.AssetCheckEvaluation]:
    """Each phase change not reported yet, once, with the history so far and the checks."""
    events: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
    for index in range(cursor.get("reported", 0), len(history)):
        change = history[index]
        said = _said(change)
        metadata: dict[str, Any] = {
            **phase_metadata(change.phase, change.changed_at, change.generation, said),
            "event": "RecordAttributes",
            "is_backlog": change.phase == "backlog",
            "cause": change.cause,
            "phase_history": dg.MetadataValue.md(history_table(history[: index + 1])),
        }
        if change.lag_s is not None:
            metadata["watermark_lag_s"] = round(change.lag_s, 3)
        if config.backlog.watermark_lag_threshold is not None:
            metadata["watermark_lag_threshold_s"] = config.backlog.watermark_lag_threshold
        entered = asset_of[change.phase]
        events.append(dg.AssetObservation(asset_key=entered, description=said, metadata=metadata))
        # The other phase's asset says it too: its overview shows its own latest values.
        other = asset_of["realtime" if change.phase == "backlog" else "backlog"]
        events.append(
            phase_observation(other, change.phase, change.changed_at, change.generation, said)
        )
        # Entering realtime, keeps_up comes from the realtime run once this is stored
        # (``phase_reported``), catches_up from ``_after_materializations``.
        if change.phase == "backlog":
            events.append(catches_up(asset_of["backlog"], True, f"catching up; {said}"))
            events.append(not_streaming(asset_of["realtime"], said))
    cursor["reported"] = len(history)
    return events


def _said(change: PhaseChange) -> str:
    """A phase change in one line: the phase entered, when, and why."""
    return f"{change.phase} since {clock(change.changed_at)}: {change.cause}"


def catches_up(
    key: dg.AssetKey, passed: bool, state: str, target: dg.EventLogRecord | None = None
) -> dg.AssetCheckEvaluation:
    """The backlog asset's ``catches_up`` check: the backlog's state in its description;
    a warning while it reads slower than records arrive. ``target``: the asset's
    materialization it is about."""
    # Dagster's own pointer to a materialization (not exported; Dagster is pinned to 1.13).
    from dagster._core.definitions.asset_checks.asset_check_evaluation import (
        AssetCheckEvaluationTargetMaterializationData,
    )

    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name="catches_up",
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=catches_up_description(passed, state),
        target_materialization_data=None
        if target is None
        else AssetCheckEvaluationTargetMaterializationData(
            storage_id=target.storage_id, run_id=target.run_id, timestamp=target.timestamp
        ),
    )


def catches_up_description(passed: bool, state: str) -> str:
    """``catches_up``'s description, as the sensor and a run by hand give it."""
    if passed:
        return state
    return (
        f"{state}: the backlog reads slower than records arrive, so it does not gain on "
        "the input. Give the backlog phase more resources (spark_master, "
        "backlog.spark_conf) or let it switch at its markers (no watermark_lag_threshold)."
    )


def not_streaming(key: dg.AssetKey, state: str) -> dg.AssetCheckEvaluation:
    """The realtime asset's ``keeps_up`` while the pipeline is in backlog: a warning
    that says how far the catch-up is (nothing is live yet)."""
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name="keeps_up",
        passed=False,
        severity=dg.AssetCheckSeverity.WARN,
        description=f"not streaming yet: {state}",
    )


def keeps_up(
    history: list[PhaseChange],
    key: dg.AssetKey,
    now: float,
    lag_growth: tuple[int, int] | None = None,
    watermark_over: tuple[float, float] | None = None,
    state: str = "",
) -> dg.AssetCheckEvaluation:
    """The ``keeps_up`` check's evaluation, as the sensor reports it: at each phase change
    and, in realtime, every ``switch.report_every`` with the pipeline's ``state``."""
    passed, description, count = keeps_up_verdict(history, now, lag_growth, watermark_over, state)
    return dg.AssetCheckEvaluation(
        asset_key=key,
        check_name="keeps_up",
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=description,
        metadata={"way_backs_last_hour": count},
    )


def keeps_up_verdict(
    history: list[PhaseChange],
    now: float,
    lag_growth: tuple[int, int] | None = None,
    watermark_over: tuple[float, float] | None = None,
    state: str = "",
) -> tuple[bool, str, int]:
    """Passed unless realtime does not keep up: the pipeline is flapping, its offset lag
    grew over the window (``lag_growth``: records behind then and now), or its watermark
    lag is over the threshold (``watermark_over``: lag and threshold, s). The description
    begins with the pipeline's state in one line (``state`` when it keeps up, ``behind:
    ...`` when it does not), then says why and what to do; the way backs counted."""
    count = way_backs(history, now)
    counted = f"{count} way(s) back into backlog in the last {FLAP_WINDOW_S / 60:.0f} minutes"
    short, problems = behind(history, now, lag_growth, watermark_over)
    if not problems:
        return True, f"{state}; {counted}" if state else counted, count
    return (
        False,
        f"{short}. Realtime does not keep up with the input: "
        + "; ".join(problems)
        + ". Give the realtime phase more resources (more cores or executors through "
        "spark_master and realtime.spark_conf) or a larger realtime.max_records_per_trigger.",
        count,
    )


def behind(
    history: list[PhaseChange],
    now: float,
    lag_growth: tuple[int, int] | None = None,
    watermark_over: tuple[float, float] | None = None,
) -> tuple[str, list[str]]:
    """Why realtime does not keep up: in one line (``behind: lag grew ...``, empty when
    it keeps up) and in full."""
    count = way_backs(history, now)
    window = f"{FLAP_WINDOW_S / 60:.0f} minutes"
    short, problems = [], []
    if flapping(history, now):
        short.append(f"back into backlog {count} times in the last {window}")
        problems.append(
            f"{count} way(s) back into backlog in the last {window}: the pipeline keeps "
            "going back into backlog (it now waits longer in realtime before each way back)"
        )
    if lag_growth is not None:
        before, after = lag_growth
        grew = f" ({(after - before) / before:+.0%})" if before else ""
        short.append(f"lag grew from {before:,} to {after:,} records{grew}")
        problems.append(
            f"the realtime lag grew from {before:,} to {after:,} records: "
            "realtime clears fewer records than arrive"
        )
    if watermark_over is not None:
        lag, threshold = (readable_duration(s) for s in watermark_over)
        short.append(f"watermark lag {lag}, over the threshold of {threshold}")
        problems.append(
            f"the watermark lag ({lag}) is over the threshold ({threshold}): unless realtime "
            "catches up within the grace period, the pipeline goes back into backlog"
        )
    return ("behind: " + "; ".join(short) if short else ""), problems


def history_table(history: list[PhaseChange]) -> str:
    """The phase history as a Markdown table (newest last, at most the last 20 rows)."""
    lines = [
        "| generation | phase | changed at (UTC) | watermark lag (s) | cause |",
        "|---|---|---|---|---|",
    ]
    for change in history[-20:]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(change.changed_at))
        lag = "" if change.lag_s is None else f"{change.lag_s:,.1f}"
        lines.append(f"| {change.generation} | {change.phase} | {when} | {lag} | {change.cause} |")
    return "\n".join(lines)


#: Offset lag samples kept per keeps_up window (in the cursor).
LAG_SAMPLES = 30


def _where(
    config: PipelineConfig,
    sink: Sink,
    generation: Generation,
    seen: tuple[Lag | None, bool],
    history: list[PhaseChange],
    cursor: dict[str, Any],
    now: float,
    asset_of: dict[str, dg.AssetKey],
) -> tuple[str, list[dg.AssetObservation | dg.AssetCheckEvaluation]]:
    """The pipeline's state in one line, and the reports due every ``switch.report_every``:
    in backlog, the progress the backlog run published and both assets' checks; in
    realtime, the ``keeps_up`` check on the lag and its growth (at once when its verdict
    changes), unless an active realtime run judges it. ``seen``: the watermark lag, and
    whether a realtime run is active."""
    mark, judged = seen
    since = history[-1].changed_at if history else generation.created_at
    cursor.pop("observed_at", None)  # a cursor's key from before ``reported_at``
    due = now - (_unix(cursor.get("reported_at")) or 0.0) >= config.switch.report_every
    if not history or history[-1].phase == "backlog":
        run = published_run(sink, config, now)
        progress = backlog_progress(generation, run, config, history)
        where = progress.describe()
        reports: list[dg.AssetObservation | dg.AssetCheckEvaluation] = []
        # Progress is observed once the backlog run publishes it; both checks say the
        # state from the first tick on.
        if run is not None and due:
            cursor["reported_at"] = clock(now)
            reports.append(backlog_observation(asset_of["backlog"], progress, since))
        if now - (_unix(cursor.get("checked_at")) or 0.0) >= config.switch.report_every:
            cursor["checked_at"] = clock(now)
            reports.append(catches_up(asset_of["backlog"], gaining(progress), where))
            reports.append(not_streaming(asset_of["realtime"], where))
        return where, reports
    held = [(from_clock(t), int(n)) for t, n in cursor.get("lag_samples", [])]
    with open_source(config) as topic:
        where, evaluation, samples = streaming_check(
            config, topic, generation, (mark, history), held, now, asset_of["realtime"]
        )
    cursor["lag_samples"] = [[clock(t), n] for t, n in samples]
    if judged:
        # Forgotten, so that the first tick after the run has ended evaluates at once.
        cursor.pop("keeps_up", None)
        return where, []
    verdict_changed = cursor.get("keeps_up") != evaluation.passed
    if not (due or verdict_changed):
        return where, []
    cursor["reported_at"], cursor["keeps_up"] = clock(now), evaluation.passed
    return where, [evaluation]


def streaming_check(
    config: PipelineConfig,
    topic: Source,
    generation: Generation,
    seen: tuple[Lag | None, list[PhaseChange]],
    samples: list[tuple[float, int]],
    now: float,
    key: dg.AssetKey,
) -> tuple[str, dg.AssetCheckEvaluation, list[tuple[float, int]]]:
    """While streaming: the pipeline's state in one line and its ``keeps_up`` evaluation
    on ``key``, from the offset lag's growth over ``switch.keeps_up_window`` (``samples``
    of it, time and records behind, this one added when due), the watermark lag and the
    phase history (``seen``); and the samples to keep. The sensor and the realtime run
    both judge by it."""
    mark, history = seen
    lag = realtime_lag(generation, topic.latest_offsets(), mark, config)
    window = config.switch.keeps_up_window
    kept = [(t, n) for t, n in samples if t >= now - window]
    if not kept or now - kept[-1][0] >= window / LAG_SAMPLES:
        kept.append((now, lag.records))
    growth = (kept[0][1], kept[-1][1]) if lag_grew(kept, window, now) else None
    over = over_threshold(mark, config)
    short, _ = behind(history, now, growth, over)
    where = short or realtime_where(lag)
    return where, keeps_up(history, key, now, growth, over, where), kept


#: Dagster's default limit on a sensor evaluation (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``):
#: a tick that began before the switch has stored its events by then.
SENSOR_TICK_LIMIT_S = 60.0


@contextmanager
def realtime_keeps_up(
    config: PipelineConfig, sink: Sink, instance: dg.DagsterInstance, key: dg.AssetKey
) -> Iterator[Callable[[], dg.AssetCheckEvaluation | None]]:
    """The realtime run's own ``keeps_up`` on ``key`` (``streaming_check``, on lag samples
    the run keeps), evaluated with each status it materializes, over one source kept
    open while the run lasts (opened again after an error).

    Dagster keeps one check record per run, which each evaluation in the run updates,
    and shows the newest record; it counts that record against the asset's latest
    materialization when both come from the same run. So the run evaluates the check
    while it streams, the sensor does not, and the run's first evaluation waits until
    the sensor has reported the switch (``phase_reported``), or, with the sensor
    stopped, until any tick that began before the switch has ended
    (``SENSOR_TICK_LIMIT_S``): a record from the sensor after it would hide the run's
    for as long as the run lasts. None while that is not the case, or while the source
    cannot say its offsets (the sensor goes on judging once the run has ended)."""
    samples: list[tuple[float, int]] = []
    topic: Source | None = None
    with ExitStack() as held:

        def evaluate() -> dg.AssetCheckEvaluation | None:
            nonlocal topic
            now = time.time()
            generation, history = sink.current_generation(), sink.phase_history()
            if generation is None or not history or history[-1].phase != "realtime":
                return None
            if not (
                samples
                or now - history[-1].changed_at >= SENSOR_TICK_LIMIT_S
                or phase_reported(instance, key, history[-1])
            ):
                return None
            try:
                if topic is None:
                    topic = held.enter_context(open_source(config))
                mark = None
                if config.backlog.watermark_lag_threshold is not None:
                    mark = watermark_lag(generation, topic, config, now)
                _, evaluation, kept = streaming_check(
                    config, topic, generation, (mark, history), samples, now, key
                )
            except SourceError:
                held.close()  # opened again at the next status
                topic = None
                return None
            samples[:] = kept
            return evaluation

        yield evaluate


def phase_reported(instance: dg.DagsterInstance, key: dg.AssetKey, change: PhaseChange) -> bool:
    """Whether the sensor's observation of ``change`` on ``key`` is stored."""
    said = _said(change)
    records = instance.fetch_observations(key, limit=STORED_LOOKBACK).records
    return any(r.asset_observation and r.asset_observation.description == said for r in records)


def gaining(progress: BacklogProgress) -> bool:
    """Whether the backlog gains on the input (or has not measured its rate yet)."""
    return not (
        progress.records_per_s and progress.eta_s is None and progress.done < progress.total
    )


def _unix(value: str | float | None) -> float | None:
    """A time the cursor holds (``clock``'s text; a number in a cursor from before)."""
    return None if value is None else from_clock(value)


def _text(unix_s: float | None) -> str | None:
    return None if unix_s is None else clock(unix_s)


def _tags_follow(
    context: dg.SensorEvaluationContext,
    last: dict[str, dg.DagsterRun | None],
    number: int,
) -> None:
    """The generation tag of each active run is the pipeline's generation now (the Runs
    page then says which markers a run works towards, after new rounds too)."""
    for run in last.values():
        if (
            run is not None
            and run.status in ACTIVE
            and number
            and run.tags.get("backlog_dagster/generation") != str(number)
        ):
            context.instance.add_run_tags(run.run_id, {"backlog_dagster/generation": str(number)})


def _run_request(
    context: dg.SensorEvaluationContext,
    switch: _Switch,
    cursor: dict[str, Any],
    state: tuple[str, int, bool],
    last: dict[str, dg.DagsterRun | None],
    died: set[str],
) -> tuple[dg.RunRequest | None, str]:
    """The run request that keeps one run of the phase going, or why there is none.
    ``state``: the phase, the generation's number and whether its markers are reached."""
    phase, number, markers_reached = state
    config = switch.config
    other = "realtime" if phase == "backlog" else "backlog"
    previous, before = last[phase], last[other]
    if before is not None and before.status in ACTIVE and not _standby_of(before, number):
        return None, f"waiting for the {other} run {before.run_id} to stop"
    if phase == "backlog" and markers_reached:
        return None, "every bucket reached its marker; the watermark lag holds the backlog"
    if previous is not None and previous.status in ACTIVE:
        return None, f"{phase} run {previous.run_id} is active"
    if phase == "realtime" and _cancelled_by_user(context, previous):
        assert previous is not None
        return None, (
            f"the {phase} run {previous.run_id} was cancelled by a user; turn the "
            f"sensor off and on to let it restart the {phase} phase"
        )
    early_field = f"{phase}_early_failures"
    ended_early = None
    if (
        previous is not None
        and previous.status == dg.DagsterRunStatus.FAILURE
        and phase not in died
    ):
        ended_early = _failed_early(context, previous)
    early_failures = cursor.get(early_field, 0) + 1 if ended_early is not None else 0
    if ended_early is not None:
        assert previous is not None
        wait = retry_wait(early_failures)
        if time.time() - ended_early < wait:
            return None, (
                f"the {phase} run {previous.run_id} failed soon after it started; retrying "
                f"{wait:g} s after it ended"
            )
    cursor[early_field] = early_failures
    attempt_field = f"{phase}_attempt"
    attempt = cursor.get(attempt_field, 1) if number else 1
    if previous is not None:
        attempt += 1
        cursor[attempt_field] = attempt
    return (
        dg.RunRequest(
            run_key=f"{config.name}-{phase}-g{number}-a{attempt}",
            job_name=switch.job_of[phase],
            run_config=switch.run_config_of[phase],
            tags={PHASE_TAG: phase, "backlog_dagster/generation": str(number)},
        ),
        "",
    )


def _standby_due(config: PipelineConfig, sink: Sink, generation: Generation, now: float) -> bool:
    """Whether a standby should be going: at once without ``switch.standby_lead``; with
    it, once the backlog run is reading (it published progress: its Spark is up), unless
    its ETA to the switch is known and beyond the lead.

    The lead is for backlogs long enough that a second Spark driver held all along
    costs more than it saves. It is not the default: on the example (three pipelines,
    two cores) a standby's Spark start took 50 to 60 s beside three backlogs, longer
    than the lead, and the switches waited for it (`bench/e2e.py`). A backlog read in one
    chunk knows its rate only when Spark's first read tasks end, late in the chunk;
    until then the standby starts rather than waits."""
    lead = config.switch.standby_lead
    if lead is None:
        return True
    run = published_run(sink, config, now)
    if run is None or run.generation != generation.number:
        return False
    eta = backlog_progress(generation, run, config).eta_s
    return eta is None or eta <= lead


def _standby_request(
    context: dg.SensorEvaluationContext,
    config: PipelineConfig,
    phase: str,
    number: int,
    last: dict[str, dg.DagsterRun | None],
    backlog_request: dg.RunRequest | None,
    due: bool,
) -> dg.RunRequest | None:
    """A realtime run started while the backlog runs, so Spark is warm at the switch
    (once ``_standby_due``)."""
    realtime, backlog = last["realtime"], last["backlog"]
    backlog_going = backlog_request is not None or (
        backlog is not None and backlog.status in ACTIVE
    )
    if (
        not config.switch.standby
        or not due
        or phase != "backlog"
        or not number
        or not backlog_going
        or (realtime is not None and realtime.status in ACTIVE)
        or _cancelled_by_user(context, realtime)
    ):
        return None
    return dg.RunRequest(
        run_key=f"{config.name}-realtime-g{number}-standby",
        job_name=job_names(config)["realtime"],
        run_config=realtime_run_config(config, standby_for=number),
        tags={
            PHASE_TAG: "realtime",
            "backlog_dagster/generation": str(number),
            STANDBY_TAG: "true",
        },
    )


#: A standby is ended when this many backlog runs of its generation failed by their own
#: code: it would otherwise hold a Spark driver for a backlog that cannot finish.
STANDBY_GIVES_UP_AFTER = 2
#: The tag on a run the sensor ended (not a user's cancel: the phase is not paused).
ENDED_BY_SENSOR = "backlog_dagster/ended_by_sensor"


def _end_standby_of_failing_backlog(
    context: dg.SensorEvaluationContext,
    config: PipelineConfig,
    number: int,
    last: dict[str, dg.DagsterRun | None],
) -> None:
    """Cancel a waiting standby whose generation's backlog keeps failing."""
    standby = last["realtime"]
    if standby is None or standby.status not in ACTIVE or not _standby_of(standby, number):
        return
    runs = context.instance.get_runs(
        filters=dg.RunsFilter(
            job_name=job_names(config)["backlog"],
            tags={"backlog_dagster/generation": str(number)},
        ),
        limit=STANDBY_GIVES_UP_AFTER,
    )
    failed = [
        r
        for r in runs
        if r.status == dg.DagsterRunStatus.FAILURE
        and r.tags.get("dagster/failure_reason") in OWN_FAILURES
    ]
    if len(failed) < STANDBY_GIVES_UP_AFTER:
        return
    context.log.warning(
        f"{config.name}: ending the standby realtime run {standby.run_id}: the last "
        f"{len(failed)} backlog runs of generation {number} failed (one standby per "
        "generation: the switch is then made by this sensor)"
    )
    context.instance.add_run_tags(standby.run_id, {ENDED_BY_SENSOR: "backlog failing"})
    context.instance.run_coordinator.cancel_run(standby.run_id)


def _standby_of(run: dg.DagsterRun, number: int) -> bool:
    """A standby realtime run for generation ``number`` (it waits; nobody waits for it),
    or for an earlier one, which it follows when the backlog run goes on to new markers
    (``phases.standby.await_switch``)."""
    started_for = run.tags.get("backlog_dagster/generation", "")
    return (
        run.tags.get(STANDBY_TAG) == "true" and started_for.isdigit() and int(started_for) <= number
    )


#: The statuses of a run that has, or is about to have, a process of its own.
_LIVE = (
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)


def _silent(
    context: dg.SensorEvaluationContext,
    state: Sink,
    run: dg.DagsterRun,
    config: PipelineConfig,
) -> bool:
    """A run that has not beaten its heartbeat within the timeout: started, being
    cancelled (its process gone, the cancel reaches nothing), or launched that long ago
    and not started (normally a matter of seconds)."""
    if run.status not in _LIVE:
        return False
    stats = context.instance.get_run_stats(run.run_id)
    seen = max(state.last_beat(run.run_id) or 0, stats.start_time or 0, stats.launch_time or 0)
    return time.time() - seen > config.switch.heartbeat_timeout


def _end_silent_run(
    context: dg.SensorEvaluationContext, run: dg.DagsterRun, phase: str, config: PipelineConfig
) -> None:
    """Mark a silent run ended: cancelled if it was being cancelled (so a user's cancel
    still pauses the phase), failed otherwise."""
    timeout = f"{config.switch.heartbeat_timeout:g} s"
    if run.status == dg.DagsterRunStatus.CANCELING:
        context.instance.report_run_canceled(
            run, f"no heartbeat for {timeout} while cancelling: the run's process is gone"
        )
        return
    silence = "no heartbeat" if run.status == dg.DagsterRunStatus.STARTED else "not started"
    context.instance.report_run_failed(
        run,
        f"{silence} for {timeout}: the run's process is gone; the switch sensor restarts "
        f"the {phase} phase",
    )


def retry_wait(early_failures: int) -> float:
    """How long after the last of ``early_failures`` early failures in a row the next run
    starts: 5, 10, 20, then 30 s."""
    return min(RETRY_AFTER_S, FIRST_RETRY_AFTER_S * 2 ** (early_failures - 1))


def _failed_early(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> float | None:
    """When the run ended, if its own code failed within ``RETRY_AFTER_S`` of its start."""
    if run.tags.get("dagster/failure_reason") not in OWN_FAILURES:
        return None
    stats = context.instance.get_run_stats(run.run_id)
    ended = stats.end_time
    if ended is None:
        return None
    started = stats.start_time or stats.launch_time or ended
    return ended if ended - started < RETRY_AFTER_S else None


def _cancelled_by_user(context: dg.SensorEvaluationContext, run: dg.DagsterRun | None) -> bool:
    """The run was cancelled and the sensor has not been turned off and on since."""
    return (
        run is not None
        and run.status == dg.DagsterRunStatus.CANCELED
        and ENDED_BY_SENSOR not in run.tags
        and not _restarted_since(context, run)
    )


def _restarted_since(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> bool:
    """Was the sensor (re)started after ``run`` ended? That is how a user re-enables it."""
    started = context.last_sensor_start_time
    stats = context.instance.get_run_stats(run.run_id)
    ended = stats.end_time or stats.launch_time or 0
    return started is not None and started > ended
