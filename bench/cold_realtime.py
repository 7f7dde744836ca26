"""Realtime in a fresh Spark driver, as every realtime or standby run with a Spark per
run starts one: latency and the driver JVM's CPU while its JIT warms up, by JVM options.

    .venv/bin/python bench/cold_realtime.py [--seconds 40] [--repeat 3]

Each run is a process of its own (so a new driver JVM, from the class-data archive):
customer_totals' 100,000-record backlog, then realtime at 0.5 s micro-batches while
records are appended at 20,000 records/s for ``seconds``, as ``bench/realtime.py`` does
in a warm process. The JVM options are the driver's ``spark.driver.extraJavaOptions``,
given as a pipeline's ``realtime.spark_conf`` would give them. Per variant, alternating,
``repeat`` times: the medians of p99 and p50 latency, of the driver JVM's CPU seconds
while records were appended, and of its CPU seconds from its start to the end.

Writes ``bench/results/<date>-cold-realtime.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import warm_session
from report import machine_line, publish
from run import PRESETS, _latency_at, machine

#: Each variant's driver JVM options.
VARIANTS = {
    "as shipped (C1 and C2 JIT)": "",
    "C1 JIT only (-XX:TieredStopAtLevel=1)": "-XX:TieredStopAtLevel=1",
}
INTERVAL_S = 0.5
HEADER = (
    "| driver JVM | p50 (s) | p99 (s) (per run) | driver CPU while appending (s) "
    "| driver CPU from its start (s) |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--one-run", metavar="JAVA_OPTIONS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run is not None:
        print(json.dumps(one_run(args.one_run, args.seconds)))
        return
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for round_ in range(args.repeat):
        for name, options in VARIANTS.items():
            child = subprocess.run(
                [sys.executable, __file__, "--seconds", str(args.seconds), f"--one-run={options}"],
                capture_output=True,
                text=True,
                check=True,
            )
            row = json.loads(child.stdout.strip().splitlines()[-1])
            runs[name].append(row)
            print(
                f"{round_ + 1}/{args.repeat} {name}: p99 {row['p99_s']:.2f} s, driver CPU "
                f"{row['driver_cpu_live_s']:.1f} s live, {row['driver_cpu_s']:.1f} s in all",
                flush=True,
            )
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "interval_s": INTERVAL_S,
        "live_seconds": args.seconds,
        "repeat": args.repeat,
        "variants": {name: _medians(rows) for name, rows in runs.items()},
        "runs": runs,
    }
    path = publish("cold-realtime", results, "cold_realtime.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def one_run(java_options: str, seconds: float) -> dict[str, Any]:
    """One cold run in this process; the driver JVM's CPU sampled every second."""
    import psutil

    conf = {"spark.driver.extraJavaOptions": java_options} if java_options else {}
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def driver_cpu() -> float:
        jvms = [p for p in psutil.Process().children(recursive=True) if p.name() == "java"]
        return sum(p.cpu_times().user + p.cpu_times().system for p in jvms)

    def sample() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(psutil.Error):
                samples.append((time.monotonic(), driver_cpu()))

    with warm_session("bench-cold-realtime", conf) as (spark, scratch):
        threading.Thread(target=sample, daemon=True).start()
        preset = replace(PRESETS["default"], latency_seconds=seconds)
        row = _latency_at(spark, scratch, preset, INTERVAL_S)
        ended = time.monotonic()
        stop.set()
    # Records were appended during the last ``seconds`` before the row came back.
    live = [cpu for at, cpu in samples if at >= ended - seconds]
    return {
        "p50_s": row["p50_s"],
        "p99_s": row["p99_s"],
        "driver_cpu_live_s": round(live[-1] - live[0], 2),
        "driver_cpu_s": round(samples[-1][1], 2),
    }


def _medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    return {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}


def _markdown(results: dict[str, Any]) -> str:
    rows = []
    for name, figures in results["variants"].items():
        samples = ", ".join(f"{r['p99_s']:.2f}" for r in results["runs"][name])
        rows.append(
            f"| {name} | {figures['p50_s']:.2f} | {figures['p99_s']:.2f} ({samples}) | "
            f"{figures['driver_cpu_live_s']:.1f} | {figures['driver_cpu_s']:.1f} |"
        )
    table = "\n".join(rows)
    return f"""## Realtime in a fresh driver JVM (`bench/cold_realtime.py`)

{results["date"][:10]}: customer_totals, each run in a process of its own (a new driver JVM,
as each realtime run with a Spark per run starts one), a 100,000-record backlog, then
{results["interval_s"]:g} s micro-batches while records are appended at 20,000 records/s for
{results["live_seconds"]:g} s; {results["repeat"]} runs per variant, alternating, medians.
{machine_line(results["machine"])}

{HEADER}
| --- | ---: | ---: | ---: | ---: |
{table}
"""


if __name__ == "__main__":
    main()
