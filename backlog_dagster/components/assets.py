"""What a ``BacklogPipeline`` builds: its two assets, their steps, the asset check, a job
per phase and the switch sensor (``pipeline_definitions``).

(No ``from __future__ import annotations`` here: Dagster reads the asset function's
annotations at definition time.)

The ``<name>_backlog`` and ``<name>_realtime`` assets are one-asset ``multi_asset``s, so
their specs (key, group, owners, tags, kinds, automation) can be anything the component's
``translation`` or a subclass's ``get_asset_spec`` makes of them, while their op names,
which run configs name, stay the pipeline's. The backlog job also runs the realtime
step, which goes on with the backlog step's Spark, and the query it armed as its backlog
began, once the switch is due (``switch.continue_as_realtime``, the default).
"""

import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import dagster as dg
from pydantic import Field

from backlog_dagster.errors import UserError
from backlog_dagster.phases.session import (
    HandedOver,
    hand_over,
    new_pipeline_session,
    pipeline_spark,
    stop_unless_handed_over,
    take_over,
)
from backlog_dagster.pipeline.config import BacklogConfig, PipelineConfig
from backlog_dagster.sink import BucketState, Sink, open_sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backlog_dagster.phases.backlog import BacklogReport
    from backlog_dagster.phases.realtime import ArmedQuery, RealtimeRun
    from backlog_dagster.spark.session import Reopen


class BacklogRunConfig(dg.Config):
    """Per-run settings of the backlog phase; unset fields use the pipeline's YAML."""

    checkpoint_interval: float | None = None
    shuffle_partitions: str | None = None
    """``auto`` or a number."""
    adaptive_query_execution: bool | None = None
    spark_conf: dict[str, str] = Field(default_factory=dict)
    """Spark settings of this run, over the pipeline's ``backlog.spark_conf``."""


class RealtimeRunConfig(dg.Config):
    """Per-run settings of the realtime phase; unset fields use the pipeline's YAML."""

    checkpoint_interval: float | None = None
    shuffle_partitions: int | None = None
    standby_for_generation: int | None = None
    """Set: a standby run, started while that generation's backlog runs; it takes over at
    that generation's switch (see ``phases.standby``)."""
    spark_conf: dict[str, str] = Field(default_factory=dict)
    """Spark settings of this run, over the pipeline's ``realtime.spark_conf``."""


def refuse_misfit(config: PipelineConfig, context: dg.ComponentLoadContext) -> None:
    """Refuse, while Dagster loads the file, a pipeline that does not fit its source.

    The source's columns are known without Spark (the topic declares them, or
    ``record_schema`` does), so a key, an aggregation column or an event time the source
    lacks, or a sum over text, is reported like a YAML mistake: with the file, line and
    field. A topic that does not exist yet is checked when a run starts.
    """
    from pydantic import ValidationError
    from pydantic_core import InitErrorDetails

    from backlog_dagster.implementations import open_source
    from backlog_dagster.phases.transform import source_problems
    from backlog_dagster.source import SourceError

    try:
        with open_source(config) as topic:
            problems = source_problems(config, topic)
    except SourceError:
        return
    if not problems:
        return
    error = ValidationError.from_exception_data(
        "BacklogPipeline",
        [
            InitErrorDetails(
                type="value_error",
                ctx={"error": p.message},
                loc=tuple(int(part) if part.isdigit() else part for part in p.field.split(".")),
                input=config.source.path,
            )
            for p in problems
        ],
    )
    tree = context.resolution_context.source_position_tree
    attributes = None if tree is None else tree.children.get("attributes")
    if attributes is None:
        raise error
    # Dagster's own helper, as it applies to the attributes' validation: each error then
    # names the file and line of its field.
    from dagster._utils.pydantic_yaml import enrich_validation_errors_with_source_position

    with enrich_validation_errors_with_source_position(attributes, ["attributes"]):
        raise error


#: What materializing each phase's asset runs (``backlog_step``, ``realtime_step``, or a
#: component subclass's ``execute_backlog``/``execute_realtime``).
BacklogStep = Callable[[dg.AssetExecutionContext, BacklogRunConfig], dg.MaterializeResult]
RealtimeStep = Callable[
    [dg.AssetExecutionContext, RealtimeRunConfig], Iterator[dg.MaterializeResult]
]


