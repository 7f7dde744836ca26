"""The ceiling for a Kafka backlog: a bare confluent-kafka consumer per core, no Spark.

Each process assigns its share of the partitions at the given offsets and calls
``consume(num_messages=…)`` until every one of them reached its end offset, with no
Python step per message but the client's own (a ``Message`` object each), keeping
nothing but a count (or, with ``parse``, parsing each batch's values into Arrow with
``pyarrow.json``, as our reader does). ``bench/sources.py`` runs it beside our backlog
over the same broker, records and offsets, in the same run.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

#: Messages asked of ``consume`` at a time.
BATCH = 10_000
#: The client's own settings beside the bootstrap servers: an offset read never waits
#: for more (as our reader's), and a partition's queue is allowed to fill up to a
#: million messages (with many partitions assigned at once, librdkafka's default of
#: 100,000 held the consumer at under half the rate, measured here).
SETTINGS = {"fetch.wait.max.ms": 10, "queued.min.messages": 1_000_000}


@dataclass(frozen=True)
class Share:
    """One process's partitions, each with its ``(start, end)`` offsets."""

    bootstrap: str
    topic: str
    ranges: dict[int, tuple[int, int]]
    schema: Any  # a pyarrow schema, or None not to parse


def read(share: Share, ready: Any, out: Any) -> None:
    """Read ``share`` once ``ready`` lets every process go; put (records, began, ended)."""
    import pyarrow as pa
    import pyarrow.json as pa_json
    from confluent_kafka import Consumer, Message, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": share.bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            **SETTINGS,
        }
    )
    options = (
        None
        if share.schema is None
        else pa_json.ParseOptions(explicit_schema=share.schema, unexpected_field_behavior="ignore")
    )
    left = {p: end for p, (start, end) in share.ranges.items() if end > start}
    ready.wait()
    began = time.time()
    consumer.assign([TopicPartition(share.topic, p, share.ranges[p][0]) for p in left])
    records = 0
    while left:
        messages = consumer.consume(BATCH, timeout=1.0)
        if any(map(Message.error, messages)):
            messages = [m for m in messages if m.error() is None]
        records += len(messages)
        # A partition is done once its last message in the batch reached its end.
        partitions = list(map(Message.partition, messages))
        backwards = partitions[::-1]
        for partition in set(partitions) & left.keys():
            last = messages[len(partitions) - 1 - backwards.index(partition)]
            if (last.offset() or 0) + 1 >= left[partition]:
                del left[partition]
        if options is not None and messages:
            joined = b"\n".join(map(Message.value, messages))
            pa_json.read_json(pa.BufferReader(joined), parse_options=options)
    out.put((records, began, time.time()))
    consumer.close()


def ceiling(
    bootstrap: str,
    topic: str,
    ranges: dict[int, tuple[int, int]],
    schema: Any = None,
    processes: int | None = None,
) -> dict[str, float]:
    """Records read and seconds from the first process's start to the last one's end,
    by one process per core (spawned: the caller may run a JVM)."""
    count = processes or os.cpu_count() or 1
    context = multiprocessing.get_context("spawn")
    ready, out = context.Barrier(count), context.Queue()
    partitions = sorted(ranges)
    shares = [
        Share(bootstrap, topic, {p: ranges[p] for p in partitions[i::count]}, schema)
        for i in range(count)
    ]
    workers = [context.Process(target=read, args=(share, ready, out)) for share in shares]
    for worker in workers:
        worker.start()
    results = [out.get() for _ in workers]
    for worker in workers:
        worker.join()
    seconds = max(r[2] for r in results) - min(r[1] for r in results)
    return {"records": sum(r[0] for r in results), "seconds": seconds, "processes": count}
