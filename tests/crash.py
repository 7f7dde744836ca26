"""The crash matrix: kill a process of the running example at a chosen moment, let it
recover, and audit the sink against an oracle over the log.

The example project (both pipelines) runs under a real ``dagster dev`` (daemon, sensors,
code server, runs with their Spark JVMs) on a generated backlog, with a live producer
appending all along. A trial picks a kill point, waits for its moment, SIGKILLs the
processes it names (only processes under the ``dagster dev`` this harness started, found
by their ids), restarts ``dagster dev`` when the kill took it down, waits until the
pipelines are back in realtime, and then audits both sinks: every record of the log up
to the offsets a pipeline reports as consumed must be counted exactly once.

``tests/test_crash.py`` runs one trial per kill point; ``bench/crash.py`` runs many at
random moments and writes their table to ``bench/results/``.

The harness runs a copy of the example project with these changes, none of which
touches how progress and results commit:

- a heartbeat timeout of 15 s, so a killed run is noticed sooner;
- for ``region_minutes``, a backlog checkpoint interval of 0.05 s (so even a small
  backlog commits in several chunks) and a watermark lag threshold of 10 minutes
  instead of 2;
- realtime micro-batches every 5 s instead of 2 s.

The last two keep two cores from drowning: with two realtime queries at 2 s and a
producer, region_minutes went round after round of backlog before its lag fell under 2
minutes. Each backlog run goes on as its realtime run (as shipped), so "before the
switch" is the window between the backlog's last commit and the run recording the
switch (or the sensor's next tick, if the run is gone).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
from dagster._core.definitions.run_request import InstigatorType

from backlog_dagster.components.switch import runs_of_phase
from backlog_dagster.log import Topic, create_topic
from backlog_dagster.pipeline.paths import DATA_ENV
from backlog_dagster.spark.servers import (
    SparkServer,
    start_connect_server,
    wait_until_listening,
)
from backlog_dagster.tools.dev_server import (
    DevServer,
    process_kind,
    processes_under,
    start_dagster_dev,
    stop_dagster_dev,
)
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog
from tests.dagster_server import copy_example

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = ("customer_totals", "region_minutes")

#: Where a trial kills, and what.
KILL_POINTS = {
    "backlog_interval_0": "customer_totals' backlog run (checkpoint interval 0) mid-job",
    "backlog_interval_positive": "region_minutes' backlog run (interval 0.05 s) between chunks",
    "before_switch": "customer_totals' backlog run (which goes on as the realtime run) and the "
    "Dagster daemon after the last bucket reached its marker, before realtime committed",
    "realtime_sink_write": "the process making a realtime commit, while it holds the sink's "
    "write lock: a realtime run's driver, or on a shared Spark Connect server its "
    "foreachBatch worker",
    "daemon": "the Dagster daemon (dagster dev then stops; the harness starts it again)",
    "everything": "every process of dagster dev at once: daemon, webserver, code server, "
    "runs and their Spark JVMs",
}
#: Kill points of a shared Spark server only (``ExampleUnderTest.spark_server``).
SHARED_SPARK_KILL_POINTS = {
    "spark_server": "the shared Spark Connect server (its JVM and every Python worker it "
    "started), in a backlog or in realtime; started again on its port at once, as a "
    "service manager would",
}


def kill_points(shared_spark: bool) -> dict[str, str]:
    """The kill points a trial may draw, with their descriptions."""
    return KILL_POINTS | (SHARED_SPARK_KILL_POINTS if shared_spark else {})


#: SQLite's WAL write lock: byte 120 of the ``-shm`` file, held from ``BEGIN IMMEDIATE``
#: to ``COMMIT``.
_WAL_WRITE_LOCK_BYTE = 120


@dataclass
class Outcome:
    """One trial: what was killed, when, and what the audit found afterwards."""

    kill_point: str
    pipeline: str
    phase: str
    #: The moment came as planned (e.g. the backlog had not finished when killed).
    hit: bool
    killed: list[str] = field(default_factory=list)
    recovered: bool = False
    #: Seconds from the kill until the pipeline(s) committed in realtime again.
    recovery_s: float | None = None
    lost: int = 0
    duplicated: int = 0
    #: Keys whose record count matched the oracle but whose values did not.
    mismatched: int = 0
    note: str = ""
    #: Where the pipelines stood when a trial did not recover (for the failure message).
    diagnosis: str = field(default="", repr=False)


class ExampleUnderTest:
    """The example project running under ``dagster dev``, with a live producer."""

    def __init__(
        self,
        folder: Path,
        records: int,
        live_rate: int,
        seed: int = 1,
        spark_server: SparkServer | None = None,
    ) -> None:
        """``spark_server``: a Spark Connect server every run shares (else each run has a
        local Spark of its own)."""
        self.folder = folder
        self.project = folder / "project"
        self.data = folder / "data"
        self.home = folder / "dagster_home"
        self.topic_path = self.data / "example" / "orders"
        self.sink_path = self.data / "example" / "results.sqlite"
        self.live_rate, self.seed = live_rate, seed
        self.spark_server = spark_server

        def edit(attributes: dict[str, Any]) -> bool:
            if spark_server is not None:
                attributes["spark_master"] = spark_server.url
            return _lighter(attributes)

        copy_example(self.project, edit)
        create_topic(
            self.topic_path, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=4
        ).close()
        with Topic(self.topic_path) as topic:
            produce_backlog(topic, records, days=2, seed=seed)
        self.server: DevServer | None = None
        self.process: subprocess.Popen[bytes] | None = None
        #: Every ``dagster dev`` started, by process group: when its daemon dies it stops
        #: without its code server, whose runs go on (correctly: their heartbeats say
        #: they live); ``stop`` ends them all.
        self.groups: list[int] = []
        self.dead_at = 0.0
        self.producer: subprocess.Popen[bytes] | None = None
        self._instance: dg.DagsterInstance | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.server, self.process = start_dagster_dev(self.project, self.home, self.data)
        self.groups.append(self.process.pid)
        if self.producer is None:
            self.producer = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("backlog-dagster")),
                    "log",
                    "produce",
                    str(self.topic_path),
                    "--records",
                    "0",
                    "--live-rate",
                    str(self.live_rate),
                    "--seed",
                    str(self.seed + 100),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

    def stop_producer(self) -> None:
        if self.producer is not None:
            self.producer.terminate()
            self.producer.wait(30)
            self.producer = None

    def stop(self) -> None:
        self.stop_producer()
        if self.process is not None:
            stop_dagster_dev(self.process)
            self.process = None
        for group in self.groups:  # what earlier sessions left running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        if self._instance is not None:
            self._instance.dispose()
            self._instance = None

    @property
    def instance(self) -> dg.DagsterInstance:
        if self._instance is None:
            self._instance = dg.DagsterInstance.from_config(str(self.home))
        return self._instance

    # -- what the sink says ------------------------------------------------------------

    def phase(self, pipeline: str) -> str:
        row = self._query(
            "SELECT phase FROM backlog_phases WHERE pipeline = ? ORDER BY rowid DESC LIMIT 1",
            (pipeline,),
        )
        return "backlog" if not row else str(row[0][0])

    def progress(self, pipeline: str) -> dict[int, tuple[int, int, int]]:
        """``{bucket: (start, marker, reached)}`` of the newest generation."""
        rows = self._query(
            "SELECT bucket, start_offset, marker, reached FROM backlog_buckets WHERE "
            "pipeline = :p AND generation = (SELECT max(generation) FROM backlog_generations "
            "WHERE pipeline = :p)",
            {"p": pipeline},
        )
        return {bucket: (start, marker, reached) for bucket, start, marker, reached in rows}

    def markers_reached(self, pipeline: str) -> bool:
        """Every bucket of the newest generation reached its marker."""
        progress = self.progress(pipeline)
        return bool(progress) and all(r >= m for _, m, r in progress.values())

    def realtime_commit_since(self, pipeline: str, moment: float) -> float | None:
        rows = self._query(
            "SELECT min(committed_at) FROM backlog_commits WHERE pipeline = ? AND "
            "phase = 'realtime' AND committed_at > ?",
            (pipeline, moment),
        )
        return rows[0][0] if rows else None

    def _query(self, sql: str, parameters: Any = ()) -> list[Any]:
        if not self.sink_path.exists():
            return []
        with contextlib.closing(sqlite3.connect(self.sink_path, timeout=30)) as db:
            try:
                return db.execute(sql, parameters).fetchall()
            except sqlite3.OperationalError as error:
                if "no such table" in str(error):
                    return []
                raise

    # -- runs and processes ------------------------------------------------------------

    def started_runs(self, pipeline: str, phase: str) -> list[dg.DagsterRun]:
        return runs_of_phase(self.instance, pipeline, phase, [dg.DagsterRunStatus.STARTED])

    def run_processes(self, run_id: str) -> set[int]:
        """The processes that logged events for the run, and everything under them."""
        roots = {
            entry.dagster_event.pid
            for entry in self.instance.all_logs(run_id)
            if entry.dagster_event is not None and entry.dagster_event.pid
        }
        found = set(roots)
        for pid in roots:
            found |= processes_under(pid)
        return {pid for pid in found if self._mine(pid)}

    def run_logged(self, run_id: str, text: str) -> bool:
        return any(text in entry.user_message for entry in self.instance.all_logs(run_id))

    def _mine(self, pid: int) -> bool:
        """Only processes under a ``dagster dev`` this harness started are ever killed."""
        try:
            return os.getpgid(pid) in self.groups
        except ProcessLookupError:
            return False

    def kill(self, pids: set[int]) -> list[str]:
        """SIGKILL ``pids`` and wait until they are dead; their kinds, for the record.

        ``dead_at`` is then the moment after which none of them can commit anything.
        """
        kinds = sorted(process_kind(pid) for pid in pids)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        poll(lambda: not any(_alive(pid) for pid in pids), 30, interval=0.01)
        self.dead_at = time.time()
        return kinds

    def restart_spark_server(self) -> None:
        """Start the shared Spark server again on its port and folder, once the one
        before is dead. Whoever started the first server stops the last one
        (``bench/crash.py``)."""
        dead = self.spark_server
        assert dead is not None and dead.process.poll() is not None
        self.spark_server = start_connect_server(dead.port, dead.log.parent)
        wait_until_listening(self.spark_server)

    def realtime_commits(self, pipeline: str) -> int:
        rows = self._query(
            "SELECT count(*) FROM backlog_commits WHERE pipeline = ? AND phase = 'realtime'",
            (pipeline,),
        )
        return int(rows[0][0]) if rows else 0

    def reset(self, pipeline: str) -> None:
        """``backlog-dagster pipeline reset``, as a user would run it: back to a backlog."""
        subprocess.run(
            [
                str(Path(sys.executable).with_name("backlog-dagster")),
                "pipeline",
                "reset",
                "--yes",
                "--reason",
                "reset by the crash harness",
                str(self.project / "definitions" / "defs" / pipeline / "defs.yaml"),
            ],
            check=True,
            capture_output=True,
            env={**os.environ, DATA_ENV: str(self.data)},
        )

    def diagnose(self, since: float) -> str:
        """Each pipeline's phase and commits, its newest runs, and its sensor's last ticks:
        what a trial that did not recover leaves to read."""
        now = time.time()
        lines = []
        for pipeline in PIPELINES:
            commit = self.realtime_commit_since(pipeline, since)
            lines.append(
                f"{pipeline}: phase {self.phase(pipeline)}, realtime commit since the kill: "
                f"{'none' if commit is None else f'{now - commit:.0f} s ago'}, "
                f"progress {self.progress(pipeline)}"
            )
            for phase in ("backlog", "realtime"):
                runs = self.instance.get_runs(
                    filters=dg.RunsFilter(job_name=f"{pipeline}_{phase}_job"), limit=3
                )
                for run in runs:
                    stats = self.instance.get_run_stats(run.run_id)
                    lines.append(
                        f"  {phase} run {run.run_id[:8]} {run.status.value} "
                        f"key {run.tags.get('dagster/run_key')} "
                        f"launched {_ago(now, stats.launch_time)} ended {_ago(now, stats.end_time)}"
                        f" reason {run.tags.get('dagster/failure_reason')}"
                    )
        for state in self.instance.all_instigator_state(instigator_type=InstigatorType.SENSOR):
            ticks = self.instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=3)
            for tick in ticks:
                error = tick.error.message.strip()[:300] if tick.error else ""
                lines.append(
                    f"sensor {state.instigator_name} ({state.status.value}): tick "
                    f"{_ago(now, tick.timestamp)} {tick.status.value} runs {list(tick.run_keys)} "
                    f"skip {(tick.skip_reason or '')[:200]!r} {error}"
                )
        log = self.home / "dagster-dev.log"
        if log.exists():
            lines += ["dagster-dev.log, last lines:", *log.read_text().splitlines()[-15:]]
        return "\n".join(lines)

    # -- waiting -----------------------------------------------------------------------

    def wait_caught_up(self, timeout: float) -> bool:
        """Until both pipelines have consumed the log up to its end as it is now."""
        with Topic(self.topic_path) as topic:
            end = topic.latest_offsets()
        return poll(
            lambda: all(
                {b: r for b, (_, _, r) in self.progress(p).items()} == end for p in PIPELINES
            ),
            timeout,
        )

    def wait_in_realtime(self, pipelines: tuple[str, ...], since: float, timeout: float) -> bool:
        """Until each pipeline is in realtime and has committed there after ``since``."""
        return poll(
            lambda: all(
                self.phase(p) == "realtime"
                and self.realtime_commit_since(p, since) is not None
                and self.started_runs(p, "realtime")
                for p in pipelines
            ),
            timeout,
        )


# -- trials -----------------------------------------------------------------------------


@dataclass
class Strike:
    """A kill made: its outcome so far and when it happened."""

    outcome: Outcome
    killed_at: float
    #: When every killed process was dead.
    dead_at: float


def run_trial(example: ExampleUnderTest, kill_point: str, rng: random.Random) -> Outcome:
    """Wait for the kill point's moment, kill, recover, audit."""
    return recover(example, strike(example, kill_point, rng))