def phase_specs(config: PipelineConfig) -> dict[str, dg.AssetSpec]:
    """Each phase's asset as the pipeline alone makes it: ``<name>_backlog`` and
    ``<name>_realtime`` (which depends on it) in group ``<name>``, of kinds spark and the
    sink's. The component's ``translation`` starts from these."""
    name, kinds = config.name, {"spark", config.sink.kind}
    backlog = dg.AssetSpec(
        key=f"{name}_backlog",
        group_name=name,
        kinds=kinds,
        description=f"Backlog phase of {name}: every record up to the boundary markers of "
        f"{config.source.describe()}, aggregated in Spark batch, into "
        f"{config.sink.describe()}.",
    )
    realtime = dg.AssetSpec(
        key=f"{name}_realtime",
        group_name=name,
        kinds=kinds,
        deps=[backlog.key],
        description=f"Realtime phase of {name}: a long-running Structured Streaming query "
        "from the markers on, merged into the backlog's results. Runs until cancelled.",
        # A standby whose generation is replaced before the switch has done nothing: it
        # ends without a materialization (nor the checks that would follow one).
        skippable=True,
        freshness_policy=realtime_freshness(config),
    )
    return {"backlog": backlog, "realtime": realtime}


def realtime_freshness(config: PipelineConfig) -> dg.FreshnessPolicy:
    """What realtime keeps fresh, as Dagster's catalog judges it: a streaming realtime
    run materializes its asset every ``switch.report_every``, so one that has not for
    ten of those (at least five minutes) is not streaming, and for four a warning."""
    every = config.switch.report_every
    return dg.FreshnessPolicy.time_window(
        fail_window=timedelta(seconds=max(300.0, 10 * every)),
        warn_window=timedelta(seconds=max(120.0, 4 * every)),
    )


def pipeline_definitions(
    config: PipelineConfig,
    defs_file: Path | None = None,
    specs: Mapping[str, dg.AssetSpec] | None = None,
    steps: tuple[BacklogStep, RealtimeStep] | None = None,
) -> dg.Definitions:
    """The pipeline's assets (``specs``, else ``phase_specs``; materialized by ``steps``,
    else ``backlog_step`` and ``realtime_step``), asset check, one job per phase and its
    switch sensor."""
    from backlog_dagster.components.switch import switch_sensor

    specs = specs or phase_specs(config)
    keys = {phase: spec.key for phase, spec in specs.items()}
    backlog_step_, realtime_step_ = steps or (None, None)
    jobs = phase_jobs(config, keys)
    return dg.Definitions(
        assets=[
            backlog_asset(config, defs_file, specs["backlog"], backlog_step_),
            realtime_asset(config, defs_file, specs["realtime"], realtime_step_),
        ],
        asset_checks=[
            catches_up_check(config, keys["backlog"]),
            keeps_up_check(config, keys["realtime"]),
        ],
        jobs=jobs,
        sensors=[switch_sensor(config, jobs, keys)],
    )


def phase_jobs(
    config: PipelineConfig, keys: Mapping[str, dg.AssetKey]
) -> "list[dg.UnresolvedAssetJobDefinition]":
    """Each phase's job (``switch.job_names``) over its phase's asset."""
    from backlog_dagster.components.switch import job_names

    names = job_names(config)
    # In-process steps: a step process of its own would only add a Python start (and
    # the imports of Dagster and the definitions) to every run, and one more process
    # between Dagster and the Spark driver.
    descriptions = {
        "backlog": f"{config.name}'s backlog phase: Spark batch up to the boundary markers. "
        f"Launched by the {config.name}_switch sensor; a run launched by hand while "
        "another holds the pipeline is refused.",
        "realtime": f"{config.name}'s realtime phase: Structured Streaming from the markers "
        f"on, until cancelled. Launched by the {config.name}_switch sensor"
        + (
            ", first as a standby that waits for the backlog to end."
            if config.switch.standby
            else "."
        ),
    }
    selections = {"backlog": [keys["backlog"]], "realtime": [keys["realtime"]]}
    if config.switch.continue_as_realtime:
        # The realtime step after the backlog step, in the backlog run's process (the
        # executor is in-process), goes on with the backlog's Spark.
        selections["backlog"].append(keys["realtime"])
        descriptions["backlog"] += (
            " Once its backlog has ended and the switch is due, the run goes on as the "
            "realtime run with the same Spark."
        )
        descriptions["realtime"] = (
            f"{config.name}'s realtime phase when no backlog run goes on as the realtime "
            "run (the one that did died, or the switch came after its backlog run ended): "
            f"launched by the {config.name}_switch sensor."
        )
    return [
        dg.define_asset_job(
            names[phase],
            # Checks are evaluated by the sensor and the realtime run, never as steps
            # (``realtime_keeps_up`` says why).
            selection=dg.AssetSelection.assets(*selections[phase]).without_checks(),
            executor_def=dg.in_process_executor,
            description=description,
        )
        for phase, description in descriptions.items()
    ]


