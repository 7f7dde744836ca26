"""Backlog chunks against the checkpoint interval: how long each takes, what it costs.

    .venv/bin/python bench/chunks.py [--records 16000000] [--repeat 3]

The example's customer_totals backlog over the reference records (8 buckets), in one
warm Spark session (``local[*]``), at each checkpoint interval in ``INTERVALS``,
alternating, ``repeat`` times each, each into a fresh SQLite sink. Per interval: the
backlog's records/s (median) and its ratio to interval 0 (one chunk), and the chunks'
durations, from the start of a chunk's Spark job until the next chunk's could start (a
chunk commits beside the next one's job): their median and the share within ±50 % of the
interval, every chunk from the first to the last counted (a chunk that took under half
the interval reads on in another Spark job before it commits). Each positive interval's
run is followed by a *later run*: the same pipeline reset on its sink and read again,
its first chunk sized by the rate the run before left there (``phases.chunks``). The
same at 0 and 2 s into a PostgreSQL sink (a new database on the local server, dropped
afterwards), whose commit of a chunk takes several times SQLite's. And over every
SQLite Spark job of the positive intervals: the part of a job's time that does not
depend on its size, the rate beyond it; and the sink's commit of a chunk.

Writes ``bench/results/<date>-chunks.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import ours
from report import machine_line, publish
from run import _example, _fresh_sink, _topic, machine
from sinks import _on

from backlog_dagster.phases.chunks import MIN_CHUNK_S
from tests.postgres import SERVER, fresh_database

if TYPE_CHECKING:
    from backlog_dagster.pipeline.config import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent
INTERVALS = (0.0, 0.5, 2.0, 5.0)
#: The cases of a pipeline's later run, after its run on a fresh SQLite sink.
LATER = "later"
#: The intervals also run into PostgreSQL.
POSTGRES_INTERVALS = (0.0, 2.0)
HEADER = (
    "| interval | seconds (median) | records/s | over interval 0 | chunks per run "
    "| Spark jobs per run | chunk median (s) | chunks within ±50 % |"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=16_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-chunks-"))
    try:
        with fresh_database(SERVER) as dsn:
            results = measure(scratch, dsn, args.records, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = publish("chunks", results, "chunks.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def measure(scratch: Path, dsn: str, records: int, repeat: int) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    _topic(scratch / "example" / "orders", records).close()
    config = _example(scratch)
    spark = open_session("local[*]", app_name="bench-chunks")
    spark.sparkContext.setLogLevel("ERROR")
    ours(spark, _fresh_sink(config, scratch, "warm-up"), 0)
    plan = [("sqlite", i) for i in INTERVALS] + [("postgres", i) for i in POSTGRES_INTERVALS]
    # The cases in the order of the table: each interval's later run after its first.
    shown = [c for i in INTERVALS for c in [("sqlite", i), (LATER, i)] if c[0] == "sqlite" or i]
    shown += [("postgres", i) for i in POSTGRES_INTERVALS]
    runs: dict[tuple[str, float], list[dict[str, Any]]] = {case: [] for case in shown}
    for rep in range(repeat):
        for sink, interval in plan:
            name = f"{sink}_{interval:g}_{rep}".replace(".", "_")
            if sink == "sqlite":
                on = _fresh_sink(config, scratch, name)
            else:
                on = _on("postgres", scratch, dsn, name)
            run = ours(spark, on, interval)
            _note(runs, (sink, interval), run, records)
            if sink == "sqlite" and interval:
                _reset(on)
                _note(runs, (LATER, interval), ours(spark, on, interval), records)
    spark.stop()
    cases = {_label(*case): _case(case[1], runs[case], records) for case in shown}
    for (sink, _), case in zip(shown, cases.values(), strict=True):
        whole = cases[_label("sqlite" if sink == LATER else sink, 0.0)]["records_per_second"]
        case["over_interval_0"] = round(case["records_per_second"] / whole, 3)
    return {
        "records": records,
        "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "intervals": cases,
        "per_chunk": per_chunk([r for i in INTERVALS if i for r in runs["sqlite", i]]),
    }


def _note(
    runs: dict[tuple[str, float], list[dict[str, Any]]],
    case: tuple[str, float],
    run: dict[str, Any],
    records: int,
) -> None:
    assert run["records"] == records, run
    runs[case].append(run)
    durations = ", ".join(f"{s:.1f}" for _, s in run["chunks"])
    print(f"{case[0]}, interval {case[1]:g} s: {run['seconds']:.2f} s; chunks (s): {durations}")


def _reset(config: PipelineConfig) -> None:
    """Start the pipeline over on its sink: new markers, results cleared, and the
    sink's record of the run before (its chunk rate among it) kept."""
    from backlog_dagster.implementations import open_source
    from backlog_dagster.phases.markers import reset
    from backlog_dagster.sink import open_sink

    with open_sink(config) as sink, open_source(config) as topic:
        reset(sink, topic, config, "bench: a later run", lambda _: None)


