"""The switch: a sensor per pipeline that watches each bucket's progress against its marker.

Each tick (no Spark; well under Dagster's 60 s tick limit) reads the sink:

- no markers yet → request the backlog run (which takes them);
- a bucket that reached its marker for the first time → one asset observation naming
  bucket, marker and offset reached (the Fluss seed's BacklogFinishEvent); the set of
  reported buckets lives in the cursor, so restarts of the sensor or daemon do not
  report a bucket twice;
- backlog phase, every bucket through (progress only moves with committed results, so
  an empty read or a restarted run never counts) → record the phase change in the sink
  (FLIP-309's isProcessingBacklog=false), report it (FLIP-327's RecordAttributes), and
  request the realtime run with the realtime configuration;
- realtime phase, no realtime run active → restart it from the sink's offsets, unless
  the user cancelled the last one and has not turned the sensor off and on since.

A backlog or realtime run that stopped beating its heartbeat in the sink (its process
died, which Dagster's default run launcher cannot see) is marked failed and restarted at
once, from the sink's progress.

Run keys make every request idempotent: two ticks never start two runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import dagster as dg

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink.sqlite import PipelineState

#: A failed run is restarted no sooner than this, so a persistent failure (a missing
#: topic, say) does not launch a run every tick.
RETRY_AFTER_S = 30

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
]


def backlog_run_config(config: PipelineConfig) -> dict[str, Any]:
    """What the backlog run gets: the backlog checkpoint interval, batch shuffle settings."""
    backlog = config.backlog
    return {
        "ops": {
            f"{config.name}_backlog": {
                "config": {
                    "checkpoint_interval": backlog.checkpoint_interval,
                    "shuffle_partitions": str(backlog.shuffle_partitions),
                    "adaptive_query_execution": True,
                }
            }
        }
    }


def realtime_run_config(config: PipelineConfig) -> dict[str, Any]:
    """What the realtime run gets: the realtime interval, a small fixed shuffle."""
    realtime = config.realtime
    return {
        "ops": {
            f"{config.name}_realtime": {
                "config": {
                    "checkpoint_interval": realtime.checkpoint_interval,
                    "shuffle_partitions": realtime.shuffle_partitions,
                }
            }
        }
    }


def switch_sensor(
    config: PipelineConfig, jobs: list[dg.UnresolvedAssetJobDefinition]
) -> dg.SensorDefinition:
    name = config.name
    backlog_job, realtime_job = f"{name}_backlog_job", f"{name}_realtime_job"
    backlog_key, realtime_key = dg.AssetKey(f"{name}_backlog"), dg.AssetKey(f"{name}_realtime")

    @dg.sensor(
        name=f"{name}_switch",
        minimum_interval_seconds=max(1, round(config.switch.interval)),
        default_status=dg.DefaultSensorStatus.RUNNING
        if config.switch.running_by_default
        else dg.DefaultSensorStatus.STOPPED,
        jobs=jobs,
        description=f"Watches {name}'s buckets against their markers and switches its phase.",
    )
    def switch(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        from backlog_dagster.components.pipeline import open_sink

        cursor = json.loads(context.cursor or "{}")
        events: list[dg.AssetObservation] = []
        requests: list[dg.RunRequest] = []
        skip: str | None = None
        with open_sink(config) as sink:
            generation = sink.current_generation()
            phase = sink.phase()
            if generation is not None and cursor.get("generation") != generation.number:
                cursor = {
                    "generation": generation.number,
                    "finished": [],
                    "backlog_attempt": 1,
                    "realtime_attempt": 1,
                }
            if generation is not None:
                for bucket in generation.buckets.values():
                    if bucket.finished and bucket.bucket not in cursor["finished"]:
                        cursor["finished"].append(bucket.bucket)
                        events.append(
                            dg.AssetObservation(
                                asset_key=backlog_key,
                                metadata={
                                    "event": "BacklogFinishEvent",
                                    "bucket": bucket.bucket,
                                    "marker": bucket.marker,
                                    "reached": bucket.reached,
                                    "generation": generation.number,
                                },
                            )
                        )
            number = 0 if generation is None else generation.number
            if phase == "backlog" and generation is not None and generation.finished:
                sink.record_phase(number, "realtime", "every bucket reached its marker")
                phase = "realtime"
            if phase == "realtime" and generation is not None and not cursor.get("switched"):
                # Reported from the cursor, not from the flip above: a tick that died after
                # recording the phase still gets its event reported by the next one.
                cursor["switched"] = True
                events.append(
                    dg.AssetObservation(
                        asset_key=realtime_key,
                        metadata={
                            "event": "RecordAttributes",
                            "is_backlog": False,
                            "generation": number,
                            "cause": "every bucket reached its marker",
                        },
                    )
                )
            if phase == "backlog":
                job, attempt_field, run_config = (
                    backlog_job,
                    "backlog_attempt",
                    backlog_run_config(config),
                )
            else:
                job, attempt_field, run_config = (
                    realtime_job,
                    "realtime_attempt",
                    realtime_run_config(config),
                )
            runs = context.instance.get_runs(filters=dg.RunsFilter(job_name=job), limit=1)
            last = runs[0] if runs else None
            attempt = cursor.get(attempt_field, 1) if generation is not None else 1
            died = last is not None and _silent(context, sink, last, config)
            if died:
                assert last is not None
                context.instance.report_run_failed(
                    last,
                    f"no heartbeat for {config.switch.heartbeat_timeout:g} s: the run's "
                    f"process is gone; the switch sensor restarts the {phase} phase",
                )
                last = context.instance.get_run_by_id(last.run_id)
            if last is not None and last.status in ACTIVE:
                skip = f"{phase} run {last.run_id} is active"
            elif (
                last is not None
                and last.status == dg.DagsterRunStatus.CANCELED
                and not _restarted_since(context, last)
            ):
                skip = (
                    f"the {phase} run {last.run_id} was cancelled by a user; turn the "
                    f"sensor off and on to let it restart the {phase} phase"
                )
            elif (
                last is not None
                and last.status == dg.DagsterRunStatus.FAILURE
                and _ended_ago(context, last) < RETRY_AFTER_S
                and not died
            ):
                skip = f"the {phase} run {last.run_id} failed; retrying {RETRY_AFTER_S} s after"
            else:
                if last is not None:
                    attempt += 1
                    cursor[attempt_field] = attempt
                requests.append(
                    dg.RunRequest(
                        run_key=f"{name}-{phase}-g{number}-a{attempt}",
                        job_name=job,
                        run_config=run_config,
                        tags={
                            "backlog_dagster/phase": phase,
                            "backlog_dagster/generation": str(number),
                        },
                    )
                )
        return dg.SensorResult(
            run_requests=requests,
            asset_events=events,
            cursor=json.dumps(cursor),
            skip_reason=skip if not requests and not events else None,
        )

    return switch


def _silent(
    context: dg.SensorEvaluationContext,
    state: PipelineState,
    run: dg.DagsterRun,
    config: PipelineConfig,
) -> bool:
    """A started run that has not beaten its heartbeat within the timeout."""
    if run.status != dg.DagsterRunStatus.STARTED:
        return False
    stats = context.instance.get_run_stats(run.run_id)
    seen = max(state.last_beat(run.run_id) or 0, stats.start_time or 0, stats.launch_time or 0)
    return time.time() - seen > config.switch.heartbeat_timeout


def _ended_ago(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> float:
    stats = context.instance.get_run_stats(run.run_id)
    return time.time() - (stats.end_time or stats.launch_time or 0)


def _restarted_since(context: dg.SensorEvaluationContext, run: dg.DagsterRun) -> bool:
    """Was the sensor (re)started after ``run`` ended? That is how a user re-enables it."""
    started = context.last_sensor_start_time
    stats = context.instance.get_run_stats(run.run_id)
    ended = stats.end_time or stats.launch_time or 0
    return started is not None and started > ended
