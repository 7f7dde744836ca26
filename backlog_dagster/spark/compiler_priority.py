"""A long-lived Spark JVM's JIT compilers run at a lower CPU priority than its work.

A Spark Connect server keeps compiling long after its warm-up: every plan it has not
run before (a new pipeline's backlog and realtime queries) generates classes of its own,
and Spark's planning code is large. Measured on
the shared server under ``dagster dev`` (2 cores, three example pipelines' realtime
queries at 0.5 s micro-batches, a minute after the last switch): its C2 compiler thread
took 0.39 of a core, a third of the JVM's CPU, and on a server warmed for two minutes the
compilers still took about a core for the first 30 s of a new session's run, decaying
over some five minutes. That work competes for the same cores as the micro-batches whose
latency the user waits on.

So the server's compiler threads get a niceness of ``COMPILER_NICENESS``: on an idle
core a niced thread runs as fast as any, so the warm-up (which runs alone) and a quiet
server compile as before; when the cores are contended, the scheduler serves the
micro-batches and backlog tasks first and compiles in what is left.

Linux only (thread niceness through ``/proc`` and ``setpriority``); raising a thread's
niceness needs no privilege. Elsewhere nothing changes. The JVM starts all of its
compiler threads at once (``JAVA_OPTION``), so none started later keeps the normal
priority.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: The JVM's compiler threads, by name as Linux shows it (cut at 15 characters).
COMPILER_THREAD_PREFIXES = ("C1 CompilerThre", "C2 CompilerThre")
#: CFS gives a thread at niceness 10 about a tenth of the CPU share of one at 0.
COMPILER_NICENESS = 10
#: Without it the JVM starts compiler threads as its compile queues grow.
JAVA_OPTION = "-XX:-UseDynamicNumberOfCompilerThreads"


def compiler_threads(pid: int) -> list[int]:
    """The thread ids of the JVM ``pid``'s compilers (none where the platform has no
    ``/proc`` or the process is gone)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            if task.joinpath("comm").read_text().startswith(COMPILER_THREAD_PREFIXES):
                found.append(int(task.name))
    return found


def lower_compiler_priority(pid: int, niceness: int = COMPILER_NICENESS) -> int:
    """Give the JVM ``pid``'s compiler threads ``niceness``; how many it changed."""
    changed = 0
    for thread in compiler_threads(pid):
        with contextlib.suppress(OSError):  # the thread ended meanwhile
            os.setpriority(os.PRIO_PROCESS, thread, niceness)
            changed += 1
    return changed
