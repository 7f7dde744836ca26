"""What Spark's Python processes cost from the installation's Spark home and from the
launch home (``spark.home``), on a local Spark and on a Spark Connect server.

    .venv/bin/python bench/spark_home.py [--records 2000000] [--repeat 3]

Each trial runs the three example pipelines' backlogs (``checkpoint_interval: 0``) over
the same reference records:

- *local*: in one fresh process with a local Spark of its own, one after the other, as a
  run with a Spark per run does;
- *Connect*: on a fresh Spark Connect server (not warmed up), from three client processes
  at once, as three runs on a shared server do.

It counts the CPU of every Python process Spark started (workers, their daemons; on the
server also its data source processes), of the JVM, and the wall time. The Spark home
is the pyspark installation (as before the launch home: Spark puts its zipped PySpark
first on those processes' path) or the launch home; the two alternate, ``repeat``
trials each, medians.

Writes ``bench/results/<date>-spark-home.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import ours
from report import machine_line, publish
from run import EXAMPLES, _example, _fresh_sink, _topic, machine

from backlog_dagster.spark import home, servers

HOMES: dict[str, Callable[[], Path]] = {
    "installation": home.installed_home,
    "launch home": home.launch_home,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-spark-home-"))
    trials: dict[str, dict[str, list[dict[str, float]]]] = {"local": {}, "connect": {}}
    try:
        _topic(scratch / "example" / "orders", args.records).close()
        for round_ in range(args.repeat):
            for name, spark_home in HOMES.items():
                for mode, trial in (("local", local_trial), ("connect", connect_trial)):
                    folder = scratch / f"{mode}-{round_}-{name.replace(' ', '-')}"
                    row = trial(scratch, folder, spark_home())
                    trials[mode].setdefault(name, []).append(row)
                    print(f"{mode}, {name}, run {round_ + 1}: {row}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "records": args.records,
        "repeat": args.repeat,
        "medians": {
            mode: {name: _medians(rows) for name, rows in by_home.items()}
            for mode, by_home in trials.items()
        },
        "trials": trials,
    }
    path = publish("spark-home", results, "spark_home.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def local_trial(data: Path, folder: Path, spark_home: Path) -> dict[str, float]:
    """The three backlogs in a fresh process with a local Spark launched from ``spark_home``."""
    folder.mkdir(parents=True)
    environment = {**os.environ, "SPARK_HOME": str(spark_home)}
    script = [sys.executable, __file__, "--child", str(data), str(folder)]
    started = time.monotonic()
    child = subprocess.Popen(script, env=environment, stdout=subprocess.PIPE, text=True)
    cpu = _watch(psutil.Process(child.pid), child)
    wall = time.monotonic() - started
    assert child.returncode == 0, "the local trial failed"
    return {"wall_s": round(wall, 2), **cpu}


def connect_trial(data: Path, folder: Path, spark_home: Path) -> dict[str, float]:
    """The three backlogs from three clients at once on a fresh Connect server launched
    from ``spark_home``."""
    launch_home = servers.launch_home
    servers.launch_home = lambda: spark_home  # type: ignore[assignment]
    try:
        server = servers.start_connect_server(servers.free_port(), folder / "server")
    finally:
        servers.launch_home = launch_home  # type: ignore[assignment]
    try:
        servers.wait_until_listening(server)
        started = time.monotonic()
        clients = [
            subprocess.Popen(
                [sys.executable, __file__, "--client", server.url, str(data), str(folder), name],
                stdout=subprocess.DEVNULL,
            )
            for name in EXAMPLES
        ]
        cpu = _watch(psutil.Process(server.process.pid), *clients)
        wall = time.monotonic() - started
        assert all(c.returncode == 0 for c in clients), "a Connect client failed"
        return {"wall_s": round(wall, 2), **cpu}
    finally:
        servers.stop(server)


def _watch(root: psutil.Process, *waited: subprocess.Popen[Any]) -> dict[str, float]:
    """CPU seconds of Spark's Python processes and of its JVM (``root`` or under it) from
    now until every ``waited`` process ended (each process's own, sampled every 0.2 s)."""

    def spark_processes() -> list[psutil.Process]:
        # A Connect server's root is its JVM; a local trial's is the driver's Python.
        own = [] if "python" in root.name() else [root]
        return own + root.children(recursive=True)

    before = {p.pid: _cpu(p) for p in spark_processes()}
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for process in spark_processes():
                try:
                    kind = "python" if "python" in process.name() else "jvm"
                    seen[process.pid] = (kind, _cpu(process) - before.get(process.pid, 0.0))
                except psutil.Error:
                    continue
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for process in waited:
        process.wait()
    done.set()
    sampler.join()
    python = [cpu for kind, cpu in seen.values() if kind == "python"]
    return {
        "python_cpu_s": round(sum(python), 2),
        "python_processes": len(python),
        "jvm_cpu_s": round(sum(cpu for kind, cpu in seen.values() if kind == "jvm"), 2),
    }


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(row[key] for row in rows) for key in rows[0]}


def _child(data: Path, folder: Path) -> None:
    """The local trial's process: its own local Spark, the three backlogs in turn."""
    from backlog_dagster.implementations import open_session

    spark = open_session("local[*]", app_name="bench-spark-home")
    for name in EXAMPLES:
        ours(spark, _fresh_sink(_example(data, name), folder, name), 0)
    spark.stop()


def _client(url: str, data: Path, folder: Path, name: str) -> None:
    """One Connect trial's client: one pipeline's backlog, as one run."""
    from backlog_dagster.implementations import open_session

    spark = open_session(url, app_name=f"bench-spark-home-{name}")
    ours(spark, _fresh_sink(_example(data, name), folder, name), 0)


def markdown(results: dict[str, Any]) -> str:
    medians = results["medians"]
    rows = []
    for mode, label in (("local", "local Spark, one process"), ("connect", "Connect, 3 clients")):
        for name in HOMES:
            m = medians[mode][name]
            rows.append(
                f"| {label} | {name} | {m['wall_s']:.1f} | {m['python_cpu_s']:.1f} "
                f"| {m['python_processes']:.0f} | {m['jvm_cpu_s']:.1f} |"
            )
    trials = json.dumps(
        {
            mode: {name: [r["python_cpu_s"] for r in rows_] for name, rows_ in by.items()}
            for mode, by in results["trials"].items()
        }
    )
    return f"""## Spark's Python processes by Spark home (`bench/spark_home.py`)

{results["date"][:10]}: the three example backlogs over {results["records"]:,}
reference records, `checkpoint_interval: 0`; *local*: one fresh process with its own
local Spark, the backlogs in turn; *Connect*: a fresh (not warmed up) Connect server and
three client processes at once. CPU of the Python processes Spark started and of its
JVM; Spark launched from the pyspark installation (whose zipped PySpark Spark puts
first on its Python processes' path) or from the launch home (`spark.home`).
{results["repeat"]} trials each, alternating, medians. {machine_line(results["machine"])}

| Spark | Spark home | wall (s) | Python processes' CPU (s) | Python processes | JVM CPU (s) |
| --- | --- | ---: | ---: | ---: | ---: |
{chr(10).join(rows)}

Python processes' CPU per trial: `{trials}`
"""


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _child(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["--client"]:
        _client(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5])
    else:
        main()