def strike(
    example: ExampleUnderTest, kill_point: str, rng: random.Random, phase: str | None = None
) -> Strike:
    """Wait for the kill point's moment and kill; start dagster dev again if it went down.

    ``phase`` sets the phase the daemon or everything is killed in (drawn at random
    otherwise); the other kill points have theirs.
    """
    in_phase = {
        "daemon": _kill_daemon,
        "everything": _kill_everything,
        "spark_server": _kill_spark_server,
    }
    if kill_point in in_phase:
        kill_in = in_phase[kill_point]
        outcome, killed_at = kill_in(example, rng, phase or rng.choice(("backlog", "realtime")))
    else:
        kill = {
            "backlog_interval_0": _kill_backlog_mid_job,
            "backlog_interval_positive": _kill_backlog_between_chunks,
            "before_switch": _kill_before_switch,
            "realtime_sink_write": _kill_during_sink_write,
        }[kill_point]
        outcome, killed_at = kill(example, rng)
    dead_at = example.dead_at
    if example.process is not None and example.process.poll() is not None:
        example.process = None  # dagster dev stopped itself (it does when its daemon dies)
    if example.process is None:
        example.start()
    return Strike(outcome, killed_at, dead_at)


def recover(example: ExampleUnderTest, struck: Strike) -> Outcome:
    """Wait until the pipelines the kill touched commit in realtime again; audit."""
    outcome, killed_at = struck.outcome, struck.killed_at
    targets = PIPELINES if outcome.pipeline == "both" else (outcome.pipeline,)
    # A commit counts from when the killed processes were dead, not from the kill: one
    # they finished in between would look like a recovery in no time.
    since = max(killed_at, struck.dead_at)
    outcome.recovered = example.wait_in_realtime(targets, since, timeout=420)
    if outcome.recovered:
        outcome.recovery_s = round(
            max(example.realtime_commit_since(p, since) or since for p in targets) - killed_at,
            1,
        )
    else:
        outcome.diagnosis = example.diagnose(since)
    if outcome.kill_point == "spark_server":
        outcome.note = went_on_in_new_sessions(example, killed_at)
    audit_into(outcome, example)
    return outcome


