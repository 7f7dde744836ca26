"""The switch sensor's choice of runs, tick by tick, on a real Dagster instance.

The runs here are records in the instance's run storage with the statuses and tags
Dagster gives real ones; nothing runs. What they did is covered end to end under
`dagster dev` (``tests/test_switch.py``, ``tests/test_crash.py``).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from backlog_dagster.components import switch
from backlog_dagster.components.assets import pipeline_definitions
from backlog_dagster.components.observations import finished_buckets, realtime_reporter
from backlog_dagster.implementations import open_source
from backlog_dagster.phases.markers import current_generation
from backlog_dagster.phases.progress import RunProgress
from backlog_dagster.phases.realtime import RealtimeStatus
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic
from tests.pipelines import CUSTOMER_TOTALS, pipeline

#: The backlog job, which goes on as the realtime run (``switch.continue_as_realtime``).
JOB = "customer_totals_backlog_then_realtime_job"
#: A standby realtime run beside the backlog run, rather than the backlog run going on;
#: the backlog job then runs the backlog alone.
WITH_STANDBY = {"standby": True, "continue_as_realtime": False}
STANDBY_JOB = "customer_totals_backlog_job"


def add_run(
    instance: dg.DagsterInstance, status: dg.DagsterRunStatus, job: str = JOB, **tags: str
) -> dg.DagsterRun:
    run = dg.DagsterRun(job_name=job, run_id=str(uuid.uuid4()), status=status, tags=tags)
    instance.add_run(run)
    return run


def test_a_run_refused_by_hand_hides_no_active_run_and_only_own_failures_wait(
    make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    cursor: list[str | None] = [None]

    def tick(instance: dg.DagsterInstance) -> Any:
        context = dg.build_sensor_context(instance=instance, cursor=cursor[0], definitions=defs)
        result = sensor(context)
        cursor[0] = result.cursor
        return result

    with dg.instance_for_test() as instance:
        first = tick(instance)
        assert [r.job_name for r in first.run_requests] == [JOB]
        # From its first tick both assets' checks say the state: catching up, not live yet.
        checks = {
            e.check_name: e for e in first.asset_events if isinstance(e, dg.AssetCheckEvaluation)
        }
        catching_up = "catching up 0 % (0 of 1,000 records)"
        assert checks["catches_up"].passed and checks["catches_up"].description == catching_up
        assert not checks["keeps_up"].passed
        assert checks["keeps_up"].description == f"not streaming yet: {catching_up}"
        assert checks["keeps_up"].asset_key == dg.AssetKey("customer_totals_realtime")

        # The sensor's run reads and beats; a newer run a user launched by hand was
        # refused (its own code failed). The active older run is the one that counts.
        reading = add_run(instance, dg.DagsterRunStatus.STARTED)
        with open_sink(config) as sink:
            sink.beat(reading.run_id)
        add_run(instance, dg.DagsterRunStatus.FAILURE, **{"dagster/failure_reason": "STEP_FAILURE"})
        second = tick(instance)
        assert second.run_requests == []
        # Every tick's reason begins with where the pipeline is.
        where = "catching up 0 % (0 of 1,000 records)"
        assert second.skip_reason.skip_message == f"{where}; backlog run {reading.run_id} is active"
        assert json.loads(second.cursor)["where"] == where
        assert second.cursor.startswith('{"where": ')

        # The run publishes what it read in its chunk under way: the next tick shows it,
        # as its reason and as an observation of the backlog asset.
        now = time.time()
        published = RunProgress(reading.run_id, 1, now - 4, now, 400, {0: 150, 1: 250})
        with open_sink(config) as sink:
            sink.publish_progress(reading.run_id, published.to_json())
        progressing = tick(instance)
        where = "catching up 40 % (400 of 1,000 records), ETA 6.0 s"
        assert progressing.skip_reason.skip_message.startswith(f"{where}; ")
        [observed] = [e for e in progressing.asset_events if "percent_done" in e.metadata]
        assert observed.asset_key == dg.AssetKey("customer_totals_backlog")
        assert observed.description == where
        assert observed.metadata["percent_done"].value == 40.0
        assert (
            observed.metadata["read_rate"].value
            == "100 records/s read, since the run began to read"
        )
        # The cursor holds no raw Unix time: the sensor's page shows it.
        assert not re.search(r"\d{9,}", progressing.cursor), progressing.cursor
        assert observed.metadata["phase"].value == "backlog"
        buckets = observed.metadata["buckets"].value.records
        assert [(r.data["done"], r.data["total"]) for r in buckets] == [(150, 424), (250, 576)]
        # Observations come every switch.report_every, not every tick.
        assert not [e for e in tick(instance).asset_events if "percent_done" in e.metadata]

        # Its process dies a moment after it started (Dagster's code server reports it
        # failed, with no reason of the run's own): restarted at once.
        instance.report_run_failed(reading)
        third = tick(instance)
        assert [r.job_name for r in third.run_requests] == [JOB]

        # A run whose own code failed as soon as it started waits before the next try,
        # longer with each such failure in a row, so a persistent error does not launch a
        # run every tick while a passing one costs seconds.
        for wait in (5, 10, 20, 30, 30):
            failing = add_run(
                instance, dg.DagsterRunStatus.STARTED, **{"dagster/failure_reason": "STEP_FAILURE"}
            )
            instance.report_run_failed(failing)
            waiting = tick(instance)
            assert waiting.run_requests == []
            assert waiting.skip_reason.skip_message.endswith(
                f"; the backlog run {failing.run_id} failed soon after it started; retrying "
                f"{wait} s after it ended"
            )
            # The sensor's clock set from the failure's end (a tick on a busy machine takes
            # a second or more, so a clock running from now could pass the wait).
            ended = instance.get_run_stats(failing.run_id).end_time
            assert ended is not None
            monkeypatch.setattr(switch, "time", At(ended + wait - 1))
            assert tick(instance).run_requests == []
            monkeypatch.setattr(switch, "time", At(ended + wait + 1))
            assert [r.job_name for r in tick(instance).run_requests] == [JOB]
            monkeypatch.setattr(switch, "time", time)
        # A run that worked longer before it failed starts the count again.
        worked = add_run(
            instance, dg.DagsterRunStatus.STARTED, **{"dagster/failure_reason": "STEP_FAILURE"}
        )
        instance.report_run_failed(worked)
        monkeypatch.setattr(switch, "_failed_early", lambda context, run: None)
        assert [r.job_name for r in tick(instance).run_requests] == [JOB]
        monkeypatch.undo()
        failing = add_run(
            instance, dg.DagsterRunStatus.STARTED, **{"dagster/failure_reason": "STEP_FAILURE"}
        )
        instance.report_run_failed(failing)
        assert tick(instance).skip_reason.skip_message.endswith("retrying 5 s after it ended")


class At:
    """The ``time`` module as the switch sensor sees it, its clock stopped at ``moment``."""

    def __init__(self, moment: float) -> None:
        self.moment = moment

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def time(self) -> float:
        return self.moment


def test_a_definition_that_does_not_fit_its_source_takes_no_markers(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, {**CUSTOMER_TOTALS, "keys": ["customer"]})
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    with dg.instance_for_test() as instance:
        result = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
    assert result.run_requests == []
    assert result.skip_reason.skip_message.startswith(
        "no markers taken: attributes.transform.keys.0: 'customer' is not a column of the source"
    )
    with open_sink(config) as sink:
        assert sink.current_generation() is None


def test_a_standby_whose_backlog_keeps_failing_is_ended_and_not_paused(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, switch=WITH_STANDBY)
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    with dg.instance_for_test() as instance:
        first = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        assert sorted(r.job_name for r in first.run_requests) == [
            STANDBY_JOB,
            "customer_totals_realtime_job",
        ]
        standby = dg.DagsterRun(
            job_name="customer_totals_realtime_job",
            run_id=str(uuid.uuid4()),
            status=dg.DagsterRunStatus.STARTED,
            tags={"backlog_dagster/standby": "true", "backlog_dagster/generation": "1"},
        )
        instance.add_run(standby)
        with open_sink(config) as sink:
            sink.beat(standby.run_id)  # alive: the sensor would mark a silent run failed
        own = {"dagster/failure_reason": "STEP_FAILURE", "backlog_dagster/generation": "1"}
        add_run(instance, dg.DagsterRunStatus.FAILURE, STANDBY_JOB, **own)
        sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
        still = instance.get_run_by_id(standby.run_id)
        assert still is not None and still.status == dg.DagsterRunStatus.STARTED  # once: waits

        add_run(instance, dg.DagsterRunStatus.FAILURE, STANDBY_JOB, **own)
        sensor(dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs))
        ended = instance.get_run_by_id(standby.run_id)
        assert ended is not None
        # No code server here to deliver the cancel: the run is left CANCELING, tagged as
        # ended by the sensor (so the realtime phase is not paused as by a user's cancel).
        assert ended.status == dg.DagsterRunStatus.CANCELING
        assert ended.tags["backlog_dagster/ended_by_sensor"] == "backlog failing"


def test_the_standby_starts_once_the_backlogs_eta_is_within_its_lead(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, switch={**WITH_STANDBY, "standby_lead": 10})
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    cursor: list[str | None] = [None]

    def requested(instance: dg.DagsterInstance) -> list[str]:
        context = dg.build_sensor_context(instance=instance, cursor=cursor[0], definitions=defs)
        result = sensor(context)
        cursor[0] = result.cursor
        return [r.job_name for r in result.run_requests]

    def publish(run: dg.DagsterRun, seconds_reading: float, read: int = 400) -> None:
        now = time.time()
        read_to = {0: 150, 1: 250} if read else {}  # both buckets start at 0
        progress = RunProgress(run.run_id, 1, now - seconds_reading, now, read, read_to)
        with open_sink(config) as sink:
            sink.publish_progress(run.run_id, progress.to_json())

    standby = ["customer_totals_realtime_job"]
    with dg.instance_for_test() as instance:
        # The backlog run's Spark is starting (nothing published): the backlog run alone.
        assert requested(instance) == [STANDBY_JOB]
        reading = add_run(instance, dg.DagsterRunStatus.STARTED, STANDBY_JOB)
        with open_sink(config) as sink:
            sink.beat(reading.run_id)
        assert requested(instance) == []
        # 600 records left at 10 records/s: an ETA of 60 s, beyond the 10 s lead.
        publish(reading, 40)
        assert requested(instance) == []
        # At 100 records/s: 6 s, within it.
        publish(reading, 4)
        assert requested(instance) == standby
        # Reading, no rate known yet (one chunk, no read task ended): no ETA to wait for.
        publish(reading, 4, read=0)
        assert requested(instance) == standby


#: How long a run may be silent before the sensor calls it gone, in the test below: each
#: tick right after a run was added or beat must come within it, which on a busy
#: machine (a fresh clone's full suite) one second was not.
SILENT_S = 3


def test_a_run_left_starting_or_cancelling_with_no_process_is_ended_and_replaced(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Dagster marks a run starting before it asks the code server to launch it; a daemon
    killed in between leaves it starting with no process, and (without run monitoring,
    which is off by default) nothing else ever ends it."""
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, switch={"heartbeat_timeout": SILENT_S})
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    with dg.instance_for_test() as instance:
        first = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        starting = add_run(instance, dg.DagsterRunStatus.NOT_STARTED)
        instance.report_dagster_event(
            dg.DagsterEvent(
                event_type_value=dg.DagsterEventType.PIPELINE_STARTING.value, job_name=JOB
            ),
            run_id=starting.run_id,
        )

        def tick() -> Any:
            return sensor(
                dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs)
            )

        # Launched a moment ago: still on its way.
        assert tick().skip_reason.skip_message.endswith(f"backlog run {starting.run_id} is active")
        time.sleep(SILENT_S + 0.2)
        replaced = tick()
        assert [r.job_name for r in replaced.run_requests] == [JOB]
        failed = instance.get_run_by_id(starting.run_id)
        assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE

        # A run being cancelled whose process is gone (the cancel reached nothing) is
        # marked cancelled once silent, and replaced like any other ended run.
        canceling = add_run(instance, dg.DagsterRunStatus.CANCELING)
        with open_sink(config) as sink:
            sink.beat(canceling.run_id)
        assert tick().skip_reason.skip_message.endswith(f"backlog run {canceling.run_id} is active")
        time.sleep(SILENT_S + 0.2)
        assert [r.job_name for r in tick().run_requests] == [JOB]
        cancelled = instance.get_run_by_id(canceling.run_id)
        assert cancelled is not None and cancelled.status == dg.DagsterRunStatus.CANCELED


