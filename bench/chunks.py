"""Backlog chunks against the checkpoint interval: how long each takes, what it costs.

    .venv/bin/python bench/chunks.py [--records 16000000] [--repeat 3]

The example's customer_totals backlog over the reference records (8 buckets), in one
warm Spark session (``local[*]``), at each checkpoint interval in ``INTERVALS``,
alternating, ``repeat`` times each, each into a fresh SQLite sink. Per interval: the
backlog's records/s (median) and its ratio to interval 0 (one chunk), and the chunks'
durations, from the start of a chunk's Spark job to its commit: their median and the
share within ±50 % of the interval (the last chunk, which takes what is left, aside).

Writes ``bench/results/<date>-chunks.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import ours
from report import machine_line, publish
from run import _example, _fresh_sink, _topic, machine

ROOT = Path(__file__).resolve().parent.parent
INTERVALS = (0.0, 0.5, 2.0, 5.0)
HEADER = (
    "| interval | seconds (median) | records/s | over interval 0 | chunks per run "
    "| chunk median (s) | chunks within ±50 % |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=16_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-chunks-"))
    try:
        results = measure(scratch, args.records, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = publish("chunks", results, "chunks.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def measure(scratch: Path, records: int, repeat: int) -> dict[str, Any]:
    from backlog_dagster.spark.session import get_session

    _topic(scratch / "example" / "orders", records).close()
    config = _example(scratch)
    spark = get_session("local[*]", app_name="bench-chunks")
    spark.sparkContext.setLogLevel("ERROR")
    ours(spark, _fresh_sink(config, scratch, "warm-up"), 0)
    runs: dict[float, list[dict[str, Any]]] = {interval: [] for interval in INTERVALS}
    for rep in range(repeat):
        for interval in INTERVALS:
            run = ours(spark, _fresh_sink(config, scratch, f"{interval:g}-{rep}"), interval)
            assert run["records"] == records, run
            runs[interval].append(run)
            durations = ", ".join(f"{s:.1f}" for _, s in run["chunks"])
            print(f"interval {interval:g} s: {run['seconds']:.2f} s; chunks (s): {durations}")
    spark.stop()
    cases = {f"{interval:g}": _case(interval, runs[interval], records) for interval in INTERVALS}
    whole = cases["0"]["records_per_second"]
    for case in cases.values():
        case["over_interval_0"] = round(case["records_per_second"] / whole, 3)
    return {
        "records": records,
        "repeat": repeat,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "intervals": cases,
    }


def _case(interval: float, runs: list[dict[str, Any]], records: int) -> dict[str, Any]:
    seconds = [round(r["seconds"], 2) for r in runs]
    median = statistics.median(seconds)
    # Every chunk but each run's last, which takes what is left of the backlog.
    durations = [s for r in runs for _, s in r["chunks"][:-1]]
    within = [s for s in durations if 0.5 * interval <= s <= 1.5 * interval]
    return {
        "samples_s": seconds,
        "median_s": median,
        "records_per_second": round(records / median),
        "chunks_per_run": [len(r["chunks"]) for r in runs],
        "chunk_seconds": [[round(s, 2) for _, s in r["chunks"]] for r in runs],
        "chunk_median_s": round(statistics.median(durations), 2) if durations else None,
        "chunks_within_half_of_interval": (
            round(len(within) / len(durations), 2) if durations and interval else None
        ),
    }


def _markdown(results: dict[str, Any]) -> str:
    rows = []
    for name, case in results["intervals"].items():
        median = case["chunk_median_s"]
        share = case["chunks_within_half_of_interval"]
        rows.append(
            f"| {name} s | {case['median_s']:.2f} | {case['records_per_second']:,} | "
            f"{case['over_interval_0']:.2f} | "
            f"{', '.join(str(n) for n in case['chunks_per_run'])} | "
            f"{'-' if median is None else f'{median:.2f}'} | "
            f"{'-' if share is None else f'{share:.0%}'} |"
        )
    table = "\n".join(rows)
    return f"""## Chunks against the checkpoint interval

`bench/chunks.py`, {results["date"][:10]}: the example's customer_totals backlog over
{results["records"]:,} reference records (8 buckets), one warm Spark session, each
interval {results["repeat"]} times, alternating. A chunk's time runs from the start of
its Spark job to its commit; each run's last chunk, which takes what is left, is not
counted in the chunk columns. {machine_line(results["machine"])}

{HEADER}
| --- | ---: | ---: | ---: | --- | ---: | ---: |
{table}
"""


if __name__ == "__main__":
    main()