#: What a run logs as it goes on in a new session after its Spark Connect server
#: started again (``spark.session.reopened_after_restart``).
WENT_ON = "the Spark Connect server started again under this run"


def went_on_in_new_sessions(example: ExampleUnderTest, since: float) -> str:
    """Which runs went on in a new session after the server's kill, as their logs say
    (none: they failed, or were not under way, and the sensor started others)."""
    went_on = []
    for pipeline in PIPELINES:
        for run in runs_of_phase(example.instance, pipeline, "backlog") + runs_of_phase(
            example.instance, pipeline, "realtime"
        ):
            for entry in example.instance.all_logs(run.run_id):
                if entry.timestamp >= since and WENT_ON in entry.user_message:
                    went_on.append(f"{pipeline}'s {entry.user_message.split(':')[0]} run")
    return "went on in a new session: " + (", ".join(sorted(set(went_on))) or "none")


def audit_into(outcome: Outcome, example: ExampleUnderTest) -> None:
    for found in audit(example.sink_path, example.topic_path).values():
        outcome.lost += found["lost"]
        outcome.duplicated += found["duplicated"]
        outcome.mismatched += found["mismatched"]


def _kill_backlog_mid_job(example: ExampleUnderTest, rng: random.Random) -> tuple[Outcome, float]:
    pipeline = "customer_totals"
    run = _backlog_run_logging(example, pipeline, "records to read up to the markers")
    time.sleep(rng.uniform(0, 0.5))
    before = example.progress(pipeline)
    killed_at = time.time()
    killed = example.kill(example.run_processes(run.run_id))
    hit = all(reached == start for start, _, reached in before.values())
    return Outcome("backlog_interval_0", pipeline, "backlog", hit, killed), killed_at


