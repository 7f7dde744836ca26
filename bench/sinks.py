"""The two sinks side by side, in one run: SQLite (embedded) and PostgreSQL (a server).

    .venv/bin/python bench/sinks.py [--records 4000000] [--keys 100000] [--repeat 5]
                                    [--postgres CONNINFO]

1. The commit of one chunk of ``--keys`` partial results (``customer_totals``' columns:
   sum, count and max per customer) with its progress: into an empty results table
   (every key new), into one that holds every key already (every key merged), and the
   same four times more (every key merged again, as each chunk of a backlog over few
   keys does). Medians of ``--repeat`` commits each, the sinks interleaved; PostgreSQL
   also with its results table's pages filled full (fillfactor 100, the server's
   default, as before ``RESULTS_FILLFACTOR``), the baseline in the same run.
2. The ``customer_totals`` backlog phase over ``--records`` records of the reference
   workload (8 buckets), checkpoint interval 0, into each sink: medians of three runs,
   interleaved, in one Spark session warmed up first.

The PostgreSQL sink writes to a new database on the server ``--postgres`` names
(default: the local one, as user postgres), dropped afterwards. Writes
``bench/results/sinks-<date>.json`` and the section between its markers in
``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import page
import pyarrow as pa
from cases import ours
from report import machine_line
from run import machine

from backlog_dagster.log import create_topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.pipeline.paths import with_paths_under
from backlog_dagster.sink import open_sink
from backlog_dagster.sink import postgres as postgres_sink
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the test suite's PostgreSQL helpers live in tests/

from tests.postgres import SERVER, fresh_database  # noqa: E402

RESULTS = ROOT / "bench" / "results"
EXAMPLE = ROOT / "definitions" / "defs" / "customer_totals" / "defs.yaml"
KINDS = ("sqlite", "postgres")
LABELS = {
    "sqlite": "sqlite",
    "postgres": f"postgres (fillfactor {postgres_sink.RESULTS_FILLFACTOR})",
    "postgres_fillfactor_100": "postgres, pages filled full (fillfactor 100: before)",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--postgres", default=SERVER)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-sinks-"))
    started = time.perf_counter()
    try:
        with fresh_database(args.postgres) as dsn:
            configs = {
                kind: _on(kind.split("_")[0], scratch, dsn, f"commits_{kind}")
                for kind in COMMIT_KINDS
            }
            figures: dict[str, Any] = {
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": machine(),
                "settings": vars(args) | {"postgres": "(server named on the command line)"},
                "commit": commits(configs, args.keys, args.repeat),
                "backlog": backlogs(scratch, dsn, args.records),
            }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    figures["bench_seconds"] = round(time.perf_counter() - started, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"sinks-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    path.write_text(json.dumps(figures, indent=2) + "\n")
    page.write()
    print(f"wrote {path.relative_to(ROOT)} and BENCHMARKS.md in {figures['bench_seconds']:.0f} s")


def _on(kind: str, scratch: Path, dsn: str, name: str) -> PipelineConfig:
    """The example's customer_totals pipeline, on a topic under ``scratch``, into a new
    sink of ``kind`` (an SQLite file or a PostgreSQL schema called ``name``)."""
    config = with_paths_under(load_pipeline(EXAMPLE), scratch)
    if kind == "sqlite":
        path = str(scratch / f"{name}.sqlite")
        return config.model_copy(update={"sink": config.sink.model_copy(update={"path": path})})
    sink = {"kind": "postgres", "dsn": dsn, "schema": name, "table": config.sink.table}
    return PipelineConfig.model_validate(config.model_dump(by_alias=True) | {"sink": sink})


# -- 1. one chunk's commit ---------------------------------------------------------------


#: The commits' sinks: each kind, and PostgreSQL with full pages as the baseline.
FULL_PAGES = "postgres_fillfactor_100"
COMMIT_KINDS = (*KINDS, FULL_PAGES)
#: Each sink's commits in a row: the first makes every key, the rest merge into all.
COMMITS = ("new", "merged", *("merged again",) * 4)


def commits(configs: dict[str, PipelineConfig], keys: int, repeat: int) -> dict[str, Any]:
    chunk = _partials(keys)
    seconds: dict[str, dict[str, list[float]]] = {
        k: {what: [] for what in COMMITS} for k in configs
    }
    for _ in range(repeat):
        for kind, config in configs.items():
            with fillfactor(100 if kind == FULL_PAGES else None), open_sink(config) as sink:
                markers = {0: (0, len(COMMITS) * keys)}
                generation = sink.start_generation(markers, "bench", "bench").number
                for index, what in enumerate(COMMITS):
                    start = index * keys
                    began = time.perf_counter()
                    sink.commit(generation, {0: start}, {0: start + keys}, chunk)
                    seconds[kind][what].append(time.perf_counter() - began)
    result: dict[str, Any] = {"keys": keys, "repeat": repeat}
    for kind, times in seconds.items():
        result[kind] = {what: round(statistics.median(t), 4) for what, t in times.items()}
        result[kind]["all"] = times
        print(
            f"commit of {keys:,} keys into {kind}: {result[kind]['new']:.3f} s new, "
            f"{result[kind]['merged']:.3f} s merged, "
            f"{result[kind]['merged again']:.3f} s merged again"
        )
    return result


@contextlib.contextmanager
def fillfactor(percent: int | None) -> Iterator[None]:
    """PostgreSQL results tables made in the block with pages filled to ``percent``
    (None: as the sink makes them)."""
    if percent is None:
        yield
        return
    shipped = postgres_sink.RESULTS_FILLFACTOR
    postgres_sink.RESULTS_FILLFACTOR = percent
    try:
        yield
    finally:
        postgres_sink.RESULTS_FILLFACTOR = shipped


def _partials(keys: int) -> pa.Table:
    """``customer_totals``' partial results for ``keys`` customers, as the backlog makes them."""
    return pa.table(
        {
            "customer_id": pa.array([f"c{k:06d}" for k in range(keys)]),
            "total_amount": pa.array([float(k % 997) * 1.5 for k in range(keys)]),
            "orders": pa.array([k % 13 + 1 for k in range(keys)], pa.int64()),
            "largest_amount": pa.array([float(k % 991) for k in range(keys)]),
        }
    )


