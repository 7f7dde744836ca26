"""A Spark Connect server warmed up at its start against one that is not: the first
pipelines' realtime latency on it.

    .venv/bin/python bench/warm_server.py [--seconds 40] [--repeat 3] [--warm-up 60]

Each run starts a fresh Connect server (``local[*]``), warmed up as ``backlog-dagster
spark connect-server`` does (``tools.sample_run.warm_up_server``, ``--warm-up`` seconds of
sample realtime) or not, then runs the three example pipelines' realtime queries side
by side from one client: a 100,000-record backlog each, then 0.5 s micro-batches while
records are appended at 20,000 records/s for ``seconds``. Per run: p99 of append to
visible result (every pipeline's records, and each one's), and the CPU of this process
and its children (the server, its Python workers) while records were appended; and how
long the server took to be up. The two variants alternate, ``repeat`` runs each; medians.

Writes ``bench/results/<date>-warm-server.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import realtime
from report import machine_line, publish
from run import EXAMPLES, PRESETS, _latency_at, machine

from backlog_dagster.implementations import open_session
from backlog_dagster.spark.servers import connect_server
from backlog_dagster.tools.sample_run import DEFAULT_WARM_UP_S

INTERVAL_S = 0.5
HEADER = (
    f"| server | up in (s) | p50 (s) | p99 (s) (per run) | p99 {' / '.join(EXAMPLES)} (s) "
    "| CPU while appending (cores) |\n| --- | ---: | ---: | ---: | ---: | ---: |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warm-up", type=float, default=DEFAULT_WARM_UP_S)
    args = parser.parse_args()
    preset = dataclasses.replace(PRESETS["default"], latency_seconds=args.seconds)
    variants = {"unwarmed": 0.0, "warmed up": args.warm_up}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    scratch = Path(tempfile.mkdtemp(prefix="bench-warm-server-"))
    try:
        for round_ in range(args.repeat):
            for name, warm_up_s in variants.items():
                folder = scratch / f"{round_}-{warm_up_s:g}"
                started = time.monotonic()
                with connect_server(folder / "server", warm_up_s=warm_up_s, log=print) as server:
                    up_s = time.monotonic() - started
                    spark = open_session(server.url, app_name="bench-warm-server")
                    try:
                        row = _latency_at(
                            spark, folder, preset, INTERVAL_S, name="latency", pipelines=EXAMPLES
                        )
                    finally:
                        spark.stop()
                row["server_up_s"] = round(up_s, 1)
                runs[name].append(row)
                print(f"{name} run {round_ + 1}: p99 {row['p99_s']:.3f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "live_rate": preset.live_rate,
        "seconds": args.seconds,
        "warm_up_s": args.warm_up,
        "repeat": args.repeat,
        "variants": {name: summarize(rows) for name, rows in runs.items()},
        "runs": {
            name: [{k: v for k, v in row.items() if not k.startswith("histogram")} for row in rows]
            for name, rows in runs.items()
        },
    }
    path = publish("warm-server", results, "warm_server.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``bench/realtime.py``'s medians over runs, and the server's time to be up."""
    return {
        **realtime.summarize(rows),
        "server_up_s": statistics.median(r["server_up_s"] for r in rows),
    }


def markdown(results: dict[str, Any]) -> str:
    variants = results["variants"]
    rows = "\n".join(
        f"| {name} | {v['server_up_s']:.0f} | {v['p50_s']:.2f} | {v['p99_s']:.2f} "
        f"({', '.join(f'{x:.2f}' for x in v['p99_s_runs'])}) | "
        + ", ".join(f"{v['p99_s_by_pipeline'][p]:.2f}" for p in EXAMPLES)
        + f" | {v['cpu_cores']:.2f} |"
        for name, v in variants.items()
    )
    return f"""## A Spark Connect server warmed up at its start (`bench/warm_server.py`)

{results["date"][:10]}: a fresh Connect server per run, warmed up for
{results["warm_up_s"]:g} s of sample realtime (after a sample backlog) or not, then the
three example pipelines' realtime queries side by side from one client at
{INTERVAL_S:g} s micro-batches, records appended at {results["live_rate"]:,} records/s
for {results["seconds"]:g} s after a 100,000-record backlog each; latency is a record's
append to its result being visible in the SQLite sink. {results["repeat"]} runs per
variant, alternating, medians. {machine_line(results["machine"])}

{HEADER}
{rows}
"""


if __name__ == "__main__":
    main()
