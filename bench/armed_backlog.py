"""What arming the realtime query beside a backlog costs the backlog, on a local Spark.

    .venv/bin/python bench/armed_backlog.py [--records 8000000] [--repeat 5]

A backlog run that goes on as the realtime run arms its query as the backlog begins
(``phases.realtime.arm_beside``): on a shared server that hides the query's start, on a
local Spark (a driver per run, as shipped) its Python processes and first plans take
CPU the backlog, CPU-bound on two cores, would have used. Each trial is a process of
its own, as each run is: a new local driver, customer_totals' backlog over ``records``
(its example settings), with or without a query armed beside it as the backlog step
arms it; alternating, ``repeat`` times. Per variant the medians of the backlog's
seconds (markers to its last commit) and of the CPU seconds of the process and its
children (driver JVM, Python workers) over that time.

Writes ``bench/results/<date>-armed-backlog.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_line, publish
from run import _example, _fresh_sink, _topic, machine

VARIANTS = {"backlog alone": False, "a query armed beside it": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=8_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one-run", nargs=2, metavar=("DATA", "ARM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run is not None:
        print(json.dumps(one_run(Path(args.one_run[0]), args.one_run[1] == "armed")))
        return
    data = Path(tempfile.mkdtemp(prefix="bench-armed-backlog-"))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    try:
        _topic(data / "example" / "orders", args.records).close()
        for round_ in range(args.repeat):
            # Alternating, each variant first in every other round.
            order = list(VARIANTS.items())[:: 1 if round_ % 2 == 0 else -1]
            for name, armed in order:
                child = subprocess.run(
                    [sys.executable, __file__, "--one-run", str(data), "armed" if armed else "-"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                row = json.loads(child.stdout.strip().splitlines()[-1])
                assert row["records"] == args.records, row  # every trial read them all
                runs[name].append(row)
                print(
                    f"{round_ + 1}/{args.repeat} {name}: {row['backlog_s']:.2f} s, "
                    f"{row['cpu_s']:.1f} core-seconds",
                    flush=True,
                )
    finally:
        shutil.rmtree(data, ignore_errors=True)
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "records": args.records,
        "repeat": args.repeat,
        "variants": {
            name: {key: round(statistics.median(r[key] for r in rows), 2) for key in rows[0]}
            for name, rows in runs.items()
        },
        "runs": runs,
    }
    path = publish("armed-backlog", results, "armed_backlog.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def one_run(data: Path, armed: bool) -> dict[str, Any]:
    """One backlog in a new local driver; with ``armed``, a query armed beside it with
    the settings the backlog step gives it (``components.pipeline.settings_beside_backlog``)."""
    import psutil

    from backlog_dagster.components.assets import settings_beside_backlog
    from backlog_dagster.implementations import open_session
    from backlog_dagster.phases.backlog import run_backlog
    from backlog_dagster.phases.realtime import RealtimeRun, arm_beside
    from backlog_dagster.sink import open_sink

    def cpu_seconds() -> float:
        total = 0.0
        for process in [psutil.Process(), *psutil.Process().children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += sum(process.cpu_times()[:2])
        return total

    spark = open_session("local[*]", app_name="bench-armed-backlog")
    spark.sparkContext.setLogLevel("ERROR")
    config = _fresh_sink(_example(data), data, f"sink-{time.monotonic_ns()}")
    try:
        with ExitStack() as stack:
            cpu_before, started = cpu_seconds(), time.perf_counter()
            if armed:
                arm_beside(
                    stack,
                    spark,
                    config,
                    RealtimeRun(
                        checkpoint_dir=data / f"checkpoint-{time.monotonic_ns()}",
                        log=lambda _: None,
                    ),
                    run_id="bench",
                    session_settings=settings_beside_backlog(config, config.backlog, "local[*]"),
                )
            with open_sink(config) as sink:
                report = run_backlog(
                    spark,
                    config,
                    sink,
                    checkpoint_interval=config.backlog.checkpoint_interval,
                    log=lambda _: None,
                )
            seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu_before
    finally:
        spark.stop()
    return {"backlog_s": round(seconds, 3), "cpu_s": round(cpu, 2), "records": report.rows_read}


def _markdown(results: dict[str, Any]) -> str:
    rows = []
    for name, figures in results["variants"].items():
        samples = ", ".join(f"{r['backlog_s']:.2f}" for r in results["runs"][name])
        rows.append(f"| {name} | {figures['backlog_s']:.2f} ({samples}) | {figures['cpu_s']:.1f} |")
    table = "\n".join(rows)
    return f"""## A query armed beside a local backlog (`bench/armed_backlog.py`)

{results["date"][:10]}: customer_totals' backlog of {results["records"]:,} records, each
trial in a process of its own (a new local driver, as a run with a Spark per run has),
with and without its realtime query armed beside it as a backlog run that goes on as the
realtime run arms it; {results["repeat"]} trials per variant, alternating, medians.
{machine_line(results["machine"])}

| | backlog (s) (per trial) | CPU over the backlog (core-seconds) |
| --- | ---: | ---: |
{table}
"""


if __name__ == "__main__":
    main()
