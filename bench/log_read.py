"""Read rates of the log and its Spark source, beside ``spark.range`` in the same run.

    .venv/bin/python bench/log_read.py [--records 20000000] [--repeat 3]

Loads the reference backlog (``orders``, 8 buckets) into a fresh topic, then times,
``--repeat`` times each, and reports medians:

- the log alone: every bucket read into Arrow in this process (no Spark);
- the ``bucketlog`` source into a count (a pure scan through Spark);
- the ``bucketlog`` source into the ``customer_totals`` aggregation
  (per customer: sum, count and max of amount);
- ``spark.range`` of the same size into the same shape of aggregation
  (100,000 groups): what Spark does with no source cost at all.

Writes ``bench/results/log_read-<date>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from backlog_dagster.log import create_topic
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

RESULTS = Path(__file__).resolve().parent / "results"


def timed(work: Callable[[], object], repeat: int) -> list[float]:
    seconds = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - started)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000_000)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="log-read-"))
    try:
        topic = create_topic(
            scratch / "orders",
            ORDERS_SCHEMA,
            timestamp_column=ORDERS_TIMESTAMP,
            buckets=args.buckets,
        )
        started = time.perf_counter()
        produce_backlog(topic, args.records, days=5)
        append_seconds = time.perf_counter() - started
        size = sum(info.size_bytes for info in topic.describe())
        print(
            f"appended {args.records:,} records in {append_seconds:.1f} s ({size / 2**20:,.0f} MiB)"
        )

        def read_log() -> None:
            rows = 0
            for bucket, bounds in topic.bounds().items():
                for batch in topic.read(bucket, bounds.earliest, bounds.latest):
                    rows += batch.num_rows
            assert rows == args.records

        from pyspark.sql import functions as F

        from backlog_dagster.implementations import open_session

        spark = open_session(args.master, app_name="bench-log-read")
        spark.sparkContext.setLogLevel("ERROR")
        orders = spark.read.format("bucketlog").option("path", str(topic.path)).load()
        aggregates = (F.sum("amount"), F.count("*"), F.max("amount"))

        def spark_count() -> None:
            assert orders.count() == args.records

        def spark_totals() -> None:
            orders.groupBy("customer_id").agg(*aggregates).write.format("noop").mode(
                "overwrite"
            ).save()

        def spark_range() -> None:
            (
                spark.range(args.records)
                .select((F.col("id") % 100_000).alias("customer_id"), F.rand(1).alias("amount"))
                .groupBy("customer_id")
                .agg(*aggregates)
                .write.format("noop")
                .mode("overwrite")
                .save()
            )

        spark_count()  # warm the Python workers once, as a long-running job would have
        cases = {
            "log_read_arrow": read_log,
            "spark_source_count": spark_count,
            "spark_source_customer_totals": spark_totals,
            "spark_range_same_aggregation": spark_range,
        }
        figures = {}
        for name, work in cases.items():
            seconds = timed(work, args.repeat)
            median = statistics.median(seconds)
            figures[name] = {
                "seconds": seconds,
                "median_seconds": median,
                "records_per_second": args.records / median,
            }
            print(
                f"{name:32} {args.records / median:>14,.0f} records/s "
                f"(median of {args.repeat}: {median:.2f} s)"
            )
        figures["ratio_source_totals_to_range"] = (
            figures["spark_source_customer_totals"]["records_per_second"]
            / figures["spark_range_same_aggregation"]["records_per_second"]
        )
        print(
            f"source aggregation / spark.range aggregation: "
            f"{figures['ratio_source_totals_to_range']:.2f}"
        )
        spark.stop()
        topic.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    report = {
        "benchmark": "log_read",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "records": args.records,
        "buckets": args.buckets,
        "repeat": args.repeat,
        "master": args.master,
        "append_seconds": append_seconds,
        "log_bytes": size,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "figures": figures,
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"log_read-{datetime.now(timezone.utc):%Y-%m-%d}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out.relative_to(RESULTS.parent.parent)}")


if __name__ == "__main__":
    main()
