"""The example project as users run it: every pipeline under ``dagster dev``, start to fresh.

    .venv/bin/python bench/e2e.py [--records 20000000] [--live-rate 20000] [--repeat 3]

Each run: a fresh data folder with ``records`` reference orders (8 buckets, event times
over five days), a live producer appending ``live_rate`` orders a second (its own
process), and ``dagster dev`` on a copy of the example project, every pipeline as
shipped. Two cases, alternating, ``repeat`` runs each:

- ``as shipped``: a backlog run that reaches its markers with more than
  ``backlog.residual_records`` (100,000) records after them reads on in batch, and once
  the switch is due goes on as the realtime run with its own Spark;
- ``switch at the first markers``: the same with ``residual_records: 0``, as before it;
- ``a standby beside each backlog`` (only with ``--case``): ``switch.standby`` on and
  ``continue_as_realtime`` off, as shipped before 2026-11-27 evening: a realtime run
  started with each backlog run, warm and armed when the backlog ends;
- ``half-second micro-batches`` (only with ``--case``): as shipped with every
  pipeline's ``realtime.checkpoint_interval`` at 0.5 s, for realtime's latency;
- ``half-second micro-batches, C1-only realtime drivers`` (only with ``--case``): the
  same, with every realtime run's driver JVM compiling with C1 alone
  (``-XX:TieredStopAtLevel=1``, as ``realtime.spark_conf`` sets it): less JIT work in
  each fresh driver, against less optimized code once warm;
- ``standby lead 60 s`` (only with ``--case``): a standby, with
  ``switch.standby_lead: 60``: each standby starts once its backlog run is reading and
  its ETA, when known, is within a minute, rather than with the backlog run;
- ``one shared Spark Connect server`` (only with ``--case``): as shipped with every
  pipeline's ``spark_master`` on one Spark Connect server (``local[*]``) started, and
  warmed up as ``backlog-dagster spark connect-server`` does (``tools.sample_run``),
  before ``dagster dev``: no run starts a JVM of its own. Its process counts in the
  memory and CPU figures, from ``dagster dev``'s start;
- ``shared Spark, 0.5 s micro-batches`` (only with ``--case``): the same with every
  pipeline's ``realtime.checkpoint_interval`` at 0.5 s;
- ``shared Spark unwarmed, 0.5 s micro-batches`` (only with ``--case``): the same on a
  server that skipped the warm-up (``--warm-up 0``), as every shared server did before;
- ``shared Spark, 0.5 s, a standby`` (only with ``--case``): the same with a standby
  beside each backlog run, as above;
- ``shared Spark, 0.5 s, realtime started at the switch`` (only with ``--case``): the
  same with neither a standby nor the backlog run going on: each realtime run starts
  at its switch;
- ``without the start and checkpoint cuts`` (only with ``--case``): as shipped, but
  every driver starts without the class-data archive (moved aside for the run) and
  realtime writes its checkpoints through Spark's default file manager: the baseline
  of both cuts, in the same run.

``--case`` runs only the cases named; their figures go to a file and a section of their
own (``<date>-e2e-<cases>.json``). ``--baseline CHECKOUT`` runs each case a second time
on the code of another checkout of the project (a git worktree of the commit before a
change, sharing this one's ``.venv``: its folder goes first on ``PYTHONPATH`` for every
process of the run), alternating with this checkout's runs, as ``<case>@baseline``:
a change measured against what it changed in the same run, on the same machine state.

Timed from when ``dagster dev`` answered (its webserver up: the daemon and code server
started, the definitions loaded; ``dagster_dev_up_s`` is how long that took, not counted
in the figures), per pipeline:

- ``switch_s``: its phase became realtime;
- ``fresh_s``: from then on its lag stays under one second of input. The lag is the
  records the log holds beyond what the sink committed, over ``live_rate``, sampled
  every 0.25 s; a micro-batch's records wait up to its checkpoint interval by design,
  so the lag counted is the smallest in each window of that interval plus 0.5 s (what
  is left just after each commit); ``settled_s`` the same under three seconds of input,
  and a run ends once every pipeline has held that for 30 s (or at ``--timeout``);
- ``backlog_records_per_s``: the records of every backlog round before the first switch
  over the time from the first markers to the last of those commits;
- ``switch_gap_s``: that last backlog commit to the first realtime one;
- ``realtime_run_requested_s``, ``realtime_run_began_s``, ``standby_spark_up_s``,
  ``realtime_query_started_s``: when the first realtime run (a standby, as shipped) was
  requested, began, had its Spark up (a standby: and its query armed) and started its
  streaming query (a standby: let its armed query read);
- ``realtime_p99_s``: append to visible result, every record appended from 30 s after
  the last pipeline was fresh to the end of the run (``bench/cases.py``'s
  ``record_latencies``).

And the CPU seconds per role (``bench/cpu.py``: backlog, standby and realtime runs with
their Spark, the producer, Dagster's own processes) from the start until every pipeline
had switched, after, and in the 30 s whose records give ``realtime_p99_s``. And the
peak resident memory of every process under ``dagster dev`` (the largest sum at one
moment). Beside it, in one warm process: each
pipeline's backlog over the same ``records`` (``checkpoint_interval`` 0), one after the
other, and a Spark start, to set the target: time to fresh within 1.5 times their sum.

With ``--timeline``, each run's lag, CPU by role each second and (on a shared server,
from its event log) every micro-batch's durations go to ``<date>-e2e-<cases>-timeline.json``
beside the figures. Each run's figures go to a file beside the scratch folder as it
ends; should a later step fail, ``--resume FILE`` (with the same ``--case`` and
``--repeat``) runs only the in-process part and writes the figures from them.

Writes ``bench/results/<date>-e2e.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import dagster as dg
import numpy as np
from dateutil.parser import isoparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the harness in tests/

from cases import ProgressPoller, record_latencies, wait_until
from cpu import CpuSampler
from report import machine_line, publish
from run import EXAMPLES, MemorySampler, _example, _topic, machine

from backlog_dagster.components.switch import STANDBY_TAG, STARTED_AS_TAG, runs_of_phase
from backlog_dagster.log import Topic
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.pipeline.paths import with_paths_under
from backlog_dagster.sink import open_sink
from backlog_dagster.spark.servers import SparkServer
from backlog_dagster.tools.dev_server import copy_project, dagster_dev
from backlog_dagster.tools.sample_run import DEFAULT_WARM_UP_S
from tests.connect_server import connect_server_cli

ROOT = Path(__file__).resolve().parent.parent
PIPELINES = EXAMPLES
#: A standby realtime run beside each backlog run, as shipped before 2026-11-27 evening.
STANDBY = {"standby": True, "continue_as_realtime": False}
#: case → the settings it changes in every pipeline (section → setting → value).
CASES: dict[str, dict[str, dict[str, Any]]] = {
    "as_shipped": {},
    "switch_at_first_markers": {"backlog": {"residual_records": 0}},
    "half_second_micro_batches": {"realtime": {"checkpoint_interval": 0.5}},
    "half_second_c1_realtime": {
        "switch": STANDBY,  # a realtime run's own driver
        "realtime": {
            "checkpoint_interval": 0.5,
            "spark_conf": {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"},
        },
    },
    "standby": {"switch": STANDBY},
    "standby_lead_60s": {"switch": {**STANDBY, "standby_lead": 60}},
    "shared_spark": {},
    "shared_spark_half_second": {"realtime": {"checkpoint_interval": 0.5}},
    "shared_spark_half_second_cold": {"realtime": {"checkpoint_interval": 0.5}},
    "shared_spark_half_second_standby": {
        "realtime": {"checkpoint_interval": 0.5},
        "switch": STANDBY,
    },
    "shared_spark_half_second_no_standby": {
        "realtime": {"checkpoint_interval": 0.5},
        "switch": {"standby": False, "continue_as_realtime": False},
    },
}
#: Cases whose runs share one Spark Connect server, started before ``dagster dev``.
SHARED_SPARK = {
    "shared_spark",
    "shared_spark_half_second",
    "shared_spark_half_second_cold",
    "shared_spark_half_second_standby",
    "shared_spark_half_second_no_standby",
}
#: Shared-Spark cases whose server starts without the warm-up that ``backlog-dagster spark
#: connect-server`` runs by default.
UNWARMED = {"shared_spark_half_second_cold"}
#: The cases a run without ``--case`` runs.
DEFAULT_CASES = ("as_shipped", "switch_at_first_markers")
#: Lag under this many seconds of input is fresh; the second, looser bound is reported
#: too (a loaded machine's micro-batches may never get under the first), and a run ends
#: once every pipeline has held under it for ``HOLD_S``.
FRESH_S = 1.0
SETTLED_S = 3.0
#: How long every pipeline must have been fresh before a run ends (s).
HOLD_S = 30.0
POLL_S = 0.25
HEADER = (
    "| case | pipeline | switch (s) | fresh (s) | under 3 s (s) | backlog rounds "
    "| backlog records/s | realtime run began (s) | switch gap (s) | realtime p99 (s) |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def main() -> None:
    args = parse()
    results, timelines, kept = measure(args)
    cases = args.case or list(DEFAULT_CASES)
    baseline = results["baseline_commit"]
    if args.case:
        suffix = "-".join(cases) + ("" if baseline is None else f"-against-{baseline}")
        path = publish(f"e2e-{suffix}", results, f"e2e.py {suffix}", markdown(results))
    else:
        path = publish("e2e", results, "e2e.py", markdown(results))
    if timelines:
        timeline = path.with_name(path.name.replace(".json", "-timeline.json"))
        timeline.write_text(json.dumps(timelines) + "\n")
        print(f"wrote {timeline}")
    kept.unlink(missing_ok=True)
    print(f"wrote {path} and BENCHMARKS.md in {results['bench_seconds']:.0f} s")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """This bench's settings from ``argv`` (the command line's when None): ``bench/run.py``
    runs its cases through here too, with the same defaults."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000_000)
    parser.add_argument("--live-rate", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also keep each run's lag, CPU by role and (shared Spark) micro-batches over "
        "time, in <date>-e2e-<cases>-timeline.json",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        metavar="CHECKOUT",
        help="also run each case on the code of another checkout of the project (a git "
        "worktree of the commit before a change), alternating with this one's runs",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        metavar="RUNS_JSON",
        help="the runs a bench that failed after them kept (it says where): only the "
        "in-process part runs, then the figures are written",
    )
    return parser.parse_args(argv)