# -- 2. the backlog ----------------------------------------------------------------------


def backlogs(scratch: Path, dsn: str, records: int) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    topic_path = Path(_on("sqlite", scratch, dsn, "warm-up").source.path)
    with create_topic(
        topic_path, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=8
    ) as topic:
        produce_backlog(topic, records, days=5)
    spark = open_session("local[*]", app_name="bench-sinks")
    spark.sparkContext.setLogLevel("ERROR")
    ours(spark, _on("sqlite", scratch, dsn, "warm_up"), 0)  # Python workers and JIT warm
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for rep in range(3):
        for kind in KINDS:
            result = ours(spark, _on(kind, scratch, dsn, f"backlog_{rep}"), 0)
            assert result["records"] == records
            runs[kind].append(result["seconds"])
            print(f"backlog of {records:,} records into {kind}: {result['seconds']:.2f} s")
    spark.stop()
    return {
        "records": records,
        **{
            kind: {
                "seconds": round(statistics.median(times), 2),
                "records_per_second": round(records / statistics.median(times)),
                "all": times,
            }
            for kind, times in runs.items()
        },
    }


def _markdown(figures: dict[str, Any], path: Path) -> str:
    commit, backlog = figures["commit"], figures["backlog"]
    lite, pg = backlog["sqlite"], backlog["postgres"]
    lines = [
        "## The sinks side by side (`bench/sinks.py`)",
        "",
        f"Reproduce: `.venv/bin/python bench/sinks.py`. Latest run: {figures['date']}, "
        f"{machine_line(figures['machine'])}; PostgreSQL 15 on the same machine "
        "(loopback); it took "
        f"{figures['bench_seconds'] / 60:.1f} minutes. Raw figures: "
        f"`{path.relative_to(ROOT)}`.",
        "",
        f"### One chunk's commit: {commit['keys']:,} keys of `customer_totals` partials "
        f"(median of {commit['repeat']})",
        "",
        "| sink | every key new | every key merged | every key merged again |",
        "| --- | ---: | ---: | ---: |",
    ]
    for kind in COMMIT_KINDS:
        figures_of = commit[kind]
        lines.append(
            f"| {LABELS[kind]} | {figures_of['new']:.3f} s | {figures_of['merged']:.3f} s "
            f"| {figures_of['merged again']:.3f} s |"
        )
    lines += [
        "",
        f"### The `customer_totals` backlog of {backlog['records']:,} records "
        "(checkpoint interval 0, median of 3)",
        "",
        "| sink | seconds | records/s |",
        "| --- | ---: | ---: |",
        f"| sqlite | {lite['seconds']:.2f} | {lite['records_per_second']:,} |",
        f"| postgres | {pg['seconds']:.2f} | {pg['records_per_second']:,} |",
        "",
        f"PostgreSQL / SQLite backlog time: {pg['seconds'] / lite['seconds']:.2f}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