def test_a_backlog_run_that_went_on_as_realtime_is_the_realtime_run(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """With ``switch.continue_as_realtime`` (the default) the backlog job runs the
    realtime step after the backlog's, and no standby is started; once the run said it
    went on (its phase tag), the sensor watches it as the realtime phase's run: it starts
    no other while it runs, restarts realtime when it dies, and leaves realtime paused
    when a user cancelled it."""
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    assert config.switch.continue_as_realtime and not config.switch.standby
    defs = pipeline_definitions(config)
    job = defs.resolve_job_def(JOB)
    assert {k.to_user_string() for k in job.asset_layer.selected_asset_keys} == {
        "customer_totals_backlog",
        "customer_totals_realtime",
    }
    sensor = defs.resolve_sensor_def("customer_totals_switch")

    def went_on(instance: dg.DagsterInstance) -> tuple[dg.DagsterRun, Any]:
        first = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        assert [r.job_name for r in first.run_requests] == [JOB]  # no standby beside it
        run = add_run(instance, dg.DagsterRunStatus.STARTED, **{"backlog_dagster/phase": "backlog"})
        with open_sink(config) as sink:
            sink.beat(run.run_id)
            generation = sink.current_generation()
            assert generation is not None
            sink.record_phase(
                generation.number, "realtime", "every bucket reached its marker", None
            )
        instance.add_run_tags(
            run.run_id,
            {"backlog_dagster/phase": "realtime", "backlog_dagster/started_as": "backlog"},
        )
        return run, first.cursor

    def tick(instance: dg.DagsterInstance, cursor: Any) -> Any:
        return sensor(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))

    def report_due(cursor: str) -> str:
        """The cursor, with the sensor's last report long ago: its next is due."""
        return json.dumps(json.loads(cursor) | {"reported_at": "2000-01-01 00:00:00 UTC"})

    def checks(result: Any) -> list[dg.AssetCheckEvaluation]:
        return [e for e in result.asset_events if isinstance(e, dg.AssetCheckEvaluation)]

    with dg.instance_for_test() as instance:
        run, cursor = went_on(instance)
        serving = tick(instance, cursor)
        assert serving.run_requests == []
        assert serving.skip_reason.skip_message.endswith(f"realtime run {run.run_id} is active")
        # While the realtime run is active it evaluates keeps_up itself, and the sensor
        # does not, even when its own report is due. A backlog run that materialized its
        # asset after the switch was reported finished: catches_up passes again at the
        # next tick, after it (Dagster shows a check evaluated before its asset's latest
        # materialization as not evaluated).
        assert not checks(tick(instance, serving.cursor))
        assert not checks(tick(instance, report_due(serving.cursor)))
        backlog = dg.AssetKey("customer_totals_backlog")
        instance.report_runless_asset_event(dg.AssetMaterialization(asset_key=backlog))
        after = tick(instance, serving.cursor)
        [evaluation] = checks(after)
        assert (evaluation.asset_key, evaluation.check_name) == (backlog, "catches_up")
        assert evaluation.passed and evaluation.description is not None
        assert evaluation.description.startswith("backlog finished; realtime since ")
        serving = tick(instance, after.cursor)
        assert not checks(serving)
        # Its process died after it had served a while: realtime starts again at once,
        # and until the next run reports, the sensor evaluates keeps_up, from its first
        # tick after the death (not one report interval later).
        instance.report_run_failed(run)
        restarted = tick(instance, serving.cursor)
        assert [r.job_name for r in restarted.run_requests] == ["customer_totals_realtime_job"]
        assert [(e.check_name, e.passed) for e in checks(restarted)] == [("keeps_up", True)]

    for sink_file in tmp_path.glob("results.sqlite*"):  # the pipeline starts afresh
        sink_file.unlink()
    with dg.instance_for_test() as instance:
        run, cursor = went_on(instance)
        instance.report_run_canceled(run)
        paused = tick(instance, cursor)
        assert paused.run_requests == []
        assert f"the realtime run {run.run_id} was cancelled by a user" in (
            paused.skip_reason.skip_message
        )


