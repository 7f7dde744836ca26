"""One phase run per pipeline at a time, across processes.

A run holds an exclusive ``flock`` on a file beside the sink for as long as it runs.
The kernel drops the lock when the process dies however it dies, so a crash never
leaves the pipeline locked. A second run (a user's click while the sensor's run is
going, two CLI invocations) is refused at once with a message saying why.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backlog_dagster.pipeline.config import PipelineConfig


class PhaseAlreadyRunning(RuntimeError):
    """Another run of the same pipeline holds its lock."""


@contextmanager
def exclusive_run(config: PipelineConfig, phase: str) -> Iterator[None]:
    path = Path(config.sink.path).with_name(f".{config.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip()
            raise PhaseAlreadyRunning(
                f"pipeline {config.name}: refusing to start a {phase} run while another run "
                f"of it is going ({holder or 'unknown'}); wait for it or cancel it"
            ) from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{phase} run, process {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(descriptor)