def _kill_backlog_between_chunks(
    example: ExampleUnderTest, rng: random.Random
) -> tuple[Outcome, float]:
    pipeline = "region_minutes"
    run = _backlog_run_logging(example, pipeline, "records to read up to the markers")
    if not poll(
        lambda: any(reached > start for start, _, reached in example.progress(pipeline).values()),
        120,
        interval=0.05,
    ):
        raise TimeoutError("region_minutes' backlog never committed a chunk")
    time.sleep(rng.uniform(0, 0.8))
    before = example.progress(pipeline)
    killed_at = time.time()
    killed = example.kill(example.run_processes(run.run_id))
    hit = not all(reached >= marker for _, marker, reached in before.values())
    return Outcome("backlog_interval_positive", pipeline, "backlog", hit, killed), killed_at


def _kill_before_switch(example: ExampleUnderTest, rng: random.Random) -> tuple[Outcome, float]:
    pipeline = "customer_totals"
    _backlog_run_logging(example, pipeline, "records to read up to the markers")
    committed = example.realtime_commits(pipeline)
    if not poll(lambda: example.markers_reached(pipeline), 300, interval=0.01):
        raise TimeoutError("customer_totals' backlog never reached its markers")
    pids = _daemons(example)
    for phase in ("backlog", "realtime"):  # it may have gone on as the realtime run
        for run in example.started_runs(pipeline, phase):
            pids |= example.run_processes(run.run_id)
    hit = example.realtime_commits(pipeline) == committed
    killed_at = time.time()
    killed = example.kill(pids)
    _wait_dagster_dev_gone(example)
    return Outcome("before_switch", pipeline, "backlog", hit, killed), killed_at