def measure(
    args: argparse.Namespace,
) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]], Path]:
    """Every case's runs, alternating, then the in-process part: the results, each run's
    timeline (``--timeline``) and the file that keeps the runs so far (delete it once the
    results are safe)."""
    cases = args.case or list(DEFAULT_CASES)
    baseline = None if args.baseline is None else _commit_of(args.baseline)
    variants = [
        (case, code)
        for case in cases
        for code in ([None] if args.baseline is None else [None, args.baseline.resolve()])
    ]
    scratch = Path(tempfile.mkdtemp(prefix="bench-e2e-"))
    started = time.perf_counter()
    try:
        runs: dict[str, list[dict[str, Any]]] = {
            _variant(case, code): [] for case, code in variants
        }
        timelines: dict[str, list[dict[str, Any]]] = {}
        # The runs so far, should a later step fail (the file stays then).
        kept = scratch.with_name(f"{scratch.name}-runs.json")
        print(f"runs so far go to {kept}", flush=True)
        if args.resume:
            resumed = json.loads(args.resume.read_text())
            runs, timelines = resumed["runs"], resumed["timelines"]
            kept = args.resume
        for rep in range(0 if args.resume else args.repeat):
            for case, code in variants:
                name = _variant(case, code)
                with code_of(code):
                    run = one_run(
                        scratch / f"{name}-{rep}",
                        args,
                        CASES[case],
                        seed=10 + rep,
                        shared_spark=case in SHARED_SPARK,
                        warm_up_s=0 if case in UNWARMED else DEFAULT_WARM_UP_S,
                        project=code or ROOT,
                    )
                if "timeline" in run:
                    timelines.setdefault(name, []).append(run.pop("timeline"))
                runs[name].append(run)
                print(f"{name} run {rep + 1}: {json.dumps(run['pipelines'])}", flush=True)
                kept.write_text(json.dumps({"runs": runs, "timelines": timelines}) + "\n")
        in_process = in_one_process(scratch / "in-process", args.records)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {
        "records": args.records,
        "live_rate": args.live_rate,
        "repeat": args.repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "cases": {case: summarize(case_runs) for case, case_runs in runs.items()},
        "runs": runs,
        "in_process": in_process,
        "bench_seconds": round(time.perf_counter() - started, 1),
        "resumed_from": None if args.resume is None else args.resume.name,
        "baseline_commit": baseline,
    }
    return results, timelines, kept


