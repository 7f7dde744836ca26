"""Apache Flink as a peer: the same records and aggregation, batch and streaming mode.

    .venv/bin/python bench/flink.py [--records 4000000] [--repeat 3]

The reference ``orders`` records (8 buckets) go into a topic of the embedded log and,
the same records, into CSV files (one a bucket). In one run, each ``repeat`` times after
a warm-up, medians:

- ours: the example's customer_totals backlog (``checkpoint_interval`` 0) from the log
  into a fresh SQLite sink, in a warm Spark session (``local[*]``);
- Flink batch: PyFlink's Table API in batch mode (a local mini-cluster in the same
  process, parallelism = cores), ``SELECT customer_id, sum, count, max … GROUP BY``
  over the CSV files, its rows taken to Python (``to_pandas``: Arrow batches) and
  written to SQLite as ours are;
- Flink streaming: the same query in streaming mode (mini-batch aggregation on, as
  Flink's docs advise for throughput), into Flink's ``blackhole`` sink: the changelog
  a streaming aggregation emits is not written anywhere, so this bounds Flink's
  streaming rate from above.

PyFlink (``apache-flink`` from PyPI, no cluster) pins its own pandas, pyarrow and
numpy, so it runs from a virtual environment of its own, made on the first run under
``bench/.flink-venv`` (a few minutes, about 1 GB). Writes
``bench/results/<date>-flink.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FLINK_VENV = HERE / ".flink-venv"
FLINK_VERSION = "2.3.0"
QUERY = (
    "SELECT customer_id, SUM(amount) AS total_amount, COUNT(*) AS orders, "
    "MAX(amount) AS largest_amount FROM orders GROUP BY customer_id"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--flink-child", metavar="CSV_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flink_child:
        print(json.dumps(flink_runs(Path(args.flink_child), args.repeat)))
        return
    python = flink_python()
    scratch = Path(tempfile.mkdtemp(prefix="bench-flink-"))
    try:
        results = measure(scratch, args.records, args.repeat, python)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    from report import publish

    path = publish("flink", results, "flink.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def flink_python() -> Path:
    """The Flink venv's Python, made on first use."""
    python = FLINK_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {FLINK_VENV} with apache-flink {FLINK_VERSION} (once; a few minutes)")
        subprocess.run([sys.executable, "-m", "venv", str(FLINK_VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", f"apache-flink=={FLINK_VERSION}"],
            check=True,
        )
    return python


def measure(scratch: Path, records: int, repeat: int, python: Path) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from cases import ours
    from report import backlog_cases
    from run import _example, _fresh_sink, _topic, machine

    from backlog_dagster.implementations import open_session

    topic = _topic(scratch / "example" / "orders", records)
    csv_dir = scratch / "csv"
    export_csv(topic, csv_dir)
    topic.close()
    config = _example(scratch)
    spark = open_session("local[*]", app_name="bench-flink-peer")
    spark.sparkContext.setLogLevel("ERROR")
    ours(spark, _fresh_sink(config, scratch, "warm-up"), 0)
    samples: list[float] = []
    for rep in range(repeat):
        run = ours(spark, _fresh_sink(config, scratch, f"ours-{rep}"), 0)
        assert run["records"] == records, run
        samples.append(round(run["seconds"], 2))
        print(f"ours: {records:,} records in {samples[-1]:.2f} s", flush=True)
    spark.stop()
    child = subprocess.run(
        [str(python), __file__, "--flink-child", str(csv_dir), "--repeat", str(repeat)],
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    flink = json.loads(child.stdout.strip().splitlines()[-1])
    cases = backlog_cases(
        {"ours": samples, "flink_batch": flink["batch"], "flink_streaming": flink["streaming"]},
        records,
    )
    return {
        "records": records,
        "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "flink": {"version": flink["version"], "parallelism": flink["parallelism"]},
        "backlog": cases,
    }


def export_csv(topic: Any, folder: Path) -> None:
    """Every record of ``topic`` as CSV, a file a bucket; times as Flink reads them."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pa_csv

    folder.mkdir(parents=True)
    for bucket, bounds in topic.bounds().items():
        batches = list(topic.read(bucket, bounds.earliest, bounds.latest))
        table = pa.Table.from_batches(batches)
        when = pc.strftime(table["event_time"], format="%Y-%m-%d %H:%M:%S")
        table = table.set_column(table.schema.get_field_index("event_time"), "event_time", when)
        options = pa_csv.WriteOptions(include_header=False, quoting_style="none")
        pa_csv.write_csv(table, folder / f"bucket-{bucket}.csv", options)


def flink_runs(csv_dir: Path, repeat: int) -> dict[str, Any]:
    """In the Flink venv: a warm-up, then ``repeat`` batch and streaming runs (seconds)."""
    from pyflink.table import EnvironmentSettings, TableEnvironment
    from pyflink.version import __version__

    parallelism = os.cpu_count() or 1

    def environment(batch: bool) -> Any:
        settings = (
            EnvironmentSettings.in_batch_mode()
            if batch
            else EnvironmentSettings.in_streaming_mode()
        )
        env = TableEnvironment.create(settings)
        config = env.get_config()
        config.set("parallelism.default", str(parallelism))
        if not batch:
            config.set("table.exec.mini-batch.enabled", "true")
            config.set("table.exec.mini-batch.allow-latency", "1 s")
            config.set("table.exec.mini-batch.size", "5000")
        env.execute_sql(
            "CREATE TABLE orders (order_id BIGINT, customer_id STRING, region STRING, "
            "amount DOUBLE, event_time TIMESTAMP(6)) WITH ('connector' = 'filesystem', "
            f"'path' = '{csv_dir.as_uri()}', 'format' = 'csv')"
        )
        env.execute_sql(
            "CREATE TABLE totals (customer_id STRING, total_amount DOUBLE, orders BIGINT, "
            "largest_amount DOUBLE) WITH ('connector' = 'blackhole')"
        )
        return env

    def batch_run(env: Any, sink: Path) -> float:
        started = time.perf_counter()
        frame = env.sql_query(QUERY).to_pandas()  # Arrow batches, not a row at a time
        values = list(frame.itertuples(index=False, name=None))
        with sqlite3.connect(sink) as db:
            db.execute(
                "CREATE TABLE customer_totals (customer_id TEXT PRIMARY KEY, total_amount REAL, "
                "orders INTEGER, largest_amount REAL)"
            )
            db.executemany("INSERT INTO customer_totals VALUES (?, ?, ?, ?)", values)
        return round(time.perf_counter() - started, 2)

    def streaming_run(env: Any) -> float:
        started = time.perf_counter()
        env.execute_sql(f"INSERT INTO totals {QUERY}").wait()
        return round(time.perf_counter() - started, 2)

    work = Path(tempfile.mkdtemp(prefix="flink-sinks-"))
    batch_env, streaming_env = environment(True), environment(False)
    batch_run(batch_env, work / "warm-up.sqlite")
    streaming_run(streaming_env)
    batch, streaming = [], []
    for rep in range(repeat):
        batch.append(batch_run(batch_env, work / f"batch-{rep}.sqlite"))
        streaming.append(streaming_run(streaming_env))
        print(f"flink: batch {batch[-1]:.2f} s, streaming {streaming[-1]:.2f} s", file=sys.stderr)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "version": __version__,
        "parallelism": parallelism,
        "batch": batch,
        "streaming": streaming,
    }


def _markdown(results: dict[str, Any]) -> str:
    sys.path.insert(0, str(HERE))
    from report import case_rows, machine_line

    cases = results["backlog"]
    rows = case_rows(
        [
            ("ours: backlog phase, from the log into SQLite", cases["ours"]),
            ("Flink batch mode, CSV files, rows into SQLite", cases["flink_batch"]),
            ("Flink streaming mode, CSV files, into blackhole", cases["flink_streaming"]),
        ]
    )
    ours = cases["ours"]["records_per_second"]
    batch = cases["flink_batch"]["records_per_second"]
    streaming = cases["flink_streaming"]["records_per_second"]
    return f"""## Apache Flink as a peer (`bench/flink.py`)

{results["date"][:10]}: {results["records"]:,} reference records, `customer_totals`'
aggregation (sum, count and max per customer), each case {results["repeat"]} times after a
warm-up, in warm processes. PyFlink {results["flink"]["version"]} (a local mini-cluster,
parallelism {results["flink"]["parallelism"]}). {machine_line(results["machine"])}

| how | samples (s) | median (s) | records/s |
| --- | --- | --- | --- |
{rows}

Ours over Flink batch: **{ours / batch:.2f}x**; over Flink streaming: **{ours / streaming:.2f}x**.
Flink reads CSV files, ours the embedded log (read in Spark's JVM); the
streaming case writes its changelog nowhere, so it is an upper bound for Flink.
"""


if __name__ == "__main__":
    main()
