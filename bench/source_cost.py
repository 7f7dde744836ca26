"""What reading the source costs a realtime micro-batch on a shared Spark Connect server.

    .venv/bin/python bench/source_cost.py [--seconds 30] [--repeat 3]

Each run starts a fresh Connect server (``local[*]``) and runs three streaming queries
on it side by side, one per example pipeline's aggregation (per customer; per region and
minute; per region and day), each aggregating its micro-batch in ``foreachBatch`` and
collecting the result, triggered every 0.5 s, 10,000 records a micro-batch (20,000
records/s at 0.5 s). Records are appended to an embedded log at 20,000 records/s in
every variant, so the machine carries the same load. The variants differ only in where
the records come from:

- ``embedded log``: the project's ``bucketlog`` source (a Python data source: Spark
  hands each read to a Python worker, which returns Arrow record batches);
- ``JVM, through a Python worker``: Spark's ``rate-micro-batch`` source with the same
  columns, each batch passed through an identity ``mapInArrow``: the same hand-over to
  a Python worker and back, without the log;
- ``JVM``: the same source without the Python worker: what a micro-batch would cost with
  a source read inside the JVM.

Per variant: the job's time (the aggregation and collect in ``foreachBatch``, timed on
the server), the micro-batch's time (Spark's ``triggerExecution``), medians over the
query's micro-batches after a 20 s warm-up and then over the runs; the CPU of the
server's process tree. The variants alternate, ``repeat`` runs each.

Writes ``bench/results/<date>-source-cost.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dateutil.parser import isoparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_line, publish
from run import _tree_cpu_s, machine

from backlog_dagster.implementations import open_session
from backlog_dagster.log.topic import create_topic
from backlog_dagster.spark.servers import connect_server
from backlog_dagster.tools.workload import ORDERS_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

LIVE_RATE = 20_000
INTERVAL_S = 0.5
RECORDS_PER_BATCH = int(LIVE_RATE * INTERVAL_S)
WARM_UP_S = 20.0
BUCKETS = 8
VARIANTS = ("embedded log", "JVM, through a Python worker", "JVM")
#: The example pipelines' aggregations: grouping columns, and a window width if any.
SHAPES: dict[str, tuple[tuple[str, ...], str | None]] = {
    "customer_totals": (("customer_id",), None),
    "region_minutes": (("region",), "1 minute"),
    "region_daily": (("region",), "1 day"),
}
REGIONS = ("emea", "amer", "apac", "latam", "mena", "nordics", "dach", "anz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    scratch = Path(tempfile.mkdtemp(prefix="bench-source-cost-"))
    try:
        for round_ in range(args.repeat):
            for index, variant in enumerate(VARIANTS):
                row = one_run(variant, scratch / f"{round_}-{index}", args.seconds)
                runs[variant].append(row)
                print(
                    f"{variant}, run {round_ + 1}: job {row['job_ms']:.0f} ms, micro-batch "
                    f"{row['micro_batch_ms']:.0f} ms, {row['server_cores']:.2f} cores",
                    flush=True,
                )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "live_rate": LIVE_RATE,
        "records_per_micro_batch": RECORDS_PER_BATCH,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "variants": {name: summarize(rows) for name, rows in runs.items()},
        "runs": runs,
    }
    path = publish("source-cost", results, "source_cost.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def one_run(variant: str, folder: Path, seconds: float) -> dict[str, Any]:
    """One variant's three queries on a fresh server while records are appended."""
    import psutil

    topic = create_topic(
        folder / "orders", ORDERS_SCHEMA, timestamp_column="event_time", buckets=BUCKETS
    )
    topic.close()
    timings = folder / "jobs.jsonl"
    with connect_server(folder / "server") as server:
        spark = open_session(server.url, app_name="bench-source-cost")
        spark.conf.set("spark.sql.shuffle.partitions", "1")
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        producer = _produce(topic.path, WARM_UP_S + seconds + 10)
        try:
            queries = [
                _start(spark, variant, pipeline, topic.path, folder, timings) for pipeline in SHAPES
            ]
            time.sleep(WARM_UP_S)
            root = psutil.Process(server.process.pid)
            cpu_before, began = _tree_cpu_s(root), time.time()
            time.sleep(seconds)
            cores = (_tree_cpu_s(root) - cpu_before) / (time.time() - began)
            ended = time.time()
            progress = {q.name: [json.loads(p.json) for p in q.recentProgress] for q in queries}
            for query in queries:
                query.stop()
        finally:
            producer.terminate()
            producer.wait()
            spark.stop()
    jobs = [json.loads(line) for line in timings.read_text().splitlines()]
    per_query = {}
    for name in SHAPES:
        job_ms = [
            1000 * (j["end"] - j["start"])
            for j in jobs
            if j["query"] == name and began <= j["start"] <= ended
        ]
        batch_ms = [
            p["durationMs"]["triggerExecution"]
            for p in progress[name]
            if began <= _unix(p["timestamp"]) <= ended and _records(p) > 0
        ]
        per_query[name] = {
            "micro_batches": len(job_ms),
            "job_ms": statistics.median(job_ms),
            "micro_batch_ms": statistics.median(batch_ms),
        }
    return {
        "job_ms": statistics.median(q["job_ms"] for q in per_query.values()),
        "micro_batch_ms": statistics.median(q["micro_batch_ms"] for q in per_query.values()),
        "server_cores": round(cores, 3),
        "queries": per_query,
    }


