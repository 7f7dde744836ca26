"""One phase run per pipeline at a time, across processes.

A run holds an exclusive ``flock`` on a file beside the sink for as long as it runs.
The kernel drops the lock when the process dies however it dies, so a crash never
leaves the pipeline locked. A second run (a user's click while the sensor's run is
going, two CLI invocations) is refused, after ``wait_s``, with a message saying why; the
short wait lets a standby realtime run look at the pipeline (``try_exclusive``) without
turning a backlog run away.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from backlog_dagster.pipeline.config import PipelineConfig


class PhaseAlreadyRunning(RuntimeError):
    """Another run of the same pipeline holds its lock."""


#: How long a run waits for the lock before it is refused.
WAIT_S = 5.0


@contextmanager
def exclusive_run(config: PipelineConfig, phase: str, wait_s: float = WAIT_S) -> Iterator[None]:
    with try_exclusive(config, phase, wait_s) as held:
        if not held:
            raise PhaseAlreadyRunning(
                f"pipeline {config.name}: refusing to start a {phase} run while another run "
                f"of it is going ({_holder(config) or 'unknown'}); wait for it or cancel it"
            )
        yield


@contextmanager
def try_exclusive(config: PipelineConfig, phase: str, wait_s: float = 0) -> Iterator[bool]:
    """Hold the pipeline's lock for the block if it can be had within ``wait_s``; say if so."""
    path = _path(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(0.1)
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{phase} run, process {os.getpid()}".encode(), 0)
        yield True
    finally:
        os.close(descriptor)


def _path(config: PipelineConfig) -> Path:
    return Path(config.sink.path).with_name(f".{config.name}.lock")


def _holder(config: PipelineConfig) -> str:
    try:
        return _path(config).read_text(errors="replace").strip()
    except OSError:
        return ""
