"""The standby realtime run: started while the backlog runs, warm when it ends.

Starting a realtime run only after the switch costs a run launch and a Spark start
(tens of seconds here) between the last backlog commit and the first realtime one. A
standby run pays both while the backlog is still running (the sensor starts it with the
backlog run, or later with ``switch.standby_lead``): it starts Spark, runs a tiny read
through the source so Python workers are up, then watches the sink. As soon as the
backlog run has let go of the pipeline's lock, it applies the same policy the switch
sensor does (``phases.policy``), records the switch itself if the policy says so, and
goes on as the realtime run. The sensor would make the same decision a tick later; the
phase change is recorded once, whoever makes it.

That decision (``switched_if_due``) is also how a backlog run that goes on as the
realtime run (``switch.continue_as_realtime``, the default, where no standby runs)
switches once its backlog has ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from backlog_dagster.implementations import open_source
from backlog_dagster.phases.lag import watermark_lag
from backlog_dagster.phases.markers import definition_of
from backlog_dagster.phases.policy import decide
from backlog_dagster.phases.reference import read_reference
from backlog_dagster.phases.transform import check_against_source, partial_results, read_schema
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Sink

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def warm_up(spark: SparkSession, config: PipelineConfig, sink: Sink) -> None:
    """Check the pipeline's plan, then one tiny read: it starts Spark's Python workers.

    The plan is analysed as the runs make it, so a mistake only Spark sees (an
    expression it cannot resolve, reference data it cannot join) fails the standby at
    once, naming the field, instead of leaving it waiting, and holding a Spark driver,
    for a backlog that cannot run.
    """
    with open_source(config) as topic:
        check_against_source(config, topic)
        schema = read_schema(config, topic)
        records = topic.read_batch(spark, schema)
    reference = None if config.transform.join is None else read_reference(config, sink)
    _ = partial_results(records, config, reference=reference).schema  # Spark analyses it
    records.limit(1).collect()


def await_switch(
    config: PipelineConfig,
    sink: Sink,
    generation_number: int,
    should_stop: Callable[[], bool],
    log: Callable[[str], None],
    poll_s: float = 0.2,
) -> bool:
    """Wait until the pipeline is (or may now be switched) realtime.

    A newer generation of the same definition is followed: the backlog run took new
    markers at the log's end (records arrived meanwhile, or the watermark lag held),
    and this standby's Spark and code serve it as well; ending here would leave the
    switch to a realtime run started cold. False when stopped first, or when a
    generation of another definition replaced ``generation_number`` (the switch sensor
    then starts another standby for it).
    """
    log(f"standby: Spark is up; waiting for generation {generation_number}'s backlog to end")
    definition = definition_of(config)
    while not should_stop():
        current = sink.current_generation()
        if current is None or current.definition != definition:
            log(f"standby: generation {generation_number} was replaced; ending")
            return False
        if current.number != generation_number:
            log(
                f"standby: generation {generation_number} went on as generation "
                f"{current.number} ({current.reason}); waiting for its backlog to end"
            )
            generation_number = current.number
        if switched_if_due(config, sink, "standby realtime run", lambda m: log(f"standby: {m}")):
            return True
        time.sleep(poll_s)
    return False


def switched_if_due(
    config: PipelineConfig, sink: Sink, by: str, log: Callable[[str], None]
) -> bool:
    """Whether the pipeline is realtime, once the backlog run has let go of it: when
    the policy says so now, the switch is recorded here (as the sensor would a tick
    later; the phase change is recorded once, whoever makes it), naming ``by`` (the
    run, as its run lock's holder)."""
    if sink.phase() == "realtime":
        return True
    with sink.run_lock(by, wait_s=0) as held:
        generation = sink.current_generation() if held else None
        if generation is None:
            return False
        now = time.time()
        lag = None
        if config.backlog.watermark_lag_threshold is not None:
            with open_source(config) as topic:
                lag = watermark_lag(generation, topic, config, now)
        decision = decide(
            config,
            phase=sink.phase(),
            markers_reached=generation.finished,
            lag=lag,
            history=sink.phase_history(),
            lag_above_since=None,
            now=now,
        )
        if decision.phase != "realtime" or decision.cause is None:
            return sink.phase() == "realtime"
        cause = f"{decision.cause} (switched by the {by})"
        lag_s = None if lag is None else lag.seconds
        sink.record_phase(generation.number, "realtime", cause, lag_s)
        log(f"switched to realtime: {cause}")
        return True
