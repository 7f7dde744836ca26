"""One phase run per pipeline at a time, across processes.

A run holds its pipeline's run lock (part of the sink contract: ``Sink.run_lock``) for
as long as it runs; a dead process lets go of it, so a crash never leaves the pipeline
locked. A second run (a user's click while the sensor's run is going, two CLI
invocations) is refused, after ``wait_s``, with a message saying why; the short wait
lets a standby realtime run look at the pipeline (``Sink.run_lock`` with no wait)
without turning a backlog run away.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Sink


class PhaseAlreadyRunning(RuntimeError, UserError):
    """Another run of the same pipeline holds its lock."""


#: How long a run waits for the lock before it is refused.
WAIT_S = 5.0


@contextmanager
def exclusive_run(
    sink: Sink, config: PipelineConfig, phase: str, wait_s: float = WAIT_S, holder: str = ""
) -> Iterator[None]:
    """Hold the run lock as ``holder`` (``<phase> run`` unless given) for the block."""
    with sink.run_lock(holder or f"{phase} run", wait_s) as held:
        if not held:
            raise PhaseAlreadyRunning(
                f"pipeline {config.name}: refusing to start a {phase} run while another run "
                f"of it is going ({sink.lock_holder() or 'unknown'}); wait for it or cancel it"
            )
        yield