def _kill_during_sink_write(example: ExampleUnderTest, rng: random.Random) -> tuple[Outcome, float]:
    """With a local Spark the commit runs in the realtime run's driver, which is killed.
    On a shared server it runs in the server's ``foreachBatch`` worker, which is killed
    alone: whichever pipeline's commit it makes (both share the sink), so the trial is
    of both."""
    shared = example.spark_server is not None
    pipelines = PIPELINES if shared else (rng.choice(PIPELINES),)
    if not example.wait_in_realtime(pipelines, time.time(), timeout=420):
        raise TimeoutError(f"{' and '.join(pipelines)} did not reach realtime")
    pipeline = "both" if shared else pipelines[0]

    def writers() -> set[int]:
        if example.spark_server is not None:
            return processes_under(example.spark_server.process.pid)
        return example.run_processes(example.started_runs(pipelines[0], "realtime")[0].run_id)

    def commits() -> int:
        return sum(example.realtime_commits(p) for p in pipelines)

    candidates, looked_up = writers(), time.monotonic()
    shm = Path(f"{example.sink_path}-shm").stat().st_ino
    deadline = time.monotonic() + 120
    held_before: set[int] = set()
    before = 0
    while time.monotonic() < deadline:
        if shared and time.monotonic() - looked_up > 1:  # a server's workers come and go
            candidates, looked_up = writers(), time.monotonic()
        held = _write_lock_holders(candidates, shm)
        if held and not held_before:
            before = commits()  # a reader does not wait for the writer
        if held & held_before:  # held over two looks: a commit, not a heartbeat
            killed_at = time.time()
            killed = example.kill(held if shared else candidates)
            # If that commit still completed before the kill landed, it was not hit.
            hit = commits() == before
            outcome = Outcome("realtime_sink_write", pipeline, "realtime", hit, killed)
            if not hit:
                outcome.note = "the commit completed before the kill landed"
            return outcome, killed_at
        held_before = held
        time.sleep(0.002)
    killed_at = time.time()
    killed = example.kill(candidates)
    outcome = Outcome("realtime_sink_write", pipeline, "realtime", False, killed)
    outcome.note = "the write lock was not seen held in 120 s; killed anyway"
    return outcome, killed_at


