"""The measured cases of ``bench/run.py``: each times one way of doing the same work.

All of them read the same topic and write the ``customer_totals`` result (per customer:
sum, count and largest amount) to the same kind of sink, an SQLite file.
"""

from __future__ import annotations

import logging
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from backlog_dagster.log import Topic
from backlog_dagster.phases.micro_batch import MicroBatchTimings, timings_log
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.source import Source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The plain streaming query's settings: what a user would pick for a catch-up.
PLAIN_READ_LIMIT = 100_000
PLAIN_TRIGGER = "1 second"
PLAIN_SHUFFLE_PARTITIONS = 4


@contextmanager
def warm_session(name: str, conf: Mapping[str, str] = {}) -> Iterator[tuple[SparkSession, Path]]:
    """A ``local[*]`` session (with ``conf`` over the project's settings) that logs only
    errors, and a scratch folder; both gone after."""
    from backlog_dagster.implementations import open_session

    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        spark = open_session("local[*]", app_name=name, conf=conf)
        spark.sparkContext.setLogLevel("ERROR")
        try:
            yield spark, scratch
        finally:
            spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def ours(spark: SparkSession, config: PipelineConfig, interval: float) -> dict[str, Any]:
    """The backlog phase as the example pipeline runs it, into a fresh sink."""
    from backlog_dagster.phases.backlog import run_backlog

    started = time.perf_counter()
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, checkpoint_interval=interval, log=lambda _: None)
    return {
        "seconds": time.perf_counter() - started,
        "records": report.rows_read,
        "chunks": report.chunk_timings,
        "jobs": report.job_timings,
        "chunk_commits_s": report.chunk_commits_s,
    }


def pure_batch(spark: SparkSession, topic: Topic, sink_path: Path) -> dict[str, Any]:
    """One Spark batch job over every record, its result written to an SQLite table.

    It reads the log as the backlog does (``Topic.read_batch`` of every bucket's range,
    the ``bucketlog`` data source): the ratio compares the backlog's
    own work around the read, not two readers."""
    started = time.perf_counter()
    bounds = topic.bounds()
    records = topic.read_batch(
        spark,
        None,
        {b: v.earliest for b, v in bounds.items()},
        {b: v.latest for b, v in bounds.items()},
    )
    result = _totals(records).toArrow()
    with sqlite3.connect(sink_path) as db:
        db.execute(
            "CREATE TABLE customer_totals (customer_id TEXT PRIMARY KEY, total_amount REAL, "
            "orders INTEGER, largest_amount REAL)"
        )
        db.executemany(
            "INSERT INTO customer_totals VALUES (?, ?, ?, ?)", zip(*_columns(result), strict=True)
        )
    return {
        "seconds": time.perf_counter() - started,
        "records": sum(topic.latest_offsets().values()),
    }


