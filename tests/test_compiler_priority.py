"""A long-lived JVM's compiler threads are niced, and no other thread is."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from backlog_dagster.spark.compiler_priority import lower_compiler_priority


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_only_threads_named_as_a_jvms_compilers_are_niced() -> None:
    ready, done = threading.Barrier(3), threading.Event()
    threads: dict[str, int] = {}

    def named(name: str) -> None:
        threads[name] = threading.get_native_id()
        # What Linux shows as the thread's name: a JVM's compilers are named so.
        Path(f"/proc/self/task/{threads[name]}/comm").write_text(name)
        ready.wait()
        done.wait()

    for name in ("C2 CompilerThread0", "Executor task"):
        threading.Thread(target=named, args=(name,), daemon=True).start()
    ready.wait()
    try:
        before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        assert lower_compiler_priority(os.getpid(), before + 3) == 1
        assert os.getpriority(os.PRIO_PROCESS, threads["C2 CompilerThread0"]) == before + 3
        assert os.getpriority(os.PRIO_PROCESS, threads["Executor task"]) == before
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
    finally:
        done.set()


def test_a_process_that_is_gone_changes_nothing() -> None:
    assert lower_compiler_priority(2**22 + 1) == 0