def _kill_daemon(
    example: ExampleUnderTest, rng: random.Random, phase: str
) -> tuple[Outcome, float]:
    _wait_for_phase(example, rng, phase)
    daemons = _daemons(example)
    killed_at = time.time()
    killed = example.kill(daemons)
    _wait_dagster_dev_gone(example)
    return Outcome("daemon", "both", phase, bool(daemons), killed), killed_at


def _daemons(example: ExampleUnderTest) -> set[int]:
    assert example.process is not None
    under = processes_under(example.process.pid)
    return {pid for pid in under if process_kind(pid) == "dagster_daemon"}


def _wait_dagster_dev_gone(example: ExampleUnderTest) -> None:
    """dagster dev notices its daemon is gone and stops the rest; wait for that."""
    process = example.process
    assert process is not None
    if not poll(lambda: process.poll() is not None, 90):
        stop_dagster_dev(process)
    example.process = None


def _kill_everything(
    example: ExampleUnderTest, rng: random.Random, phase: str
) -> tuple[Outcome, float]:
    _wait_for_phase(example, rng, phase)
    assert example.process is not None
    process = example.process
    pids = processes_under(process.pid) | {process.pid}
    killed_at = time.time()
    killed = example.kill(pids)
    process.wait(30)
    example.process = None
    return Outcome("everything", "both", phase, True, killed), killed_at