def realtime_checkpoint(pipeline: PipelineConfig, run_id: str) -> Path:
    """The folder of the run's realtime query (removed when its realtime step ends)."""
    return Path(pipeline.realtime.checkpoint_location) / pipeline.name / run_id


def with_run_settings(pipeline: PipelineConfig, run: RealtimeRunConfig) -> PipelineConfig:
    """The pipeline with the realtime run's ``spark_conf`` over the YAML's, so that the
    phase leaves those keys alone."""
    spark_conf = {**pipeline.realtime.spark_conf, **run.spark_conf}
    realtime = pipeline.realtime.model_copy(update={"spark_conf": spark_conf})
    return pipeline.model_copy(update={"realtime": realtime})


@contextmanager
def user_errors(defs_file: Path | None) -> Iterator[None]:
    """A user's mistake fails the run with a message naming the file (a ``UserError``)."""
    try:
        yield
    except UserError as error:
        where = f"{defs_file}: " if defs_file is not None else ""
        raise dg.Failure(description=f"{where}{error}", allow_retries=False) from None


@contextmanager
def cancel_said_plainly(log: Callable[[str], None], phase: str) -> Iterator[None]:
    """A run cancelled from the UI stops with one line saying so, not the interrupt's
    stack trace from deep inside Spark. (Dagster still records an interrupted step as a
    step failure; the run itself is CANCELED.)"""
    try:
        yield
    except (KeyboardInterrupt, dg.DagsterExecutionInterruptedError):
        said = (
            f"cancelled: the {phase} run stopped; every commit it made stays in the sink, "
            "and the next run goes on from there"
        )
        log(said)
        raise dg.DagsterExecutionInterruptedError(said) from None


def backlog_asset(
    pipeline: PipelineConfig,
    defs_file: Path | None = None,
    spec: dg.AssetSpec | None = None,
    step: "BacklogStep | None" = None,
) -> dg.AssetsDefinition:
    """The backlog asset: ``spec`` (else the pipeline's own, ``phase_specs``), its op named
    ``<name>_backlog``; materializing it runs ``step`` (else ``backlog_step``)."""
    run: BacklogStep = step or functools.partial(backlog_step, pipeline, defs_file)

    @dg.multi_asset(
        name=f"{pipeline.name}_backlog", specs=[spec or phase_specs(pipeline)["backlog"]]
    )
    def backlog(
        context: dg.AssetExecutionContext, config: BacklogRunConfig
    ) -> dg.MaterializeResult:
        return run(context, config)

    return backlog


def backlog_step(
    pipeline: PipelineConfig,
    defs_file: Path | None,
    context: dg.AssetExecutionContext,
    config: BacklogRunConfig,
) -> dg.MaterializeResult:
    """The backlog phase of one run: up to the markers, in committed chunks; then, when
    the switch is due and the run goes on as realtime, the hand-over to its realtime step."""
    from backlog_dagster.phases.backlog import run_backlog

    run_id = context.run.run_id
    with (
        cancel_said_plainly(context.log.info, "backlog"),
        user_errors(defs_file),
        heartbeat(pipeline, run_id),
        pipeline_spark(pipeline, "backlog", config.spark_conf, run_id) as spark,
        # Last in, first out: an armed query stops before the session it is on.
        ExitStack() as reopened,
        ExitStack() as armed_query,
    ):
        settings = backlog_settings(pipeline.backlog, config)
        goes_on = goes_on_as_realtime(context, pipeline)
        armed = None
        if goes_on:
            armed = _arm_realtime(context, pipeline, spark, settings, armed_query)

        def reopen() -> "SparkSession":
            """A session in place of one whose Spark Connect server started again
            under the backlog (the backlog closed that one, and its armed query went
            with the server): the realtime query is armed again beside the rest."""
            nonlocal spark, armed
            spark = new_pipeline_session(pipeline, "backlog", config.spark_conf)
            # Stopped as the step ends, unless the realtime step goes on with it.
            reopened.callback(stop_unless_handed_over, spark, run_id)
            if goes_on:
                armed = _arm_realtime(context, pipeline, spark, settings, armed_query)
            return spark

        with open_sink(pipeline) as sink:
            report = run_backlog(
                spark,
                pipeline.model_copy(update={"backlog": settings}),
                sink,
                checkpoint_interval=config.checkpoint_interval,
                log=context.log.info,
                run_id=run_id,
                reopen=reopen,
            )
            metadata = _backlog_metadata(pipeline, sink, report)
            if armed is not None:
                _go_on_as_realtime(
                    context, pipeline, sink, spark, report.spark_settings, armed, armed_query
                )
    return dg.MaterializeResult(metadata=metadata)