#: How a baseline run's case is named: ``<case>@baseline``.
BASELINE = "@baseline"


def _variant(case: str, code: Path | None) -> str:
    return case if code is None else f"{case}{BASELINE}"


def _commit_of(checkout: Path) -> str:
    """The short commit a baseline checkout is at (it names the baseline in the report)."""
    done = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@contextlib.contextmanager
def code_of(checkout: Path | None) -> Iterator[None]:
    """The project's code from ``checkout`` for every process started in the block;
    None: this checkout's. ``dagster dev`` and its runs find it first on ``PYTHONPATH``;
    a Connect server's Python workers (``python -m``, without the server's
    ``PYTHONPATH``) find it in their working folder, the server's, which is this
    process's when it starts the server."""
    if checkout is None:
        yield
        return
    before, folder = os.environ.get("PYTHONPATH"), Path.cwd()
    # The Spark home this process's own Spark set (a checkout from before its removal
    # set one): the checkout's runs choose theirs.
    spark_home = os.environ.pop("SPARK_HOME", None)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(checkout), before]))
    os.chdir(checkout)
    try:
        yield
    finally:
        os.chdir(folder)
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
        if spark_home is not None:
            os.environ["SPARK_HOME"] = spark_home


def one_run(
    data: Path,
    args: argparse.Namespace,
    changes: dict[str, dict[str, Any]],
    seed: int,
    shared_spark: bool = False,
    warm_up_s: float = 0,
    project: Path = ROOT,
) -> dict[str, Any]:
    """The example (of the checkout at ``project``) under ``dagster dev`` from start
    until every pipeline held fresh; a shared server is started (and warmed up for
    ``warm_up_s``) before ``dagster dev``."""
    events = data.with_name(f"{data.name}-spark-events")
    with contextlib.ExitStack() as stack:
        server = None
        if shared_spark:
            conf = {}
            if args.timeline:
                events.mkdir(parents=True)
                conf = {
                    "spark.eventLog.enabled": "true",
                    "spark.eventLog.dir": events.as_uri(),
                    "spark.eventLog.compress": "false",
                }
            started = time.monotonic()
            server, _ = stack.enter_context(
                connect_server_cli(
                    data / "spark-connect", conf=conf, warm_up_s=warm_up_s, echo=True
                )
            )
            server_up_s = round(time.monotonic() - started, 1)
        run = _one_run(data, args, changes, seed, server, project)
        if server is not None:
            run["server_up_s"] = server_up_s
    # The server has stopped: its event log is whole.
    if "timeline" in run:
        run["timeline"]["micro_batches"] = micro_batches(events, run["timeline"].pop("began"))
    shutil.rmtree(events, ignore_errors=True)
    return run