def _kill_spark_server(
    example: ExampleUnderTest, rng: random.Random, phase: str
) -> tuple[Outcome, float]:
    """Every run's Spark work dies with it: queries, jobs, sessions and the commits under
    way in its ``foreachBatch`` workers."""
    server = example.spark_server
    if server is None:
        raise ValueError("the spark_server kill point needs a shared Spark server")
    _wait_for_phase(example, rng, phase)
    pids = processes_under(server.process.pid) | {server.process.pid}
    killed_at = time.time()
    killed = example.kill(pids)
    server.process.wait(30)
    example.restart_spark_server()
    return Outcome("spark_server", "both", phase, True, killed), killed_at


def _wait_for_phase(example: ExampleUnderTest, rng: random.Random, phase: str) -> None:
    """Until a backlog run of a random pipeline reads (resetting it into a backlog if
    need be), or both pipelines are in realtime; then a random few seconds."""
    if phase == "backlog":
        _backlog_run_logging(example, rng.choice(PIPELINES), "records to read up to the markers")
        time.sleep(rng.uniform(0, 1))
    else:
        if not example.wait_in_realtime(PIPELINES, 0, timeout=420):
            raise TimeoutError("the pipelines did not reach realtime")
        time.sleep(rng.uniform(0, 5))


def _backlog_run_logging(example: ExampleUnderTest, pipeline: str, text: str) -> dg.DagsterRun:
    """The pipeline's live backlog run once it logged ``text``.

    A pipeline in realtime, or whose backlog has nothing left to read, is reset into a
    new backlog first. A killed run counts as started until the sensor notices; it has
    no processes left and is passed over.
    """
    if example.phase(pipeline) != "backlog" or example.markers_reached(pipeline):
        example.reset(pipeline)
    found: list[dg.DagsterRun] = []

    def logged() -> bool:
        found[:] = [
            r
            for r in example.started_runs(pipeline, "backlog")
            if example.run_logged(r.run_id, text) and example.run_processes(r.run_id)
        ]
        return bool(found)

    if not poll(logged, 300, interval=0.5):  # reading a run's events costs CPU: not faster
        raise TimeoutError(f"no backlog run of {pipeline} logged {text!r}")
    return found[0]


def _alive(pid: int) -> bool:
    """Still running: neither gone nor a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _write_lock_holders(pids: set[int], shm_inode: int) -> set[int]:
    """Those of ``pids`` holding the sink's WAL write lock (from ``/proc/locks``)."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return set()
    holders = set()
    for line in lines:
        parts = line.split()
        # "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 120 120"
        if len(parts) >= 8 and parts[1] == "POSIX" and parts[3] == "WRITE":
            inode = int(parts[5].rsplit(":", 1)[1])
            if (
                int(parts[4]) in pids
                and inode == shm_inode
                and int(parts[6]) <= _WAL_WRITE_LOCK_BYTE
            ):
                end = parts[7]
                if end == "EOF" or int(end) >= _WAL_WRITE_LOCK_BYTE:
                    holders.add(int(parts[4]))
    return holders


def _ago(now: float, moment: float | None) -> str:
    return "never" if moment is None else f"{now - moment:.0f} s ago"