def _backlog_metadata(
    pipeline: PipelineConfig, sink: Sink, report: "BacklogReport"
) -> dict[str, dg.MetadataValue]:
    """The finished backlog's materialization: where the pipeline is, the run's report,
    and the dead letters the sink holds."""
    from backlog_dagster.components.observations import backlog_finished_metadata

    metadata = backlog_finished_metadata(
        sink, report.generation, report.rows_read, report.seconds
    ) | report_metadata(report)
    metadata["dead_letters_in_table"] = dg.MetadataValue.int(sink.dead_letter_count())
    metadata["dead_letter_table"] = dg.MetadataValue.text(
        f"{pipeline.sink.describe()}_dead_letters"
    )
    return metadata


def goes_on_as_realtime(context: dg.AssetExecutionContext, pipeline: PipelineConfig) -> bool:
    """Whether this run is the pipeline's backlog job with its realtime step after the
    backlog's (``switch.continue_as_realtime``); a backlog asset materialized on its own
    does not go on."""
    from backlog_dagster.components.switch import job_names

    return (
        pipeline.switch.continue_as_realtime and context.job_name == job_names(pipeline)["backlog"]
    )


def settings_beside_backlog(
    pipeline: PipelineConfig, backlog: BacklogConfig, master: str
) -> dict[str, str | None]:
    """The SQL settings a realtime query armed beside ``backlog`` on its session puts on
    its own copy of the session: what the backlog puts there (launched with or set as it
    runs) back to a realtime session's, then ``pipeline``'s realtime ``spark_conf``."""
    from backlog_dagster.phases.backlog import batch_settings
    from backlog_dagster.spark.session import sql_settings_after

    backlog_keys = {**backlog.spark_conf, **batch_settings(pipeline, 1)}
    return sql_settings_after(master, backlog_keys, pipeline.realtime.spark_conf)


def _arm_realtime(
    context: dg.AssetExecutionContext,
    pipeline: PipelineConfig,
    spark: "SparkSession",
    backlog: BacklogConfig,
    stack: ExitStack,
) -> Callable[[], "ArmedQuery | None"]:
    """Arm the run's realtime query while its backlog runs on the same session
    (``phases.realtime.arm_beside``), with the settings its realtime step will have;
    when ``stack`` closes it stops and its checkpoint folder goes. What it returns
    waits for the query."""
    import shutil

    from backlog_dagster.phases.realtime import RealtimeRun, arm_beside
    from backlog_dagster.pipeline.secrets import resolve

    ops = cast(dict[str, Any], context.run.run_config.get("ops") or {})
    run = RealtimeRunConfig(**ops.get(f"{pipeline.name}_realtime", {}).get("config", {}))
    master = resolve(pipeline.spark_master, "spark_master")
    checkpoint = realtime_checkpoint(pipeline, context.run.run_id)
    # Last in, first out: the folder goes once the query has stopped.
    stack.callback(shutil.rmtree, checkpoint, ignore_errors=True)
    realtime = with_run_settings(pipeline, run)
    return arm_beside(
        stack,
        spark,
        realtime,
        RealtimeRun(
            checkpoint_dir=checkpoint,
            log=context.log.info,
            checkpoint_interval=run.checkpoint_interval,
            shuffle_partitions=run.shuffle_partitions,
        ),
        run_id=context.run.run_id,
        session_settings=settings_beside_backlog(realtime, backlog, master),
    )


