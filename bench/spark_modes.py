"""A Spark per run against one that outlives runs, same machine, same run.

    .venv/bin/python bench/spark_modes.py [--records 2000000] [--repeat 3]

1. Start: a fresh process that gets a session and runs a one-row job, with its own
   local Spark (a JVM start) against attaching to a running Spark Connect server.
2. Backlog: ``backlog-dagster pipeline backlog`` of the example's customer_totals over
   ``records`` reference records, in a fresh process (what a run pays, Spark start
   included), on ``local[*]``, on a standalone cluster of two workers (one core each,
   the run's executors on both), and on a Spark Connect server (``local[*]`` inside).
3. Through ``dagster dev`` on the example project (both pipelines), per run Spark and
   shared (every run on one Connect server): the switch gap (last backlog commit to
   first realtime commit), recovery after a SIGKILL of customer_totals' realtime run
   (the kill to its next realtime commit, the sensor restarting it), and the peak
   memory of every process (Dagster's, the runs', the server's).

Medians of ``repeat`` (start, backlog) and of every switch gap and recovery of
``sessions`` sessions per mode (two pipelines, ``kills`` kills each). Writes
``bench/results/<date>-spark-modes.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import page
from cases import wait_until
from report import machine_line
from run import _rss_mib, _topic, machine

from backlog_dagster.pipeline.paths import DATA_ENV
from backlog_dagster.spark import servers
from backlog_dagster.tools.dev_server import (
    all_of,
    copy_project,
    dagster_dev,
    on_spark,
    processes_under,
)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
SPARK_ENV = "BACKLOG_BENCH_SPARK"
#: The live load while the example runs under ``dagster dev``.
LIVE = ("--live-rate", "2000", "--seed", "11")
CLI = str(Path(sys.executable).with_name("backlog-dagster"))

_START = """
import sys, time
from backlog_dagster.implementations import open_session
spark = open_session(sys.argv[1], app_name="bench-start")
spark.range(1).collect()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--sessions", type=int, default=2, help="dagster dev sessions per mode (3.)."
    )
    parser.add_argument("--kills", type=int, default=2, help="Recoveries timed per session.")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-modes-"))
    results: dict[str, Any] = {
        "records": args.records,
        "repeat": args.repeat,
        "sessions": args.sessions,
        "kills": args.kills,
    }
    try:
        with servers.connect_server(scratch / "connect") as connect:
            results["start_s"] = {
                "local_per_run": _median(lambda: _timed_start("local[*]"), args.repeat),
                "connect_attach": _median(lambda: _timed_start(connect.url), args.repeat),
            }
            print(f"start: {results['start_s']}", flush=True)
            topic = scratch / "data" / "example" / "orders"
            _topic(topic, args.records).close()
            backlog = {
                "local": _median(
                    lambda: _timed_backlog(scratch, "local[*]", {}), args.repeat, keep=True
                ),
                "connect": _median(
                    lambda: _timed_backlog(scratch, connect.url, {}), args.repeat, keep=True
                ),
            }
        with servers.standalone_cluster(scratch / "cluster", workers=2, cores=1) as (master, _):
            spread = {"spark.cores.max": "2", "spark.executor.cores": "1"}
            backlog["standalone_2_workers"] = _median(
                lambda: _timed_backlog(scratch, master.url, spread), args.repeat, keep=True
            )
        results["backlog"] = backlog
        print(f"backlog: {backlog}", flush=True)
        results["dagster_dev"] = {
            mode: _example_sessions(scratch, mode, args.sessions, args.kills)
            for mode in ("local_per_run", "connect")
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results["machine"] = machine()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}-spark-modes.json"
    out.write_text(json.dumps(results, indent=2))
    page.write()
    print(f"wrote {out.relative_to(ROOT)} and BENCHMARKS.md")