def test_a_realtime_run_evaluates_keeps_up_right_after_each_status_it_materializes(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The check follows the materialization, so Dagster counts it as evaluated against
    the asset's latest; before the switch (a standby's status) there is none."""
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")
    key = dg.AssetKey("customer_totals_realtime")
    with dg.instance_for_test() as instance, open_sink(config) as sink, ExitStack() as stack:
        first = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        events: list[Any] = []
        check = stack.enter_context(switch.realtime_keeps_up(config, sink, instance, key))
        report = realtime_reporter(key, sink, 0.0, events.append, check)
        report(RealtimeStatus(offsets={0: 0, 1: 0}))  # a standby's, in backlog
        generation = sink.current_generation()
        assert generation is not None
        sink.record_phase(generation.number, "realtime", "every bucket reached its marker", None)
        # Not before the sensor's report of the switch is stored: a record of the sensor's
        # after the run's would hide the run's.
        report(RealtimeStatus(offsets={0: 500, 1: 500}))
        assert [type(e) for e in events] == [dg.AssetMaterialization] * 2
        switched = sensor(
            dg.build_sensor_context(instance=instance, cursor=first.cursor, definitions=defs)
        )
        for event in switched.asset_events:  # stored, as the daemon does
            instance.report_runless_asset_event(event)
        report(RealtimeStatus(offsets={0: 500, 1: 500}))
        materialized, evaluation = events[2:]
        assert isinstance(materialized, dg.AssetMaterialization)
        assert isinstance(evaluation, dg.AssetCheckEvaluation)
        assert (evaluation.asset_key, evaluation.check_name) == (key, "keeps_up")
        assert evaluation.passed and evaluation.description is not None
        assert evaluation.description.startswith("streaming, lag ")


def test_with_the_sensor_stopped_a_realtime_run_evaluates_keeps_up_once_no_tick_can_follow(
    make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No tick reports the switch (the sensor is stopped): the run evaluates keeps_up
    once a tick begun before the switch would have ended (Dagster's limit on a tick,
    made 0 here), and keeps its one source open between evaluations."""
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    key = dg.AssetKey("customer_totals_realtime")
    opened: list[Any] = []

    def counted(config: Any) -> Any:
        opened.append(config.name)
        return open_source(config)

    monkeypatch.setattr(switch, "open_source", counted)
    with dg.instance_for_test() as instance, open_sink(config) as sink:
        with open_source(config) as topic:
            generation = current_generation(sink, topic, config, print)
        sink.record_phase(generation.number, "realtime", "every bucket reached its marker", None)
        with switch.realtime_keeps_up(config, sink, instance, key) as check:
            assert check() is None  # a tick begun before the switch may still be storing
            monkeypatch.setattr(switch, "SENSOR_TICK_LIMIT_S", 0.0)
            evaluations = [check(), check(), check()]
        assert all(e is not None and e.passed for e in evaluations), evaluations
        assert opened == ["customer_totals"]