def _go_on_as_realtime(
    context: dg.AssetExecutionContext,
    pipeline: PipelineConfig,
    sink: Sink,
    spark: "SparkSession",
    settings: Mapping[str, str],
    armed: Callable[[], "ArmedQuery | None"],
    armed_query: ExitStack,
) -> None:
    """Once the backlog has ended: when the switch is due (the same policy the sensor
    applies), record it and leave the armed query (or the session, where arming failed)
    to the run's realtime step, whose run then counts as the realtime run (its tags say
    so). Otherwise the run ends with its backlog (and its armed query stops), and the
    switch sensor goes on from there (new markers, or the switch)."""
    from backlog_dagster.components.switch import PHASE_TAG, STARTED_AS_TAG
    from backlog_dagster.phases.standby import switched_if_due

    def say(message: str) -> None:
        context.log.info(f"backlog: {message}")

    run_id = context.run.run_id
    if not switched_if_due(pipeline, sink, "backlog run", say):
        say("the switch is not due yet; this run ends with its backlog")
        armed_query.close()
        return
    context.instance.add_run_tags(run_id, {PHASE_TAG: "realtime", STARTED_AS_TAG: "backlog"})
    hand_over(run_id, HandedOver(spark, dict(settings), armed(), armed_query.pop_all()))
    say("going on as the realtime run with this Spark")


def backlog_settings(backlog: BacklogConfig, run: BacklogRunConfig) -> BacklogConfig:
    """The pipeline's backlog settings with the run's config over them."""
    update: dict[str, object] = {"spark_conf": {**backlog.spark_conf, **run.spark_conf}}
    if run.shuffle_partitions is not None:
        partitions = run.shuffle_partitions
        update["shuffle_partitions"] = partitions if partitions == "auto" else int(partitions)
    if run.adaptive_query_execution is not None:
        update["adaptive_query_execution"] = run.adaptive_query_execution
    return backlog.model_copy(update=update)


@contextmanager
def heartbeat(pipeline: PipelineConfig, run_id: str) -> Iterator[None]:
    """Beat the run's heartbeat in the sink from a thread while the block runs.

    The backlog's Spark jobs can run for minutes without a commit; the heartbeat is how
    the switch sensor tells a long job from a dead process.
    """
    from backlog_dagster.phases.background import in_background

    def beat(stop: threading.Event) -> None:
        with open_sink(pipeline) as sink:
            while not stop.is_set():
                sink.beat(run_id)
                stop.wait(pipeline.switch.status_every)

    with in_background(f"heartbeat-{run_id}", beat):
        yield


def realtime_asset(
    pipeline: PipelineConfig,
    defs_file: Path | None = None,
    spec: dg.AssetSpec | None = None,
    step: "RealtimeStep | None" = None,
) -> dg.AssetsDefinition:
    """The realtime asset: ``spec`` (else the pipeline's own, ``phase_specs``), its op named
    ``<name>_realtime``; materializing it runs ``step`` (else ``realtime_step``)."""
    run: RealtimeStep = step or functools.partial(realtime_step, pipeline, defs_file)

    @dg.multi_asset(
        name=f"{pipeline.name}_realtime", specs=[spec or phase_specs(pipeline)["realtime"]]
    )
    def realtime(
        context: dg.AssetExecutionContext, config: RealtimeRunConfig
    ) -> Iterator[dg.MaterializeResult]:
        yield from run(context, config)

    return realtime


def realtime_step(
    pipeline: PipelineConfig,
    defs_file: Path | None,
    context: dg.AssetExecutionContext,
    config: RealtimeRunConfig,
) -> Iterator[dg.MaterializeResult]:
    """The realtime phase of one run (a standby first, if it is one), until cancelled."""
    import shutil

    from backlog_dagster.spark.session import stopping_reopened

    run_id = context.run.run_id
    handed = take_over(run_id) if goes_on_as_realtime(context, pipeline) else None
    if goes_on_as_realtime(context, pipeline) and handed is None:
        context.log.info(
            "realtime: this backlog run does not go on as the realtime run (the switch "
            "was not due when its backlog ended); nothing materialized"
        )
        return
    try:
        with (
            cancel_said_plainly(context.log.info, "realtime"),
            user_errors(defs_file),
            heartbeat(pipeline, context.run.run_id),
            open_sink(pipeline) as sink,
            open_sink(pipeline) as status_sink,
            pipeline_spark(pipeline, "realtime", config.spark_conf, run_id, handed) as spark,
            stopping_reopened(
                lambda: new_pipeline_session(pipeline, "realtime", config.spark_conf)
            ) as reopen,
            ExitStack() as standby,
        ):
            if handed is not None:
                standby.enter_context(handed.stop_armed)
            ended = _realtime_until_cancelled(
                context, pipeline, config, spark, (sink, status_sink), handed, reopen, standby
            )
        if ended is not None:
            yield dg.MaterializeResult(metadata=ended)
    finally:
        shutil.rmtree(realtime_checkpoint(pipeline, run_id), ignore_errors=True)


