"""A run's Spark session for one pipeline phase, in Dagster's runs and the CLI's alike.

A backlog run that goes on as its realtime run hands its session over from its backlog
step to its realtime step (``hand_over``, ``take_over``): both steps run in the run's
process, one after the other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from backlog_dagster.implementations import open_session
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.secrets import resolve, secret_kept_out
from backlog_dagster.spark.session import apply_sql_settings, sql_settings_after

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backlog_dagster.phases.realtime import ArmedQuery


@contextmanager
def pipeline_spark(
    pipeline: PipelineConfig,
    phase: str,
    run_conf: Mapping[str, str] = {},
    run_id: str = "",
    handed: HandedOver | None = None,
) -> Iterator[SparkSession]:
    """The run's Spark session on the pipeline's master (read from the environment when
    it says ``{env: NAME}``), with the phase's ``spark_conf`` and then the run's; errors
    of the block never show a master read from there. A realtime step goes on with the
    session its run's backlog step ``handed`` over (``take_over``), if it did."""
    phase_conf = pipeline.backlog.spark_conf if phase == "backlog" else pipeline.realtime.spark_conf
    master = resolve(pipeline.spark_master, "spark_master")
    with secret_kept_out(pipeline.spark_master, master):
        if handed is None:
            session = new_pipeline_session(pipeline, phase, run_conf)
        else:
            session = handed.spark
            _settings_of_realtime(session, master, handed.settings, {**phase_conf, **run_conf})
        try:
            yield session
        finally:
            # A Spark Connect server outlives the run: let go of the run's session there
            # (its cached data, any query left) now rather than at the session timeout,
            # unless the run's realtime step goes on with it.
            if master.startswith("sc://") and run_id not in _handed_over:
                session.stop()


def stop_unless_handed_over(spark: SparkSession, run_id: str) -> None:
    """Stop a session the run opened again mid-step, unless it went to the run's realtime
    step."""
    handed = _handed_over.get(run_id)
    if handed is None or handed.spark is not spark:
        spark.stop()


def new_pipeline_session(
    pipeline: PipelineConfig, phase: str, run_conf: Mapping[str, str] = {}
) -> SparkSession:
    """A session on the pipeline's master with the phase's ``spark_conf`` and then the
    run's: ``pipeline_spark``'s, and the one a realtime run goes on in when its Spark
    Connect server started again under it."""
    phase_conf = pipeline.backlog.spark_conf if phase == "backlog" else pipeline.realtime.spark_conf
    master = resolve(pipeline.spark_master, "spark_master")
    with secret_kept_out(pipeline.spark_master, master):
        return open_session(master, f"{phase}-{pipeline.name}", {**phase_conf, **run_conf})


@dataclass(frozen=True)
class HandedOver:
    """What a backlog step leaves its run's realtime step (``switch.continue_as_realtime``)."""

    spark: SparkSession
    #: The settings the backlog phase put on the session.
    settings: Mapping[str, str]
    #: The realtime query armed while the backlog ran (``arm_beside``), on ``spark``, and
    #: what stops it; None when it was not armed.
    armed: ArmedQuery | None = None
    stop_armed: ExitStack = field(default_factory=ExitStack)


#: What backlog steps handed to their run's realtime step, by run id: the steps run one
#: after the other in the run's process.
_handed_over: dict[str, HandedOver] = {}


def hand_over(run_id: str, handed: HandedOver) -> None:
    _handed_over[run_id] = handed


def take_over(run_id: str) -> HandedOver | None:
    """What the run's backlog step handed over, if it did (once)."""
    return _handed_over.pop(run_id, None)


def _settings_of_realtime(
    spark: SparkSession, master: str, backlog_settings: Mapping[str, str], conf: Mapping[str, str]
) -> None:
    """Give the backlog's session the SQL settings a realtime run's own session starts
    with: what the backlog set goes back to the project's default or away, then the
    realtime phase's own (its launch settings are the backlog's: ``PipelineConfig``)."""
    apply_sql_settings(spark, sql_settings_after(master, backlog_settings, conf))