def _one_run(
    data: Path,
    args: argparse.Namespace,
    changes: dict[str, dict[str, Any]],
    seed: int,
    spark: SparkServer | None,
    root: Path,
) -> dict[str, Any]:
    topic_path = data / "example" / "orders"
    _topic(topic_path, args.records).close()
    project = data / "project"

    def edit(attributes: dict[str, Any]) -> bool:
        for section, settings in changes.items():
            attributes.setdefault(section, {}).update(settings)
        if spark is not None:
            attributes["spark_master"] = spark.url
        return True

    copy_project(root, project, edit)
    configs = {
        name: with_paths_under(
            load_pipeline(project / "definitions" / "defs" / name / "defs.yaml"), data
        )
        for name in PIPELINES
    }
    producer = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("backlog-dagster")),
            *("log", "produce", str(topic_path), "--records", "0"),
            *("--live-rate", str(args.live_rate), "--seed", str(seed)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    sink_path = data / "example" / "results.sqlite"
    memory = MemorySampler()
    cpu = CpuSampler({producer.pid: "producer"})
    if spark is not None:
        memory.extra.append(spark.process.pid)
        cpu.roots[spark.process.pid] = "spark_connect_server"
    lags = LagSampler(topic_path, sink_path, PIPELINES)
    pollers = {p: ProgressPoller(sink_path, p) for p in PIPELINES}
    try:
        asked = time.time()
        with dagster_dev(project, data / "dagster_home", data) as server:
            began = time.time()
            dagster_dev_up_s = round(began - asked, 1)
            memory.watch(server.pid)
            cpu.roots[server.pid] = ""
            cpu.start()
            lags.start()
            wait_until(sink_path.exists, 300, "the sink to be made")
            for poller in pollers.values():
                poller.start()
            intervals = {p: configs[p].realtime.checkpoint_interval for p in PIPELINES}

            def held_fresh() -> bool:
                settled = [
                    fresh_since(lags.series(p), intervals[p], args.live_rate, SETTLED_S)
                    for p in PIPELINES
                ]
                return all(f is not None and time.time() - f >= HOLD_S for f in settled)

            deadline = time.monotonic() + args.timeout
            while not held_fresh() and time.monotonic() < deadline:
                time.sleep(1)
            with Topic(topic_path) as topic:
                latency_from = topic.latest_offsets()
            measuring = (time.time(), time.time() + HOLD_S)
            time.sleep(HOLD_S)
            with Topic(topic_path) as topic:
                latency_to = topic.latest_offsets()
            time.sleep(5)  # those records' commits
            peak = memory.stop()
            cpu.stop()
            ended = time.time()
            lags.stop()
            for poller in pollers.values():
                poller.stop()
            with Topic(topic_path) as topic:
                figures = {
                    p: pipeline_figures(
                        configs[p],
                        began,
                        {
                            name: fresh_since(lags.series(p), intervals[p], args.live_rate, bound)
                            for name, bound in (("fresh_s", FRESH_S), ("settled_s", SETTLED_S))
                        },
                        record_latencies(topic, pollers[p], latency_from, latency_to),
                    )
                    for p in PIPELINES
                }
            cpu_s = cpu_by_role(cpu, data / "dagster_home", began, ended, measuring, figures)
            if args.timeline:
                timeline = {
                    "lag_s": {
                        p: [
                            (round(t - began, 2), lag / args.live_rate) for t, lag in lags.series(p)
                        ]
                        for p in PIPELINES
                    },
                    "cpu_cores": cpu_timeline(cpu, data / "dagster_home", began),
                    "began": began,
                    "switch_s": {p: figures[p]["switch_s"] for p in PIPELINES},
                }
            for pipeline, started in first_realtime_runs(data / "dagster_home", began).items():
                figures[pipeline] |= started
    finally:
        memory.stop()
        cpu.stop()
        lags.stop()
        producer.terminate()
        producer.wait(30)
        shutil.rmtree(data, ignore_errors=True)
    run = {
        "pipelines": figures,
        "memory_peak_mib": peak,
        "cpu_s": cpu_s,
        "dagster_dev_up_s": dagster_dev_up_s,
    }
    if args.timeline:
        run["timeline"] = timeline
    return run


def cpu_timeline(cpu: CpuSampler, home: Path, began: float) -> list[dict[str, Any]]:
    """Each second's cores by role (s from the start)."""
    roles = cpu.roles(home)
    seconds = []
    for (t0, before), (t1, after) in zip(cpu.samples, cpu.samples[1:], strict=False):
        spent: dict[str, float] = {}
        for group, total in after.items():
            role = roles.get(group, "runs, unidentified") if group.startswith("run:") else group
            spent[role] = spent.get(role, 0.0) + (total - before.get(group, total)) / (t1 - t0)
        seconds.append({"t": round(t1 - began, 1)} | {r: round(c, 2) for r, c in spent.items()})
    return seconds


#: The Spark event a streaming query's progress is written to the event log as.
PROGRESS_EVENT = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"


def micro_batches(events: Path, began: float) -> list[dict[str, Any]]:
    """Every micro-batch the shared server ran, from its event log: query, batch, when it
    began (s from the start), records, and Spark's durations (s)."""
    found = []
    for path in sorted(p for p in events.rglob("*") if p.is_file()):
        with path.open() as lines:
            for line in lines:
                if PROGRESS_EVENT not in line:
                    continue
                progress = json.loads(line)["progress"]
                at = isoparse(progress["timestamp"].replace("Z", "+00:00"))
                found.append(
                    {
                        "query": progress.get("name"),
                        "batch": progress["batchId"],
                        "t": round(at.timestamp() - began, 2),
                        "records": progress.get("numInputRows", 0),
                        "s": {k: v / 1000 for k, v in progress["durationMs"].items()},
                    }
                )
    return found


def first_realtime_runs(home: Path, began: float) -> dict[str, dict[str, Any]]:
    """Per pipeline, its first realtime run: whether it was a standby, and when it was
    requested and began (s from the start): the switch gap is short only when it began
    well before the switch. A backlog run that went on as the realtime run
    (``switch.continue_as_realtime``) began as the realtime run when it said so."""
    found: dict[str, dict[str, Any]] = {}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for pipeline in PIPELINES:
            runs = runs_of_phase(instance, pipeline, "realtime")  # the newest first
            record = instance.get_run_record_by_id(runs[-1].run_id) if runs else None
            if record is None:
                continue
            tags = record.dagster_run.tags
            said = {
                entry.user_message: entry.timestamp
                for entry in instance.all_logs(record.dagster_run.run_id)
            }
            went_on = _first_said(said, "backlog: going on as the realtime run", began)
            found[pipeline] = {
                "realtime_run_standby": tags.get(STANDBY_TAG) == "true"
                or tags.get(STARTED_AS_TAG) == "standby",
                "realtime_run_went_on_from_backlog": went_on is not None,
                "realtime_run_requested_s": round(record.create_timestamp.timestamp() - began, 1),
                "realtime_run_began_s": (
                    went_on if went_on is not None else _seconds_after(record.start_time, began)
                ),
                **{
                    figure: _first_said(said, words, began)
                    for figure, words in (
                        ("standby_spark_up_s", "standby: Spark is up"),
                        ("standby_switched_s", "standby: switched to realtime"),
                        ("realtime_query_started_s", "realtime: starting at offsets"),
                    )
                },
            }
    return found


def _seconds_after(moment: float | None, began: float) -> float | None:
    return None if moment is None else round(moment - began, 1)


def _first_said(said: dict[str, float], words: str, began: float) -> float | None:
    """When a run first logged a message beginning with ``words`` (s from the start)."""
    times = [at for message, at in said.items() if message.startswith(words)]
    return round(min(times) - began, 1) if times else None


def cpu_by_role(
    cpu: CpuSampler,
    home: Path,
    began: float,
    ended: float,
    measuring: tuple[float, float],
    figures: dict[str, Any],
) -> dict[str, Any]:
    """CPU seconds per role from the start until every pipeline had switched, from then
    to the end, and while realtime latency was ``measuring`` (from, to), beside what the
    machine's cores could give in each."""
    switches = [f["switch_s"] for f in figures.values()]
    switched = ended if None in switches else began + max(switches)
    roles = cpu.roles(home)
    cores = os.cpu_count() or 1
    return {
        window: {
            "seconds": round(until - since, 1),
            "cores_s": round(cores * (until - since), 1),
            "by_role": cpu.breakdown(since, until, roles),
        }
        for window, since, until in (
            ("until_every_switch", began, switched),
            ("after", switched, ended),
            ("while_latency_measured", *measuring),
        )
    }


NEWEST_PROGRESS = (
    "SELECT bucket, reached FROM backlog_buckets WHERE pipeline = ? AND generation = "
    "(SELECT max(generation) FROM backlog_buckets WHERE pipeline = ?)"
)


class LagSampler(threading.Thread):
    """Every ``POLL_S``: per pipeline, the records the log holds beyond the sink's progress."""

    def __init__(self, topic_path: Path, sink_path: Path, pipelines: tuple[str, ...]) -> None:
        super().__init__(daemon=True)
        self.topic_path, self.sink_path, self.pipelines = topic_path, sink_path, pipelines
        self.samples: dict[str, list[tuple[float, int]]] = {p: [] for p in pipelines}
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def run(self) -> None:
        with Topic(self.topic_path) as topic:
            while not self.stopping.wait(POLL_S):
                latest = topic.latest_offsets()
                try:
                    with sqlite3.connect(self.sink_path) as db:
                        for pipeline in self.pipelines:
                            reached = dict(
                                db.execute(
                                    NEWEST_PROGRESS,
                                    (pipeline, pipeline),
                                ).fetchall()
                            )
                            if reached:
                                behind = sum(latest[b] - reached.get(b, 0) for b in latest)
                                with self.lock:
                                    self.samples[pipeline].append((time.time(), behind))
                except sqlite3.OperationalError:
                    continue  # the sink's tables are not made yet

    def series(self, pipeline: str) -> list[tuple[float, int]]:
        with self.lock:
            return list(self.samples[pipeline])

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(10)


def fresh_since(
    samples: list[tuple[float, int]], interval: float, live_rate: int, bound_s: float
) -> float | None:
    """Since when the lag just after each commit has stayed under ``bound_s`` of input:
    the smallest sample in each window of ``interval`` + 0.5 s, from then to the last."""
    window = interval + 0.5
    limit = bound_s * live_rate
    since = None
    for index, (at, _) in enumerate(samples):
        low = min(lag for t, lag in samples[index:] if t <= at + window)
        since = (since or at) if low < limit else None
    return since


def pipeline_figures(
    config: Any, began: float, fresh: dict[str, float | None], latencies: np.ndarray
) -> dict[str, Any]:
    """One pipeline's times from its sink, up to its first switch (a way back later
    starts backlog rounds of its own): switch, backlog rounds and rate, switch gap."""
    with open_sink(config) as sink:
        history = sink.phase_history()
    switched = next((c.changed_at for c in history if c.phase == "realtime"), None)
    until = float("inf") if switched is None else switched
    with sqlite3.connect(config.sink.path) as db:
        (first_markers, rounds) = db.execute(
            "SELECT min(created_at), count(*) FROM backlog_generations "
            "WHERE pipeline = ? AND created_at <= ?",
            (config.name, until),
        ).fetchone()
        (last_backlog, backlog_records) = db.execute(
            "SELECT max(committed_at), sum(records) FROM backlog_commits "
            "WHERE pipeline = ? AND phase = 'backlog' AND committed_at <= ?",
            (config.name, until),
        ).fetchone()
        (first_realtime,) = db.execute(
            "SELECT min(committed_at) FROM backlog_commits "
            "WHERE pipeline = ? AND phase = 'realtime'",
            (config.name,),
        ).fetchone()
    gap = None if first_realtime is None else round(first_realtime - last_backlog, 1)
    return {
        "switch_s": None if switched is None else round(switched - began, 1),
        **{name: None if at is None else round(at - began, 1) for name, at in fresh.items()},
        "backlog_records": backlog_records,
        "backlog_rounds": rounds,
        "backlog_records_per_s": round(backlog_records / (last_backlog - first_markers)),
        "switch_gap_s": gap,
        "realtime_p99_s": round(float(np.percentile(latencies, 99)), 3) if len(latencies) else None,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for pipeline in PIPELINES:
        summary[pipeline] = {
            figure: (_median_time if figure in MOMENTS else _median)(
                [run["pipelines"][pipeline][figure] for run in runs]
            )
            for figure in runs[0]["pipelines"][pipeline]
        }
    for figure in ("fresh_s", "settled_s"):
        summary[f"{figure}_all"] = _median_time(
            [_latest([run["pipelines"][p][figure] for p in PIPELINES]) for run in runs]
        )
    summary["cpu_until_every_switch"] = _cpu_medians(
        [run["cpu_s"]["until_every_switch"] for run in runs]
    )
    if all("while_latency_measured" in run["cpu_s"] for run in runs):
        summary["cpu_while_latency_measured"] = _cpu_medians(
            [run["cpu_s"]["while_latency_measured"] for run in runs]
        )
    for figure in ("server_up_s", "dagster_dev_up_s"):
        if figure in runs[0]:
            summary[figure] = _median([run[figure] for run in runs])
    summary["memory_peak_mib_sum_of_all"] = max(
        run["memory_peak_mib"]["sum_of_all"] for run in runs
    )
    return summary


def _cpu_medians(windows: list[dict[str, Any]]) -> dict[str, Any]:
    roles = sorted({role for w in windows for role in w["by_role"]})
    return {
        "seconds": _median([w["seconds"] for w in windows]),
        "cores_s": _median([w["cores_s"] for w in windows]),
        "by_role": {r: _median([w["by_role"].get(r, 0.0) for w in windows]) for r in roles},
    }


def _cpu_line(label: str, cpu: dict[str, Any]) -> str:
    """``as shipped: 230 s of 2 cores (460 core-s): backlog 250 s (54 %), ...``."""
    roles: dict[str, float] = {}
    for role, seconds in cpu["by_role"].items():  # the pipelines' runs of a role together
        roles[role.split(":")[0]] = roles.get(role.split(":")[0], 0.0) + seconds
    by_role = sorted(roles.items(), key=lambda item: -item[1])
    used = sum(seconds for _, seconds in by_role)
    cores_s = cpu["cores_s"]
    parts = [f"{role} {seconds:.0f} s ({seconds / cores_s:.0%})" for role, seconds in by_role]
    idle = cpu["cores_s"] - used
    parts.append(f"idle {idle:.0f} s ({idle / cpu['cores_s']:.0%})")
    return f"- {label}: {cpu['seconds']:.0f} s, {cpu['cores_s']:.0f} core-seconds: " + ", ".join(
        parts
    )


def _latest(times: list[float | None]) -> float | None:
    """When every pipeline was there: the latest, None if one never was."""
    return None if None in times else max(t for t in times if t is not None)


#: Moments a run may never reach (None): for their median, never is later than any time.
MOMENTS = ("switch_s", "fresh_s", "settled_s")


def _median_time(values: list[float | None]) -> float | None:
    """The median moment, None ("not within the run") counted as the latest."""
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    middle = ordered[(len(ordered) - 1) // 2 : len(ordered) // 2 + 1]
    return None if None in middle else round(statistics.mean(v for v in middle if v is not None), 3)


def _median(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present else None


def _spark_start_s(attempts: int = 2) -> float:
    """Seconds a fresh process takes to start a local Spark and run a one-row job (a
    failed start is tried again once, then raised with what the process said)."""
    for attempt in range(attempts):
        started = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from backlog_dagster.implementations import open_session as g; "
                "g('local[*]', app_name='bench-start').range(1).count()",
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            return time.perf_counter() - started
        print(f"a Spark start failed (attempt {attempt + 1}):\n{done.stderr[-2000:]}", flush=True)
    raise RuntimeError("a fresh local Spark did not start; see above")


def in_one_process(folder: Path, records: int) -> dict[str, Any]:
    """Each example pipeline's backlog over ``records`` in one warm process, and a Spark
    start in a fresh one: the target's parts."""
    from backlog_dagster.implementations import open_session
    from backlog_dagster.phases.backlog import run_backlog

    _topic(folder / "example" / "orders", records).close()
    spark_start = _spark_start_s()
    spark = open_session("local[*]", app_name="bench-e2e-in-process")
    spark.sparkContext.setLogLevel("ERROR")
    seconds: dict[str, float] = {}
    for name in PIPELINES:
        config = _example(folder, name)
        config = config.model_copy(
            update={"backlog": config.backlog.model_copy(update={"checkpoint_interval": 0})}
        )
        began = time.perf_counter()
        with open_sink(config) as sink:
            report = run_backlog(spark, config, sink, log=lambda _: None)
        seconds[name] = round(time.perf_counter() - began, 2)
        print(f"in one process: {name} {report.rows_read:,} records in {seconds[name]} s")
    spark.stop()
    total = sum(seconds.values()) + spark_start
    return {
        "backlog_s": seconds,
        "spark_start_s": round(spark_start, 2),
        "target_fresh_s": round(1.5 * total, 1),
    }


#: How the report names each case.
LABELS = {
    "as_shipped": "as shipped",
    "switch_at_first_markers": "switch at the first markers",
    "half_second_micro_batches": "0.5 s micro-batches",
    "half_second_c1_realtime": "0.5 s, C1-only realtime drivers",
    "standby_lead_60s": "standby lead 60 s",
    "shared_spark": "one shared Spark Connect server",
    "shared_spark_half_second": "shared Spark, 0.5 s micro-batches",
    "shared_spark_half_second_standby": "shared Spark, 0.5 s, a standby",
    "shared_spark_half_second_no_standby": "shared Spark, 0.5 s, realtime started at the switch",
    "standby": "a standby beside each backlog",
    "shared_spark_half_second_cold": "shared Spark unwarmed, 0.5 s micro-batches",
}


def _label(case: str, results: dict[str, Any]) -> str:
    if case.endswith(BASELINE):
        return f"{LABELS[case.removesuffix(BASELINE)]}, at {results['baseline_commit']}"
    return LABELS[case]


def _against_baseline(results: dict[str, Any]) -> str:
    """Each case against the same case at the baseline commit, both from this run: the
    ratio of their medians (the figures that hang on the hour compare only so); empty
    without a baseline."""
    cases = results["cases"]
    figures = ("switch_s", "backlog_records_per_s", "realtime_p99_s")
    rows = [
        f"| {_label(case, results)} | {pipeline} | "
        + " | ".join(_ratio(cases[case][pipeline][f], cases[base][pipeline][f]) for f in figures)
        + " |"
        for case in cases
        if (base := case + BASELINE) in cases
        for pipeline in PIPELINES
    ]
    if not rows:
        return ""
    return (
        f"\nAgainst {results['baseline_commit']} in the same run (this code over that "
        "commit's; under 1 is sooner for the switch and p99, over 1 is faster for records/s):"
        "\n\n| case | pipeline | switch | backlog records/s | realtime p99 |\n"
        "| --- | --- | ---: | ---: | ---: |\n" + "\n".join(rows) + "\n"
    )


def _ratio(ours: float | None, theirs: float | None) -> str:
    return "n/a" if not ours or not theirs else f"{ours / theirs:.2f}x"


def markdown(results: dict[str, Any], heading: str | None = None) -> str:
    """The section of ``BENCHMARKS.md`` for ``results``, under ``heading`` (by default a
    title naming the command that reproduces them)."""
    cases = results["cases"]
    rows = []
    for case in cases:
        for pipeline in PIPELINES:
            f = cases[case][pipeline]
            rows.append(
                f"| {_label(case, results)} | {pipeline} | {f['switch_s']} | {f['fresh_s']} | "
                f"{f['settled_s']} | {f['backlog_rounds']} | {f['backlog_records_per_s']:,} | "
                f"{f.get('realtime_run_began_s')} | {f['switch_gap_s']} | {f['realtime_p99_s']} |"
            )
    table = "\n".join(rows)
    in_process = results["in_process"]
    parts = ", ".join(f"{name} {s:.1f} s" for name, s in in_process["backlog_s"].items())
    spark_start = in_process["spark_start_s"]
    fresh = "; ".join(
        f"{_label(case, results)}: every pipeline fresh at {figures['fresh_s_all']} s, "
        f"under 3 s of input at {figures['settled_s_all']} s, peak memory of every process "
        f"at one moment {figures['memory_peak_mib_sum_of_all']:,.0f} MiB"
        + (
            f", the shared server up (before `dagster dev`) in {figures['server_up_s']} s"
            if "server_up_s" in figures
            else ""
        )
        for case, figures in cases.items()
    )
    cpu_lines, cpu_after_lines = (
        "\n".join(
            _cpu_line(_label(case, results), figures[window])
            for case, figures in cases.items()
            if window in figures
        )
        for window in ("cpu_until_every_switch", "cpu_while_latency_measured")
    )
    after = (
        f"\nCPU in the {HOLD_S:.0f} s whose records' latency gives realtime's p99, by "
        f"role, medians:\n\n{cpu_after_lines}\n"
        if cpu_after_lines
        else ""
    )
    dev_up = [f["dagster_dev_up_s"] for f in cases.values() if "dagster_dev_up_s" in f]
    took = f"{min(dev_up)} to {max(dev_up)}" if dev_up and min(dev_up) != max(dev_up) else ""
    since = "when `dagster dev` answered" + (
        f" (its own start took {took or dev_up[0]} s, medians per case, not counted)"
        if dev_up
        else ""
    )
    command = "bench/e2e.py"
    named = [case for case in cases if not case.endswith(BASELINE)]
    if set(named) != set(DEFAULT_CASES):
        command += "".join(f" --case {c}" for c in named)
    if results.get("baseline_commit"):
        command += f" --baseline <checkout of {results['baseline_commit']}>"
    if heading is None:
        heading = f"## The example as users run it (`{command}`)"
    return f"""{heading}

{results["date"][:10]}: every example pipeline under `dagster dev`, a
{results["records"]:,}-record backlog and a live producer at {results["live_rate"]:,}
records/s, {results["repeat"]} runs per case, alternating (medians). Seconds from
{since}. *Fresh*: from then on the lag just after each commit stays under one second of
input. {machine_line(results["machine"])}

{HEADER}
{table}
{_against_baseline(results)}
{fresh} (*None*: not within the run).

CPU from the start until every pipeline had switched, by role (a run's worker, Spark JVM
and Python workers count for the run; *standby* is a realtime run started beside the
backlog, first waiting, then serving), medians:

{cpu_lines}
{after}
The same backlogs in one warm process: {parts}; a Spark start {spark_start:.1f} s;
target for every pipeline fresh (1.5 times their sum): {in_process["target_fresh_s"]} s.
"""


if __name__ == "__main__":
    main()