def _label(sink: str, interval: float) -> str:
    return f"{interval:g}" if sink == "sqlite" else f"{interval:g}, {sink}"


def _row_name(label: str) -> str:
    interval, _, sink = label.partition(", ")
    return f"{interval} s" + {"": "", "postgres": ", PostgreSQL", LATER: ", later run"}[sink]


def per_chunk(runs: list[dict[str, Any]]) -> dict[str, float]:
    """What every Spark job pays whatever its size, and the rate beyond it: the line
    seconds = fixed + records / rate through every job of the runs, least squares;
    and the sink's commit of a chunk (median)."""
    records = [n for r in runs for n, _ in r["jobs"]]
    seconds = [s for r in runs for _, s in r["jobs"]]
    per_record, fixed = np.polyfit(records, seconds, 1)
    commits = [s for r in runs for s in r["chunk_commits_s"]]
    return {
        "fixed_s": round(float(fixed), 3),
        "records_per_s_beyond": round(1 / float(per_record)),
        "commit_median_s": round(statistics.median(commits), 3),
        "jobs": len(records),
    }


def _case(interval: float, runs: list[dict[str, Any]], records: int) -> dict[str, Any]:
    seconds = [round(r["seconds"], 2) for r in runs]
    median = statistics.median(seconds)
    durations = [s for r in runs for _, s in r["chunks"]]
    within = [s for s in durations if 0.5 * interval <= s <= 1.5 * interval]
    return {
        "samples_s": seconds,
        "median_s": median,
        "records_per_second": round(records / median),
        "chunks_per_run": [len(r["chunks"]) for r in runs],
        "jobs_per_run": [len(r["jobs"]) for r in runs],
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
            f"| {_row_name(name)} | {case['median_s']:.2f} | {case['records_per_second']:,} | "
            f"{case['over_interval_0']:.2f} | "
            f"{', '.join(str(n) for n in case['chunks_per_run'])} | "
            f"{', '.join(str(n) for n in case['jobs_per_run'])} | "
            f"{'-' if median is None else f'{median:.2f}'} | "
            f"{'-' if share is None else f'{share:.0%}'} |"
        )
    table = "\n".join(rows)
    fit = results["per_chunk"]
    return f"""## Chunks against the checkpoint interval

`bench/chunks.py`, {results["date"][:10]}: the example's customer_totals backlog over
{results["records"]:,} reference records (8 buckets), one warm Spark session, each
interval {results["repeat"]} times, alternating, into SQLite unless the row says
PostgreSQL (the local server; *over interval 0* is against the same sink's). A chunk's
time runs from the start of its first Spark job until the next chunk's could start (a
chunk commits while the next one's job runs); every chunk counts, the last one too. A
chunk that took under half the interval reads on in another job before it commits. A *later
run* follows each positive interval's run:
the pipeline reset on its sink and read again, its first chunk sized by the rate the run
before left there. A chunk is planned to take at least {MIN_CHUNK_S:g} s
(`phases.chunks.MIN_CHUNK_S`), so below that interval its chunks are not meant to be
within ±50 % of it. {machine_line(results["machine"])}

{HEADER}
| --- | ---: | ---: | ---: | --- | --- | ---: | ---: |
{table}

Every SQLite Spark job of the positive intervals ({fit["jobs"]}) on one line, least squares: a
job costs {fit["fixed_s"]:.2f} s whatever its size, then reads at
{fit["records_per_s_beyond"]:,} records/s; the sink's commit of a chunk takes
{fit["commit_median_s"]:.2f} s (median).
"""


if __name__ == "__main__":
    main()