def test_finishes_and_phase_changes_are_reported_once_when_the_daemon_dies_mid_tick(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Dagster stores a tick's observations before its cursor: a daemon killed between
    the two ticks again from the older cursor, and reports no phase change or bucket
    finish a second time."""
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    defs = pipeline_definitions(config)
    sensor = defs.resolve_sensor_def("customer_totals_switch")

    def reported(result: dg.SensorResult, event: str) -> list[Any]:
        return [
            (e.asset_key.to_user_string(), e.description)
            for e in result.asset_events
            if isinstance(e, dg.AssetObservation)
            and e.metadata.get("event") == dg.TextMetadataValue(event)
        ]

    def tick_stored_but_not_its_cursor(cursor: str | None) -> dg.SensorResult:
        context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs)
        result = sensor(context)
        for event in result.asset_events:  # stored, as the daemon does first
            instance.report_runless_asset_event(event)
        return result

    with dg.instance_for_test() as instance:
        first = tick_stored_but_not_its_cursor(None)
        assert reported(first, "RecordAttributes")  # the first start, in backlog
        again = tick_stored_but_not_its_cursor(None)
        assert reported(again, "RecordAttributes") == []

        with open_sink(config) as sink:
            generation = sink.current_generation()
            assert generation is not None
            bucket, state = min(generation.buckets.items())
            sink.skip(generation.number, {bucket: (state.reached, state.marker)})
        finished = tick_stored_but_not_its_cursor(first.cursor)
        assert [d for _, d in reported(finished, "BacklogFinishEvent")] == [
            f"bucket {bucket} reached its marker {state.marker:,} (generation 1; 1 bucket(s) to go)"
        ]
        # What the demo and the tests read back from the stored observation.
        stored = instance.fetch_observations(dg.AssetKey("customer_totals_backlog"), 100).records
        assert [
            f for r in stored if r.asset_observation for f in finished_buckets(r.asset_observation)
        ] == [(1, bucket, state.marker)]
        again = tick_stored_but_not_its_cursor(first.cursor)
        assert reported(again, "BacklogFinishEvent") == []
        assert json.loads(again.cursor)["finished"] == [bucket]