def _realtime_until_cancelled(
    context: dg.AssetExecutionContext,
    pipeline: PipelineConfig,
    config: RealtimeRunConfig,
    spark: "SparkSession",
    sinks: tuple[Sink, Sink],
    handed: HandedOver | None,
    reopen: "Reopen | None",
    standby: ExitStack,
) -> dict[str, Any] | None:
    """The realtime run's query (the one ``handed`` over, a standby's armed one, or a new
    one), reported on as it goes; its end's metadata, or None for a standby that ended
    unused."""
    from backlog_dagster.components.observations import (
        realtime_ended_metadata,
        realtime_reporter,
    )
    from backlog_dagster.components.switch import realtime_keeps_up
    from backlog_dagster.phases.realtime import RealtimeRun, run_realtime

    sink, status_sink = sinks
    realtime = with_run_settings(pipeline, config)
    run = RealtimeRun(
        checkpoint_dir=realtime_checkpoint(pipeline, context.run.run_id),
        log=context.log.info,
        status_every_s=pipeline.switch.status_every,
        checkpoint_interval=config.checkpoint_interval,
        shuffle_partitions=config.shuffle_partitions,
    )
    armed = None if handed is None else handed.armed
    number = config.standby_for_generation
    if number is not None:
        on = (spark, status_sink)
        armed = _standby_until_switch(context, (pipeline, realtime), number, run, on, standby)
        if armed is None:
            return None
    key = context.asset_key
    with realtime_keeps_up(pipeline, status_sink, context.instance, key) as check:
        report = realtime_reporter(
            key, status_sink, pipeline.switch.report_every, context.log_event, check
        )
        status = run_realtime(
            spark,
            realtime,
            sink,
            status_sink,
            replace(run, on_status=report),
            armed=armed,
            source_reached=handed is not None,
            reopen=reopen,
        )
    return realtime_ended_metadata(status, status_sink)


def _standby_until_switch(
    context: dg.AssetExecutionContext,
    pipelines: tuple[PipelineConfig, PipelineConfig],
    number: int,
    run: "RealtimeRun",
    on: tuple["SparkSession", Sink],
    stack: ExitStack,
) -> "ArmedQuery | None":
    """A standby's wait for generation ``number``'s switch: Spark (``on``) warmed up and
    the query armed (stopped when ``stack`` closes); the armed query, or None when the
    generation was replaced first (the run ends unused). ``pipelines``: the pipeline, and
    the same with the run's realtime settings, which its query takes."""
    from backlog_dagster.components.switch import STANDBY_TAG, STARTED_AS_TAG
    from backlog_dagster.phases.realtime import armed_realtime
    from backlog_dagster.phases.standby import await_switch, warm_up

    (pipeline, realtime), (spark, status_sink) = pipelines, on
    warm_up(spark, pipeline, status_sink)
    armed = stack.enter_context(armed_realtime(spark, realtime, run, run_id=context.run.run_id))
    if not await_switch(
        pipeline, status_sink, number, should_stop=lambda: False, log=context.log.info
    ):
        context.log.info(
            f"standby: generation {number} was replaced before the switch; ending unused, "
            "nothing materialized"
        )
        return None
    # From here on it is the realtime run, and its tags say so.
    context.instance.add_run_tags(
        context.run.run_id, {STANDBY_TAG: "false", STARTED_AS_TAG: "standby"}
    )
    return armed


