"""Where the cores go under ``dagster dev``: CPU seconds per role, sampled from ``/proc``.

A run's processes (its worker, its Spark JVM, Spark's Python workers) count for the run,
and a run counts for its role from its tags: ``backlog``, ``standby`` (a realtime run
started beside the backlog, waiting and then serving as the realtime run) or
``realtime``. Everything else counts for its process kind (``dagster_daemon``,
``code_server``, ...), and the extra roots given by name (the producer) for that name.
A process that ends between two samples loses at most its last second.
"""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path

import dagster as dg

from backlog_dagster.components.switch import PHASE_TAG, STANDBY_TAG, STARTED_AS_TAG
from backlog_dagster.tools.dev_server import process_kind

TICKS_PER_S = os.sysconf("SC_CLK_TCK")
RUN_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")

#: A process, told apart from a later one with the same pid by its start time.
Key = tuple[int, int]


def _processes() -> dict[int, tuple[int, float, int]]:
    """pid → (parent pid, CPU seconds so far, start time in ticks) of every process."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()
        found[int(text.split(" ", 1)[0])] = (
            int(fields[1]),
            (int(fields[11]) + int(fields[12])) / TICKS_PER_S,
            int(fields[19]),
        )
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


class CpuSampler(threading.Thread):
    """Every second: the CPU seconds so far of every process under ``roots``, by group
    (a run worker's key for a run's processes, else the process kind or root name)."""

    def __init__(self, roots: dict[int, str]) -> None:
        super().__init__(daemon=True)
        self.roots = roots
        self.stopping = threading.Event()
        self.cpu: dict[Key, float] = {}
        self.group: dict[Key, str] = {}
        self.run_ids: dict[str, str] = {}
        #: (time, CPU seconds so far per group), one per sample.
        self.samples: list[tuple[float, dict[str, float]]] = []

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            self._sample()

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(5)

    def _sample(self) -> None:
        table = _processes()
        children: dict[int, list[int]] = {}
        for pid, (parent, _, _) in table.items():
            children.setdefault(parent, []).append(pid)
        for root, name in self.roots.items():
            self._walk(root, name, None, table, children)
        totals: dict[str, float] = {}
        for key, seconds in self.cpu.items():
            group = self.group[key]
            totals[group] = totals.get(group, 0.0) + seconds
        self.samples.append((time.time(), totals))

    def _walk(
        self,
        pid: int,
        name: str,
        run_worker: str | None,
        table: dict[int, tuple[int, float, int]],
        children: dict[int, list[int]],
    ) -> None:
        if pid not in table:
            return
        _, seconds, started = table[pid]
        key = (pid, started)
        if key not in self.group:
            kind = process_kind(pid) if name == "" else name
            if run_worker is None and kind == "run_worker":
                run_worker = f"run:{pid}:{started}"
            self.group[key] = run_worker or kind
            # A run's compute-log tail names the run's log file, which holds its id.
            if kind == "compute_log_tail" and run_worker and run_worker not in self.run_ids:
                found = RUN_ID.search(_command(pid))
                if found:
                    self.run_ids[run_worker] = found.group(0)
        group = self.group[key]
        if group.startswith("run:"):
            run_worker = group
        self.cpu[key] = seconds
        for child in children.get(pid, []):  # a named root's processes count for it
            self._walk(child, name, run_worker, table, children)

    def roles(self, home: Path) -> dict[str, str]:
        """Each run group's role and pipeline (``standby: customer_totals``), from its
        run's tags and job in the instance at ``home``."""
        roles = {}
        with dg.DagsterInstance.from_config(str(home)) as instance:
            for group, run_id in self.run_ids.items():
                run = instance.get_run_by_id(run_id)
                if run is None:
                    continue
                tags = run.tags
                if tags.get(STANDBY_TAG) == "true" or tags.get(STARTED_AS_TAG) == "standby":
                    role = "standby"
                elif tags.get(STARTED_AS_TAG) == "backlog":
                    role = "backlog, then realtime"
                else:
                    role = tags.get(PHASE_TAG, "other runs")
                pipeline = (
                    run.job_name.removesuffix("_job")
                    .removesuffix("_realtime")
                    .removesuffix("_backlog_then_realtime")
                    .removesuffix("_backlog")
                )
                roles[group] = f"{role}: {pipeline}"
        return roles

    def breakdown(self, since: float, until: float, roles: dict[str, str]) -> dict[str, float]:
        """CPU seconds per role (and pipeline) between two moments (the samples nearest
        them)."""
        if not self.samples:
            return {}
        first = min(self.samples, key=lambda s: abs(s[0] - since))[1]
        last = min(self.samples, key=lambda s: abs(s[0] - until))[1]
        spent: dict[str, float] = {}
        for group, seconds in last.items():
            role = roles.get(group, "runs, unidentified") if group.startswith("run:") else group
            spent[role] = spent.get(role, 0.0) + seconds - first.get(group, 0.0)
        return {role: round(s, 1) for role, s in sorted(spent.items())}
