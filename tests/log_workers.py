"""Writer and reader processes for the log's multi-process tests.

Run as ``python tests/log_workers.py writer TOPIC BUCKET BATCHES ROWS`` or
``python tests/log_workers.py reader TOPIC BUCKETS TOTAL``. Each record's ``order_id``
is its own offset, so a reader can check density and order without an oracle.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import pyarrow as pa

from backlog_dagster.log import Topic
from backlog_dagster.tools.workload import ORDERS_SCHEMA


def records(first: int, count: int) -> pa.Table:
    ids = np.arange(first, first + count)
    return pa.table(
        {
            "order_id": ids,
            "customer_id": pa.array([f"C{i % 1000:06d}" for i in ids]),
            "region": pa.array(["region-00"] * count),
            "amount": ids.astype(np.float64),
            "event_time": pa.array(1_790_000_000_000_000 + ids, pa.int64()).cast(
                ORDERS_SCHEMA.field("event_time").type
            ),
        },
        schema=ORDERS_SCHEMA,
    )


def writer(path: str, bucket: int, batches: int, rows: int) -> None:
    """Append ``batches`` batches; say 'begin' before and 'acked N' after each."""
    with Topic(path) as topic:
        for _ in range(batches):
            first = topic.bucket(bucket).bounds().latest
            table = records(first, rows)
            print("begin", first, flush=True)
            _, end = topic.append(bucket, table)
            print("acked", end, flush=True)


def reader(path: str, buckets: list[int], total: int) -> None:
    """Follow the buckets until ``total`` records were read; check each is dense."""
    position = dict.fromkeys(buckets, 0)
    deadline = time.monotonic() + 120
    with Topic(path) as topic:
        while sum(position.values()) < total:
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out at {position}")
            for bucket in buckets:
                latest = topic.bucket(bucket).bounds().latest
                for batch in topic.read(bucket, position[bucket], latest):
                    ids = batch.column("order_id").to_numpy()
                    expected = np.arange(position[bucket], position[bucket] + len(ids))
                    if not np.array_equal(ids, expected):
                        raise SystemExit(f"bucket {bucket}: gap or disorder at {position[bucket]}")
                    position[bucket] += len(ids)
            time.sleep(0.005)
    print("read", sum(position.values()), flush=True)


if __name__ == "__main__":
    role, path, *rest = sys.argv[1:]
    if role == "writer":
        writer(path, int(rest[0]), int(rest[1]), int(rest[2]))
    else:
        reader(path, [int(b) for b in rest[0].split(",")], int(rest[1]))