def plain_streaming(
    spark: SparkSession, topic: Topic, sink_path: Path, checkpoint: Path
) -> dict[str, Any]:
    """An ordinary stateful Structured Streaming query catching up from the earliest offsets.

    Read limit ``PLAIN_READ_LIMIT`` records per trigger, a ``PLAIN_TRIGGER`` trigger, update
    output mode, ``PLAIN_SHUFFLE_PARTITIONS`` shuffle partitions (Spark's default 200 would
    make each micro-batch touch 200 state stores), and each micro-batch's changed rows
    upserted into the SQLite table. Timed until it has taken every record.
    """
    total = sum(topic.latest_offsets().values())
    spark.conf.set("spark.sql.shuffle.partitions", str(PLAIN_SHUFFLE_PARTITIONS))
    db = sqlite3.connect(sink_path, check_same_thread=False)
    db.execute(
        "CREATE TABLE customer_totals (customer_id TEXT PRIMARY KEY, total_amount REAL, "
        "orders INTEGER, largest_amount REAL)"
    )
    done = threading.Event()
    read = [0]

    def upsert(batch: DataFrame, batch_id: int) -> None:
        rows = batch.toArrow()
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO customer_totals VALUES (?, ?, ?, ?)",
                zip(*_columns(rows), strict=True),
            )

    started = time.perf_counter()
    stream = (
        spark.readStream.format("bucketlog")
        .option("path", str(topic.path))
        .option("maxRecordsPerTrigger", PLAIN_READ_LIMIT)
        .load()
    )
    query = (
        _totals(stream)
        .writeStream.outputMode("update")
        .foreachBatch(upsert)
        .trigger(processingTime=PLAIN_TRIGGER)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        while not done.is_set():
            query.awaitTermination(0.2)
            progress = query.recentProgress
            read[0] = sum(int(p["numInputRows"]) for p in progress) if progress else read[0]
            if _source_end(query) >= total:
                done.set()
        seconds = time.perf_counter() - started
    finally:
        query.stop()
        db.close()
    return {
        "seconds": seconds,
        "records": total,
        "read_limit_per_trigger": PLAIN_READ_LIMIT,
        "trigger": PLAIN_TRIGGER,
        "shuffle_partitions": PLAIN_SHUFFLE_PARTITIONS,
    }


def _source_end(query: Any) -> int:
    """Records the query has committed: the sum of its last committed end offsets."""
    import json

    progress = query.lastProgress
    if not progress or not progress["sources"]:
        return 0
    end = progress["sources"][0]["endOffset"]
    offsets = json.loads(end) if isinstance(end, str) else end
    return sum(int(v) for v in offsets.values())


def _totals(records: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return records.groupBy("customer_id").agg(
        F.sum("amount").alias("total_amount"),
        F.count(F.lit(1)).alias("orders"),
        F.max("amount").alias("largest_amount"),
    )


def _columns(table: pa.Table) -> list[list[Any]]:
    return [table.column(c).to_pylist() for c in table.column_names]


class ProgressPoller(threading.Thread):
    """Reads a pipeline's per-bucket progress from its sink every ``every_s`` seconds.

    Records when each new offset first became visible to an outside reader: that is
    when a record's result can be seen.
    """

    def __init__(self, sink_path: Path, pipeline: str, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.sink_path, self.pipeline, self.every_s = sink_path, pipeline, every_s
        self.stopping = threading.Event()
        self.seen: dict[int, list[tuple[float, int]]] = {}

    def run(self) -> None:
        db = sqlite3.connect(self.sink_path)
        last: dict[int, int] = {}
        while not self.stopping.wait(self.every_s):
            rows = db.execute(
                "SELECT bucket, reached FROM backlog_buckets WHERE pipeline = ? AND generation = "
                "(SELECT max(generation) FROM backlog_buckets WHERE pipeline = ?)",
                (self.pipeline, self.pipeline),
            ).fetchall()
            now = time.time()
            for bucket, reached in rows:
                if last.get(bucket) != reached:
                    last[bucket] = reached
                    self.seen.setdefault(bucket, []).append((now, reached))
        db.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def record_latencies(
    topic: Source, poller: ProgressPoller, start: dict[int, int], end: dict[int, int]
) -> np.ndarray:
    """Seconds from each record's append to its result being visible, offsets [start, end)
    (appended: as the log's index says, or a Kafka record's timestamp)."""
    latencies = []
    for bucket, first in start.items():
        seen = poller.seen.get(bucket, [])
        if not seen or end[bucket] <= first:
            continue
        times = np.array([t for t, _ in seen])
        reached = np.array([r for _, r in seen])
        offsets, appended = _append_times(topic, bucket, first, end[bucket])
        # The first poll whose progress passed the offset is when it became visible.
        index = np.searchsorted(reached, offsets, side="right")
        ok = index < len(reached)
        latencies.append(times[index[ok]] - appended[ok])
    return np.concatenate(latencies) if latencies else np.array([])


def _append_times(
    topic: Source, bucket: int, start: int, end: int
) -> tuple[np.ndarray, np.ndarray]:
    offsets, appended = [], []
    if not isinstance(topic, Topic):  # Kafka: each record's timestamp, read back
        for stored in topic.read_records(bucket, start, end):
            offsets.append(stored.offsets.to_numpy())
            micros = stored.record_times.cast(pa.int64()).to_numpy(zero_copy_only=False)
            appended.append(micros / 1e6)
        return np.concatenate(offsets), np.concatenate(appended)
    for first, count, at in topic.append_times(bucket, start, end):
        low, high = max(first, start), min(first + count, end)
        offsets.append(np.arange(low, high))
        appended.append(np.full(high - low, at))
    return np.concatenate(offsets), np.concatenate(appended)


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


#: Spark's durations (``StreamingQueryProgress.durationMs``) a breakdown reports apart.
SPARK_PARTS = ("latestOffset", "queryPlanning", "walCommit", "commitOffsets")


class MicroBatchBreakdown(logging.Handler):
    """Where each micro-batch of a query in this process spends its time.

    Spark's part comes from the query's progress, ours from the commit's DEBUG timings
    (``phases.micro_batch.timings_log``): the commit runs in this process on a local
    Spark. Only micro-batches that committed records count. The progress is read once,
    after the measured window (``collect``), from what Spark keeps of each query: a
    listener would convert every progress event over py4j in this process while the
    commits run here (28 % of the driver's busy samples in a profile), taking CPU and
    the GIL from the very micro-batches it times.
    """

    #: How many progress entries Spark keeps per query (its default: 100).
    KEPT = 100_000

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        #: By (pipeline, batch id): several queries may run side by side.
        self.progress: dict[tuple[str, int], dict[str, float]] = {}
        self.ours: dict[tuple[str, int], MicroBatchTimings] = {}

    def emit(self, record: logging.LogRecord) -> None:
        timings = getattr(record, "micro_batch", None)
        if timings is not None:
            pipeline = record.args[0] if isinstance(record.args, tuple) else ""
            self.ours[(str(pipeline), timings.batch_id)] = timings

    def listen(self, spark: SparkSession) -> None:
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", str(self.KEPT))
        timings_log.addHandler(self)
        timings_log.setLevel(logging.DEBUG)

    def collect(self, spark: SparkSession) -> None:
        """Spark's durations of each micro-batch that ran, from the active queries."""
        for query in spark.streams.active:
            pipeline = (query.name or "").removesuffix("_realtime")
            for progress in query.recentProgress:
                if "addBatch" in progress.durationMs:
                    key = (pipeline, progress.batchId)
                    self.progress.setdefault(key, dict(progress.durationMs))

    def stop(self, spark: SparkSession) -> None:
        timings_log.removeHandler(self)

    def summary(self) -> dict[str, Any]:
        """Per part, the median and p99 seconds over the micro-batches both saw."""
        batches = sorted(set(self.progress) & set(self.ours))
        parts: dict[str, list[float]] = {}

        def add(name: str, seconds: float) -> None:
            parts.setdefault(name, []).append(seconds)

        for batch in batches:
            spark, ours = self.progress[batch], self.ours[batch]
            for name in SPARK_PARTS:
                add(f"spark {name}", spark.get(name, 0) / 1000)
            add("commit: offset log and records read where it runs", ours.read_s)
            add("commit: late check, reference data", ours.prepare_s)
            add("commit: transform, aggregate, collect (Spark job)", ours.aggregate_s)
            add("commit: sink transaction", ours.sink_commit_s)
            ours_s = ours.read_s + ours.prepare_s + ours.aggregate_s + ours.sink_commit_s
            add("foreachBatch call, outside the commit", spark.get("addBatch", 0) / 1000 - ours_s)
            known = sum(spark.get(n, 0) for n in SPARK_PARTS) + spark.get("addBatch", 0)
            add("spark other", (spark.get("triggerExecution", 0) - known) / 1000)
            # A paced query's latestOffset holds its wait for the query's slot.
            total = spark.get("triggerExecution", 0) - spark.get("latestOffset", 0)
            add("micro-batch total, after latestOffset", total / 1000)
            add("records", ours.records)
        return {
            "micro_batches": len(batches),
            "parts": {
                name: {
                    "median": float(np.median(values)),
                    "p99": float(np.percentile(values, 99)),
                }
                for name, values in parts.items()
            },
        }