def _start(
    spark: SparkSession, variant: str, pipeline: str, topic: Path, folder: Path, timings: Path
) -> StreamingQuery:
    records = _records_of(spark, variant, topic)
    keys, width = SHAPES[pipeline]
    return (
        records.writeStream.foreachBatch(_aggregate(pipeline, keys, width, str(timings)))
        .trigger(processingTime=f"{INTERVAL_S} seconds")
        .option("checkpointLocation", str(folder / "checkpoints" / pipeline))
        .queryName(pipeline)
        .start()
    )


def _records_of(spark: SparkSession, variant: str, topic: Path) -> DataFrame:
    from pyspark.sql import functions as F

    if variant == "embedded log":
        return (
            spark.readStream.format("bucketlog")
            .option("path", str(topic))
            .option("startingOffsets", "latest")
            .option("maxRecordsPerTrigger", RECORDS_PER_BATCH)
            .load()
        )
    number = F.col("value")
    regions = F.array(*(F.lit(r) for r in REGIONS))
    records = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", RECORDS_PER_BATCH)
        .load()
        .select(
            number.alias("order_id"),
            F.concat(F.lit("c"), (number * 7919 % 100_000).cast("string")).alias("customer_id"),
            F.element_at(regions, (number % len(REGIONS) + 1).cast("int")).alias("region"),
            (number % 10_000 / 100.0).alias("amount"),
            F.col("timestamp").alias("event_time"),
        )
    )
    if variant == "JVM":
        return records
    return records.mapInArrow(lambda batches: batches, records.schema)


def _aggregate(
    pipeline: str, keys: tuple[str, ...], width: str | None, timings: str
) -> Callable[[DataFrame, int], None]:
    """The ``foreachBatch`` function: aggregate, collect, and note how long that took
    (it runs on the server, in a Python process of the query's own)."""

    def aggregate(batch: DataFrame, batch_id: int) -> None:
        from pyspark.sql import functions as F

        started = time.time()
        groups = [F.col(k) for k in keys]
        if width is not None:
            groups.append(F.window("event_time", width))
        batch.groupBy(*groups).agg(F.sum("amount"), F.count("*")).collect()
        line = {"query": pipeline, "id": batch_id, "start": started, "end": time.time()}
        with open(timings, "a") as out:
            out.write(json.dumps(line) + "\n")

    return aggregate


def _produce(topic: Path, seconds: float) -> subprocess.Popen[bytes]:
    """``log produce`` appending live records; its output goes to a file beside the topic."""
    command = [str(Path(sys.executable).with_name("backlog-dagster")), "log", "produce"]
    command += [str(topic), "--records", "0", "--live-rate", str(LIVE_RATE)]
    command += ["--live-seconds", str(seconds)]
    with (topic.parent / "producer.log").open("wb") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)


def _unix(timestamp: str) -> float:
    return isoparse(timestamp.replace("Z", "+00:00")).timestamp()


def _records(progress: dict[str, Any]) -> int:
    return sum(source["numInputRows"] for source in progress["sources"])


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "job_ms": statistics.median(r["job_ms"] for r in rows),
        "job_ms_runs": [round(r["job_ms"]) for r in rows],
        "micro_batch_ms": statistics.median(r["micro_batch_ms"] for r in rows),
        "server_cores": statistics.median(r["server_cores"] for r in rows),
    }


def markdown(results: dict[str, Any]) -> str:
    variants = results["variants"]
    log_job = variants["embedded log"]["job_ms"]
    rows = "\n".join(
        f"| {name} | {v['job_ms']:.0f} ({', '.join(str(x) for x in v['job_ms_runs'])}) "
        f"| {v['job_ms'] / log_job:.2f} | {v['micro_batch_ms']:.0f} | {v['server_cores']:.2f} |"
        for name, v in variants.items()
    )
    return f"""## What reading the source costs a realtime micro-batch (`bench/source_cost.py`)

{results["date"][:10]}: three streaming queries on a fresh Spark Connect server, one per
example pipeline's aggregation, each aggregating and collecting its micro-batch in
`foreachBatch`; {results["records_per_micro_batch"]:,} records a micro-batch every {INTERVAL_S:g} s,
records appended to an embedded log at {results["live_rate"]:,} records/s in every variant
(the same load on the machine). The variants differ in where the records come from: the
embedded log (a Python data source); Spark's own `rate-micro-batch` source passed
through a Python worker (an identity `mapInArrow`); that source alone. Medians over
each query's micro-batches after a {WARM_UP_S:g} s warm-up, then over {results["repeat"]} runs per
variant, alternating. {machine_line(results["machine"])}

| records from | job (ms) (per run) | job / embedded log | micro-batch (ms) | server CPU (cores) |
| --- | ---: | ---: | ---: | ---: |
{rows}
"""


if __name__ == "__main__":
    main()