def keeps_up_check(
    pipeline: PipelineConfig, realtime: dg.AssetKey | None = None
) -> dg.AssetChecksDefinition:
    """The ``keeps_up`` check of the realtime asset (``realtime``, else its own key)."""

    @dg.asset_check(
        asset=realtime or phase_specs(pipeline)["realtime"].key,
        name="keeps_up",
        description="Whether the pipeline streams and keeps up, its state in one line "
        "first. Warns while it is not streaming yet (catching up) and when realtime does "
        "not keep up with the input: its offset lag grew over switch.keeps_up_window, its "
        "watermark lag is over the threshold, or the pipeline keeps going back into "
        "backlog. While the pipeline streams the realtime run evaluates it with each "
        "status it writes and when its verdict changes; the switch sensor during the "
        "backlog every switch.report_every and at each phase change, and while no realtime "
        "run is active; run by hand, it reads the phase history and the watermark lag now.",
    )
    def keeps_up() -> dg.AssetCheckResult:
        from backlog_dagster.components.switch import keeps_up_verdict
        from backlog_dagster.implementations import open_source
        from backlog_dagster.phases.lag import watermark_lag
        from backlog_dagster.phases.policy import over_threshold

        now = time.time()
        with open_sink(pipeline) as sink, open_source(pipeline) as topic:
            generation = sink.current_generation()
            lag = None
            if generation is not None and sink.phase() == "realtime":
                lag = watermark_lag(generation, topic, pipeline, now)
            over = over_threshold(lag, pipeline)
            passed, description, count = keeps_up_verdict(
                sink.phase_history(), now, watermark_over=over
            )
        return dg.AssetCheckResult(
            passed=passed,
            severity=dg.AssetCheckSeverity.WARN,
            description=description,
            metadata={"way_backs_last_hour": count},
        )

    return keeps_up


def catches_up_check(
    pipeline: PipelineConfig, backlog: dg.AssetKey | None = None
) -> dg.AssetChecksDefinition:
    """The ``catches_up`` check of the backlog asset (``backlog``, else its own key)."""

    @dg.asset_check(
        asset=backlog or phase_specs(pipeline)["backlog"].key,
        name="catches_up",
        description="The backlog's state in one line (catching up, its round, percent "
        "and ETA; finished once the pipeline streams). Warns while the backlog reads "
        "slower than records arrive. The switch sensor evaluates it every "
        "switch.report_every during the backlog and at each phase change; run by hand, it "
        "reads the sink's progress now.",
    )
    def catches_up() -> dg.AssetCheckResult:
        from backlog_dagster.components.switch import catches_up_description, gaining
        from backlog_dagster.phases.progress import backlog_progress, published_run

        with open_sink(pipeline) as sink:
            generation, history = sink.current_generation(), sink.phase_history()
            if generation is None:
                return dg.AssetCheckResult(passed=True, description="not started: no markers yet")
            run = published_run(sink, pipeline, time.time())
            progress = backlog_progress(generation, run, pipeline, history)
        passed, state = gaining(progress), progress.describe()
        if history and history[-1].phase == "realtime":
            passed, state = True, "backlog finished; streaming"
        return dg.AssetCheckResult(
            passed=passed,
            severity=dg.AssetCheckSeverity.WARN,
            description=catches_up_description(passed, state),
        )

    return catches_up


def report_metadata(report: "BacklogReport") -> dict[str, dg.MetadataValue]:
    """What the backlog run did, beside what it read (``backlog_finished_metadata``)."""
    return {
        "rows_written": dg.MetadataValue.int(report.rows_written),
        "bad_records": dg.MetadataValue.int(report.bad_records),
        "skipped_records": dg.MetadataValue.int(report.skipped_records),
        "chunks": dg.MetadataValue.int(report.chunks),
        "spark_server_restarts": dg.MetadataValue.int(report.server_restarts),
        "buckets": bucket_table(report.buckets.values(), report.read_from),
        "spark_settings": dg.MetadataValue.json(report.spark_settings),
    }


def bucket_table(buckets: object, read_from: Mapping[int, str]) -> dg.TableMetadataValue:
    """Per bucket: its range and which parts of the source it was read from."""
    states: list[BucketState] = list(buckets)  # type: ignore[call-overload]
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "bucket": b.bucket,
                    "start": b.start,
                    "marker": b.marker,
                    "reached": b.reached,
                    "read_from": read_from.get(b.bucket, ""),
                }
            )
            for b in states
        ],
        schema=dg.TableSchema(
            columns=[
                *(dg.TableColumn(c, "int") for c in ("bucket", "start", "marker", "reached")),
                dg.TableColumn("read_from", "string"),
            ]
        ),
    )