def _median(measure: Any, repeat: int, keep: bool = False) -> Any:
    samples = [measure() for _ in range(repeat)]
    if not keep:
        return round(statistics.median(samples), 2)
    return {key: round(statistics.median(s[key] for s in samples), 2) for key in samples[0]} | {
        "samples_s": [round(s["seconds"], 2) for s in samples]
    }


def _timed_start(master: str) -> float:
    begun = time.monotonic()
    subprocess.run([sys.executable, "-c", _START, master], check=True, capture_output=True)
    return time.monotonic() - begun


def _timed_backlog(scratch: Path, master: str, conf: dict[str, str]) -> dict[str, float]:
    """A fresh sink each time: the whole backlog, from the process start to its end."""
    data = scratch / "data"
    (data / "example" / "results.sqlite").unlink(missing_ok=True)
    defs = scratch / "defs.yaml"
    text = (ROOT / "definitions" / "defs" / "customer_totals" / "defs.yaml").read_text()
    text = text.replace("attributes:\n", f"attributes:\n  spark_master: '{master}'\n", 1)
    if conf:
        inline = ", ".join(f"{k}: '{v}'" for k, v in conf.items())
        text = text.replace("  backlog:\n", f"  backlog:\n    spark_conf: {{{inline}}}\n", 1)
    defs.write_text(text)
    begun = time.monotonic()
    done = subprocess.run(
        [CLI, "pipeline", "backlog", str(defs)],
        capture_output=True,
        text=True,
        env={**os.environ, DATA_ENV: str(data)},
    )
    seconds = time.monotonic() - begun
    if done.returncode != 0:
        raise RuntimeError(f"backlog on {master} failed:\n{done.stdout[-2000:]}")
    return {"seconds": seconds}


def _example_sessions(scratch: Path, mode: str, sessions: int, kills: int) -> dict[str, Any]:
    """``sessions`` sessions of the example under ``dagster dev``: switch gaps, recoveries
    after a killed realtime run, peak memory."""
    gaps: list[float] = []
    recoveries: list[float] = []
    memory: list[float] = []
    for rep in range(sessions):
        data = scratch / f"dev-{mode}-{rep}"
        _topic(data / "example" / "orders", 200_000).close()
        with _spark_for(mode, data / "spark") as server, _producer(data) as _:
            project = data / "project"
            edit = on_spark(SPARK_ENV) if server else (lambda attributes: True)
            copy_project(ROOT, project, all_of(edit))
            with (
                dagster_dev(project, data / "dagster_home", data) as dev,
                _peak_memory([dev.pid] + ([server.process.pid] if server else [])) as peak,
            ):
                sink = data / "example" / "results.sqlite"
                wait_until(
                    lambda sink=sink: all(_first_realtime_commit(sink, p) for p in PIPELINES),
                    900,
                    "both pipelines to commit in realtime",
                )
                for pipeline in PIPELINES:
                    gaps.append(_gap_parts(sink, pipeline, data / "dagster_home")["gap_s"])
                for _ in range(kills):
                    recoveries.append(_kill_and_recover(data, sink))
                memory.append(peak())
        print(f"{mode} session {rep}: gaps {gaps[-2:]}, recoveries {recoveries[-kills:]}")
        shutil.rmtree(data, ignore_errors=True)
    return {
        "switch_gap_s": {
            "median": round(statistics.median(gaps), 2),
            "samples": [round(gap, 2) for gap in gaps],
        },
        "recovery_s": {"median": round(statistics.median(recoveries), 2), "samples": recoveries},
        "memory_peak_mib": {"median": round(statistics.median(memory)), "samples": memory},
    }


@contextmanager
def _spark_for(mode: str, folder: Path) -> Iterator[servers.SparkServer | None]:
    if mode != "connect":
        yield None
        return
    with servers.connect_server(folder) as server:
        os.environ[SPARK_ENV] = server.url
        yield server


