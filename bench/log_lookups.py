"""A realtime micro-batch's look-ups in a bucket that live appends cut into many blobs.

    .venv/bin/python bench/log_lookups.py [--blobs 3000 30000] [--repeat 200]

Each realtime micro-batch asks every bucket for the latest record time of its range
(``Bucket.max_record_time``) and, with windows, for the record time as it stood before
the first unread append (``Bucket.arrivals``). The live producer appends a blob per
bucket every 0.1 s, so a bucket has 36,000 more of them an hour. Here: one bucket with
a 25,000-record backlog blob, then 250-record appends (20,000 records/s over 8 buckets,
every 0.1 s) until it holds each ``--blobs`` count; at each, both look-ups near the
bucket's end, as the log answers them, beside the queries they were before (their SQL
run on the same file, in the same run): medians of ``--repeat``.

Writes ``bench/results/<date>-log-lookups.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine_line, publish
from run import machine

from backlog_dagster.log import create_topic
from backlog_dagster.log.bucket import Bucket
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

#: The look-ups as they were before, on a range's lower bound no index serves and a
#: maximum over the arrival index up to the moment.
BEFORE_RANGE = (
    "SELECT first_offset, record_count, max_time_us FROM blobs "
    "WHERE first_offset + record_count > ? AND first_offset < ?"
)
BEFORE_AS_IT_STOOD = "SELECT max(max_time_us), max(appended_at) FROM blobs WHERE appended_at < ?"
#: Records per live append to one bucket: 20,000 records/s over 8 buckets, every 0.1 s.
APPEND_RECORDS = 250


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blobs", type=int, nargs="+", default=[3_000, 30_000])
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-log-lookups-") as scratch:
        topic = create_topic(
            Path(scratch) / "orders", ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=1
        )
        produce_backlog(topic, 25_000, days=1)
        bucket = topic.bucket(0)
        one = next(iter(topic.read(0, 0, APPEND_RECORDS)))
        bucket._db.execute("PRAGMA synchronous=OFF")  # only to build the bucket sooner
        for target in sorted(args.blobs):
            while _blobs(bucket) < target:
                topic.append(0, one)
            rows.append(_lookups(bucket, args.repeat))
            print(rows[-1], flush=True)
        topic.close()
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "repeat": args.repeat,
        "rows": rows,
    }
    path = publish("log-lookups", results, "log_lookups.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def _blobs(bucket: Bucket) -> int:
    return int(bucket._db.execute("SELECT count(*) FROM blobs").fetchone()[0])


def _lookups(bucket: Bucket, repeat: int) -> dict[str, Any]:
    """Median ms of each look-up near the bucket's end, now and as it was before."""
    latest = bucket.bounds().latest
    start, end = latest - 4 * APPEND_RECORDS, latest
    since = bucket.append_time(start)
    assert since is not None

    def median_ms(work: Callable[[], object]) -> float:
        seconds = []
        for _ in range(repeat):
            began = time.perf_counter()
            work()
            seconds.append(time.perf_counter() - began)
        return round(statistics.median(seconds) * 1000, 3)

    return {
        "blobs": _blobs(bucket),
        "range_ms": median_ms(lambda: bucket.max_record_time(start, end)),
        "range_before_ms": median_ms(
            lambda: bucket._db.execute(BEFORE_RANGE, (start, end)).fetchall()
        ),
        "as_it_stood_ms": median_ms(lambda: bucket.arrivals(since, since)),
        "as_it_stood_before_ms": median_ms(
            lambda: bucket._db.execute(BEFORE_AS_IT_STOOD, (since,)).fetchone()
        ),
    }


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "## A micro-batch's look-ups in a bucket of many blobs (`bench/log_lookups.py`)",
        "",
        f"{machine_line(results['machine'])}; {results['date']}. One bucket: a "
        f"25,000-record blob, then {APPEND_RECORDS}-record appends (the live producer's, "
        "at 20,000 records/s over 8 buckets) up to each count of blobs; each look-up "
        "near the bucket's end, now and as the query was before (its SQL on the same "
        f"file), medians of {results['repeat']}. A micro-batch makes each once per "
        "bucket; the producer adds 36,000 blobs a bucket an hour.",
        "",
        "| blobs | a range's latest record time (ms) | before (ms) "
        "| record time as it stood (ms) | before (ms) |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['blobs']:,} | {row['range_ms']:.3f} | {row['range_before_ms']:.3f} "
            f"| {row['as_it_stood_ms']:.3f} | {row['as_it_stood_before_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