def poll(condition: Callable[[], Any], timeout: float, interval: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return bool(condition())


def _lighter(attributes: dict[str, Any]) -> bool:
    """The harness's lighter settings for two cores (see the module's docstring)."""
    attributes.setdefault("switch", {})["heartbeat_timeout"] = "15s"
    attributes["realtime"]["checkpoint_interval"] = "5s"
    if attributes["name"] == "region_minutes":
        attributes["backlog"]["checkpoint_interval"] = "0.05s"
        attributes["backlog"]["watermark_lag_threshold"] = "10m"
    # The example's other pipelines have their own tests; here they would only load the cores.
    return attributes["name"] in PIPELINES


# -- the audit ----------------------------------------------------------------------------


def audit(sink_path: Path, topic_path: Path) -> dict[str, dict[str, int]]:
    """Per pipeline: records lost, counted twice, and keys with wrong values.

    Reads the results, late records and progress in one snapshot of the sink, and
    counts the log's records up to the progress with pyarrow (the oracle).
    """
    with contextlib.closing(sqlite3.connect(sink_path, timeout=30)) as db:
        db.execute("BEGIN")  # one read snapshot for everything below
        reached = {
            p: dict(
                db.execute(
                    "SELECT bucket, reached FROM backlog_buckets WHERE pipeline = :p AND "
                    "generation = (SELECT max(generation) FROM backlog_generations WHERE "
                    "pipeline = :p)",
                    {"p": p},
                ).fetchall()
            )
            for p in PIPELINES
        }
        totals = db.execute("SELECT customer_id, orders, total_amount FROM customer_totals")
        customer_totals = totals.fetchall()
        minutes = db.execute(
            "SELECT region, window_start, orders, total_amount FROM region_minutes"
        )
        region_minutes = minutes.fetchall()
        late = db.execute('SELECT bucket, "offset" FROM region_minutes_late').fetchall()
        db.rollback()
    records = _log_records(
        topic_path, {b: max(r[b] for r in reached.values()) for b in reached[PIPELINES[0]]}
    )
    found = {}
    for pipeline, rows in (
        ("customer_totals", customer_totals),
        ("region_minutes", region_minutes),
    ):
        mine = _up_to(records, reached[pipeline])
        if pipeline == "region_minutes":
            late_ids = pa.array([(b << 40) | o for b, o in late], pa.int64())
            mine = mine.filter(pc.invert(pc.is_in(mine["_id"], value_set=late_ids)))
            minute = pc.floor_temporal(mine["event_time"], unit="minute")
            mine = mine.append_column(
                "window_start", pc.strftime(minute, format="%Y-%m-%dT%H:%M:%SZ")
            )
            keys = ["region", "window_start"]
        else:
            keys = ["customer_id"]
        oracle = mine.group_by(keys).aggregate([("amount", "count"), ("amount", "sum")])
        want = {
            tuple(row[k] for k in keys): (row["amount_count"], row["amount_sum"])
            for row in oracle.to_pylist()
        }
        got = {tuple(row[: len(keys)]): (row[-2], row[-1]) for row in rows}
        found[pipeline] = _compare(got, want)
    return found


def _compare(
    got: dict[tuple[Any, ...], tuple[int, float]], want: dict[tuple[Any, ...], tuple[int, float]]
) -> dict[str, int]:
    lost = duplicated = mismatched = 0
    for key in got.keys() | want.keys():
        have_count, have_sum = got.get(key, (0, 0.0))
        want_count, want_sum = want.get(key, (0, 0.0))
        lost += max(0, want_count - have_count)
        duplicated += max(0, have_count - want_count)
        if have_count == want_count and abs(have_sum - want_sum) > 1e-6 * max(1.0, abs(want_sum)):
            mismatched += 1
    return {"lost": lost, "duplicated": duplicated, "mismatched": mismatched}


def _log_records(topic_path: Path, end: dict[int, int]) -> pa.Table:
    tables = []
    with Topic(topic_path) as topic:
        for bucket, stop in end.items():
            start = topic.bounds()[bucket].earliest
            batches = list(topic.read(bucket, start, stop))
            if not batches:
                continue
            table = pa.Table.from_batches(batches).select(
                ["customer_id", "region", "amount", "event_time"]
            )
            table = table.append_column("_bucket", pa.array([bucket] * len(table), pa.int64()))
            offsets = pa.array(range(start, start + len(table)), pa.int64())
            table = table.append_column("_offset", offsets)
            tables.append(
                table.append_column("_id", pc.add(pc.shift_left(table["_bucket"], 40), offsets))
            )
    return pa.concat_tables(tables)


def _up_to(records: pa.Table, reached: dict[int, int]) -> pa.Table:
    limit = pc.index_in(records["_bucket"], value_set=pa.array(sorted(reached), pa.int64()))
    ends = pa.array([reached[b] for b in sorted(reached)], pa.int64()).take(limit)
    return records.filter(pc.less(records["_offset"], ends))