@contextmanager
def _producer(data: Path) -> Iterator[subprocess.Popen[bytes]]:
    producer = subprocess.Popen(
        [CLI, "log", "produce", str(data / "example" / "orders"), "--records", "0", *LIVE],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield producer
    finally:
        producer.terminate()
        producer.wait(30)


def _kill_and_recover(data: Path, sink: Path) -> float:
    """SIGKILL customer_totals' realtime run (its processes and what they started);
    seconds until the run the sensor starts instead commits. (A commit the dead run had
    under way may still land after the kill: it does not count as recovered.)"""
    import dagster as dg

    with dg.DagsterInstance.from_config(str(data / "dagster_home")) as instance:
        wait_until(lambda: _started(instance), 300, "a started realtime run of customer_totals")
        run = _started(instance)
        assert run is not None
        roots = {
            e.dagster_event.pid
            for e in instance.all_logs(run.run_id)
            if e.dagster_event is not None and e.dagster_event.pid
        }
        doomed = set(roots).union(*(processes_under(pid) for pid in roots))
        for pid in doomed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed = time.time()

        def recovered() -> float | None:
            successor = _started(instance)
            if successor is None or successor.run_id == run.run_id:
                return None
            starts = [
                e.timestamp
                for e in instance.all_logs(successor.run_id)
                if (e.user_message or "").startswith("realtime: starting")
            ]
            return _realtime_commit_after(sink, starts[0]) if starts else None

        wait_until(lambda: recovered() is not None, 600, "the next run's first commit")
        first = recovered()
    assert first is not None
    time.sleep(5)  # let the new run settle before the next kill
    return round(first - killed, 2)


def _started(instance: Any) -> Any:
    import dagster as dg

    runs = instance.get_runs(
        filters=dg.RunsFilter(
            job_name="customer_totals_realtime_job", statuses=[dg.DagsterRunStatus.STARTED]
        )
    )
    return runs[0] if runs else None


def _realtime_commit_after(sink: Path, moment: float) -> float | None:
    with sqlite3.connect(sink) as db:
        (first,) = db.execute(
            "SELECT min(committed_at) FROM backlog_commits WHERE pipeline = 'customer_totals' "
            "AND phase = 'realtime' AND committed_at > ?",
            (moment,),
        ).fetchone()
    return first


@contextmanager
def _peak_memory(roots: list[int]) -> Iterator[Any]:
    """Sample, every second, the resident memory of every process under ``roots`` (the
    roots included); yields a function giving the largest sum seen so far (MiB)."""
    import threading

    peak = [0.0]
    stopping = threading.Event()

    def sample() -> None:
        while not stopping.wait(1.0):
            pids = set(roots).union(*(processes_under(root) for root in roots))
            peak[0] = max(peak[0], sum(_rss_mib(pid) for pid in pids))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield lambda: round(peak[0], 1)
    finally:
        stopping.set()
        thread.join(5)


def _markdown(results: dict[str, Any]) -> str:
    start, backlog, dev = results["start_s"], results["backlog"], results["dagster_dev"]
    local, connect = dev["local_per_run"], dev["connect"]
    lines = [
        "## A Spark per run against one that outlives runs",
        "",
        f"`bench/spark_modes.py`, {machine_line(results['machine'])}. Start and backlog: "
        f"medians of {results['repeat']}; under `dagster dev`: medians over "
        f"{results.get('sessions', 2)} sessions per mode (a switch gap per pipeline, "
        f"{results.get('kills', 2)} kills per session).",
        "",
        "| what | Spark per run (`local[*]`) | shared | ratio |",
        "| --- | ---: | ---: | ---: |",
        f"| a fresh process: session + one-row job (s) | {start['local_per_run']} | "
        f"{start['connect_attach']} (Connect) | "
        f"{start['local_per_run'] / start['connect_attach']:.1f}x |",
        f"| backlog of {results['records']:,} records, process start to end (s) | "
        f"{backlog['local']['seconds']} | {backlog['connect']['seconds']} (Connect) | "
        f"{backlog['local']['seconds'] / backlog['connect']['seconds']:.2f}x |",
        f"| the same on a standalone cluster, 2 workers x 1 core (s) | "
        f"{backlog['local']['seconds']} | {backlog['standalone_2_workers']['seconds']} | "
        f"{backlog['local']['seconds'] / backlog['standalone_2_workers']['seconds']:.2f}x |",
        f"| example under `dagster dev`: switch gap (s) | {local['switch_gap_s']['median']} | "
        f"{connect['switch_gap_s']['median']} (Connect) | "
        f"{local['switch_gap_s']['median'] / connect['switch_gap_s']['median']:.1f}x |",
        f"| recovery: realtime run SIGKILLed → its next commit (s) | "
        f"{local['recovery_s']['median']} | {connect['recovery_s']['median']} (Connect) | "
        f"{local['recovery_s']['median'] / connect['recovery_s']['median']:.1f}x |",
        f"| peak memory of every process (MiB) | {local['memory_peak_mib']['median']:,} | "
        f"{connect['memory_peak_mib']['median']:,} (Connect, server included) | "
        f"{local['memory_peak_mib']['median'] / connect['memory_peak_mib']['median']:.1f}x |",
        "",
        "Samples (s): switch gaps "
        f"{_listed(local['switch_gap_s']['samples'])} per run, "
        f"{_listed(connect['switch_gap_s']['samples'])} shared; recoveries "
        f"{_listed(local['recovery_s']['samples'])} per run, "
        f"{_listed(connect['recovery_s']['samples'])} shared.",
    ]
    return "\n".join(lines) + "\n"


def _listed(samples: list[float]) -> str:
    return ", ".join(f"{sample:.1f}" for sample in samples)


# -- the switch gap, from the sink and the Dagster instance ------------------------


PIPELINES = ("customer_totals", "region_minutes")


def _first_realtime_commit(sink: Path, pipeline: str) -> float | None:
    import sqlite3

    if not sink.exists():
        return None
    with sqlite3.connect(sink) as db:
        try:
            (first,) = db.execute(
                "SELECT min(committed_at) FROM backlog_commits WHERE pipeline = ? AND phase = "
                "'realtime'",
                (pipeline,),
            ).fetchone()
        except sqlite3.OperationalError:
            return None
    return first


def _gap_parts(sink: Path, pipeline: str, home: Path) -> dict[str, float]:
    """The switch, timed from the last backlog commit (negative: before it)."""
    import sqlite3

    import dagster as dg

    with sqlite3.connect(sink) as db:
        (generation, switched) = db.execute(
            "SELECT generation, changed_at FROM backlog_phases WHERE pipeline = ? AND phase = "
            "'realtime' ORDER BY rowid LIMIT 1",
            (pipeline,),
        ).fetchone()
        (last_backlog,) = db.execute(
            "SELECT max(committed_at) FROM backlog_commits WHERE pipeline = ? AND generation = ? "
            "AND phase = 'backlog'",
            (pipeline, generation),
        ).fetchone()
    first_realtime = _first_realtime_commit(sink, pipeline)
    assert first_realtime is not None
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=f"{pipeline}_realtime_job"))
        # The run that started the query: an earlier standby may have ended unused when
        # its generation was replaced.
        for run in sorted(runs, key=lambda r: instance.get_run_stats(r.run_id).launch_time or 0):
            logged = [(e.user_message or "", e.timestamp) for e in instance.all_logs(run.run_id)]
            starts = [t for m, t in logged if m.startswith("realtime: starting")]
            if starts:
                launched = instance.get_run_stats(run.run_id).launch_time or switched
                break
        else:
            raise RuntimeError(f"no realtime run of {pipeline} started its query")
    started = starts[0]
    ready = next((t for m, t in logged if m.startswith("standby: Spark is up")), started)
    return {
        "gap_s": first_realtime - last_backlog,
        "phase_change_s": switched - last_backlog,
        "realtime_run_launched_s": launched - last_backlog,
        "spark_ready_s": ready - last_backlog,
        "query_started_s": started - last_backlog,
        "first_batch_s": first_realtime - started,
    }


if __name__ == "__main__":
    main()
