"""The sinks' small calls against another checkout's, in one run: what the state store on
SQLAlchemy Core costs where a call does little else.

    .venv/bin/python bench/sink_calls.py --baseline CHECKOUT [--repeat 3]
                                         [--postgres CONNINFO]

Per sink (SQLite, PostgreSQL) and per code (this checkout's, and ``--baseline``'s, a git
worktree of the commit before a change), each in a fresh process, alternating:

- *open*: what the sensor does for a pipeline every tick: open the sink, read the phase
  and the current generation, close it (median of 20);
- *small commit*: a micro-batch's commit of 200 keys' partials over 8 buckets (median
  of 50);
- *chunk commit*: a backlog chunk's commit of 100,000 keys, every one merged (median
  of 5).

Each figure is the median of ``--repeat`` processes' medians. Writes
``bench/results/<date>-sink-calls-against-<commit>.json`` and its section of
``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

KINDS = ("sqlite", "postgres")
CALLS = ("open", "small_commit", "chunk_commit")
LABELS = {
    "open": "open, phase, generation, close",
    "small_commit": "commit of 200 keys",
    "chunk_commit": "commit of 100,000 keys",
}


def main() -> None:
    # The test suite's PostgreSQL helpers live in tests/ (not in the timing processes,
    # whose code is the checkout's on their PYTHONPATH).
    sys.path.insert(0, str(ROOT))
    from report import machine_line, publish
    from run import machine

    from tests.postgres import SERVER, fresh_database

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, metavar="CHECKOUT")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", default=SERVER)
    args = parser.parse_args()
    baseline = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=args.baseline,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    codes = {"this": ROOT, "baseline": args.baseline.resolve()}
    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        kind: {code: [] for code in codes} for kind in KINDS
    }
    started = time.perf_counter()
    with fresh_database(args.postgres) as dsn:
        for rep in range(args.repeat):
            for kind in KINDS:
                for code, checkout in codes.items():
                    runs[kind][code].append(_calls(checkout, kind, dsn, f"{kind}_{code}_{rep}"))
    figures: dict[str, Any] = {
        "machine": machine(),
        "baseline": baseline,
        "repeat": args.repeat,
        "runs": runs,
        "medians": {
            kind: {
                code: {call: statistics.median(r[call] for r in rows) for call in CALLS}
                for code, rows in by_code.items()
            }
            for kind, by_code in runs.items()
        },
        "bench_seconds": round(time.perf_counter() - started, 1),
    }
    figures["machine_line"] = machine_line(figures["machine"])
    publish(f"sink-calls-against-{baseline}", figures, "sink_calls.py", markdown(figures))


def _calls(checkout: Path, kind: str, dsn: str, schema: str) -> dict[str, float]:
    """One fresh process of ``checkout``'s code timing the calls (outside the checkout,
    so that its folder does not shadow ``PYTHONPATH``)."""
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run(
        [sys.executable, __file__, "--calls", str(checkout), kind, dsn, schema],
        cwd=tempfile.gettempdir(),
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def time_calls(checkout: Path, kind: str, dsn: str, schema: str) -> dict[str, float]:
    """The three calls' medians (s) on a new sink of ``kind``, in this process."""
    import pyarrow as pa

    from backlog_dagster.pipeline.config import PipelineConfig
    from backlog_dagster.pipeline.load import load_pipeline
    from backlog_dagster.pipeline.paths import with_paths_under
    from backlog_dagster.sink import open_sink

    scratch = Path(tempfile.mkdtemp(prefix="bench-sink-calls-"))
    config = with_paths_under(
        load_pipeline(checkout / "definitions" / "defs" / "customer_totals" / "defs.yaml"),
        scratch,
    )
    sink: dict[str, Any] = {"kind": "sqlite", "path": str(scratch / "sink.sqlite")}
    if kind == "postgres":
        sink = {"kind": "postgres", "dsn": dsn, "schema": schema}
    sink["table"] = config.sink.table
    config = PipelineConfig.model_validate(config.model_dump(by_alias=True) | {"sink": sink})

    def partials(keys: int) -> pa.Table:
        return pa.table(
            {
                "customer_id": [f"c{k:06d}" for k in range(keys)],
                "total_amount": [float(k % 997) for k in range(keys)],
                "orders": pa.array([k % 13 + 1 for k in range(keys)], pa.int64()),
                "largest_amount": [float(k % 991) for k in range(keys)],
            }
        )

    with open_sink(config) as opened:
        generation = opened.start_generation({b: (0, 10**12) for b in range(8)}, "b", "b")
    seconds: dict[str, list[float]] = {call: [] for call in CALLS}
    for _ in range(20):
        began = time.perf_counter()
        with open_sink(config) as opened:
            opened.phase()
            opened.current_generation()
        seconds["open"].append(time.perf_counter() - began)
    at = dict.fromkeys(range(8), 0)
    with open_sink(config) as opened:
        for call, keys, times in (("small_commit", 200, 50), ("chunk_commit", 100_000, 5)):
            table = partials(keys)
            for _ in range(times):
                end = {b: offset + keys for b, offset in at.items()}
                began = time.perf_counter()
                opened.commit(generation.number, dict(at), end, table)
                seconds[call].append(time.perf_counter() - began)
                at = end
    return {call: statistics.median(times) for call, times in seconds.items()}


def markdown(figures: dict[str, Any]) -> str:
    medians, baseline = figures["medians"], figures["baseline"]
    lines = [
        f"## The sinks' small calls against {baseline} (`bench/sink_calls.py`)",
        "",
        f"Reproduce: `.venv/bin/python bench/sink_calls.py --baseline <checkout of "
        f"{baseline}>`. Machine: {figures['machine_line']}; PostgreSQL 15 on loopback. Each "
        f"figure: the median of {figures['repeat']} fresh processes' medians, the two codes "
        "alternating; the ratio is this code's time over the baseline's, in the same run.",
        "",
        "| sink | call | this code (ms) | baseline (ms) | ratio |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for kind in KINDS:
        for call in CALLS:
            mine, theirs = medians[kind]["this"][call], medians[kind]["baseline"][call]
            lines.append(
                f"| {kind} | {LABELS[call]} | {mine * 1000:,.1f} | {theirs * 1000:,.1f} "
                f"| {mine / theirs:.2f}x |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--calls"]:
        checkout, kind, dsn, schema = sys.argv[2:6]
        print(json.dumps(time_calls(Path(checkout), kind, dsn, schema)))
    else:
        sys.path.insert(0, str(ROOT / "bench"))
        main()
