"""Late records: judged by arrival, so the same input gives the same late table whatever
realtime's pace, its micro-batches or its crashes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql import SparkSession

from backlog_dagster.log import Topic, create_topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.markers import definition_of
from backlog_dagster.phases.watermark import BucketClock, arrival_watermarks, combine
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.source.schema import parse_ddl
from tests.pipelines import assert_same, records_not_late, write_defs
from tests.test_backlog import kill_all, start_phase, wait_for
from tests.test_realtime import RealtimeThread, reached

SCHEMA = parse_ddl("id BIGINT, k STRING, amount DOUBLE, ts TIMESTAMP")
BUCKETS = 4
#: Records per bucket and round: bucket 0 holds most of them.
PER_ROUND = (140, 20, 20, 20)
ROUNDS = 120
ROUND_S = 2.0
BASE_US = 1_790_000_000_000_000
LATENESS_S = 30


def test_the_watermark_is_the_smallest_over_active_buckets_less_the_lateness() -> None:
    clocks = {
        0: BucketClock(event_time_us=50_000_000, last_append=100.0),
        1: BucketClock(event_time_us=90_000_000, last_append=100.0),
        2: BucketClock(event_time_us=10_000_000, last_append=10.0),  # idle: quiet 90 s
        3: BucketClock(event_time_us=None, last_append=100.0, unread=True, next_time_us=70_000_000),
    }
    mark = combine(clocks, lateness_us=30_000_000, idle_timeout_s=60, now=100.0)
    assert mark.watermark_us == 20_000_000
    assert mark.idle_buckets == (2,) and mark.active_buckets == (0, 1, 3)
    everyone_idle = {b: BucketClock(1, 0.0) for b in range(2)}
    assert combine(everyone_idle, 0, 60, now=100.0).watermark_us is None


def skewed_topic(path: Path) -> tuple[Topic, set[tuple[int, int]]]:
    """A topic whose bucket 0 holds most records, with a backlog, then ``ROUNDS`` rounds of
    live records (event time advancing ``ROUND_S`` a round, disordered by up to 5 s) and
    a few records two minutes late. Returns the topic and where the late ones are."""
    topic = create_topic(path, SCHEMA, timestamp_column="ts", buckets=BUCKETS)
    rng = np.random.default_rng(5)
    next_id = 0
    late: set[tuple[int, int]] = set()

    def append(bucket: int, times_us: np.ndarray) -> tuple[int, int]:
        nonlocal next_id
        count = len(times_us)
        table = pa.table(
            {
                "id": pa.array(np.arange(next_id, next_id + count)),
                "k": pa.array([f"k{i % 5}" for i in range(next_id, next_id + count)]),
                "amount": pa.array(rng.integers(1, 100, count).astype(float)),
                "ts": pa.array(times_us, pa.int64()).cast(SCHEMA.field("ts").type),
            }
        )
        next_id += count
        return topic.append(bucket, table)

    for bucket, share in enumerate(PER_ROUND):  # the backlog: 100 s of event time
        append(bucket, np.sort(rng.integers(BASE_US, BASE_US + 100_000_000, share * 10)))
    for round_ in range(ROUNDS):
        clock = BASE_US + 100_000_000 + int(round_ * ROUND_S * 1_000_000)
        for bucket, share in enumerate(PER_ROUND):
            times = clock - rng.integers(0, 5_000_000, share)
            append(bucket, times)
            if round_ % 10 == 5 and bucket % 2 == 1:  # two minutes behind: late
                first, _ = append(bucket, np.array([clock - 120_000_000]))
                late.add((bucket, first))
    return topic, late


def windowed(tmp_path: Path, name: str, **realtime: object) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": name,
            "source": {"path": str(tmp_path / "events"), "event_time": "ts"},
            "transform": {
                "keys": ["k"],
                "window": {"size": "1m", "allowed_lateness": f"{LATENESS_S}s"},
                "aggregations": [
                    {"name": "n", "function": "count"},
                    {"name": "total", "function": "sum", "column": "amount"},
                ],
            },
            "sink": {"path": str(tmp_path / f"{name}.sqlite"), "table": name},
            "realtime": {"checkpoint_interval": 0.2, "max_records_per_trigger": 1_000, **realtime},
        }
    )


def late_and_results(config: PipelineConfig) -> tuple[set[tuple[int, int]], pd.DataFrame]:
    with open_sink(config) as sink:
        late = {(r["bucket"], r["offset"]) for r in sink.read_late().to_pylist()}
        return late, sink.read_results().to_pandas()


def oracle(topic: Topic, late: set[tuple[int, int]]) -> pd.DataFrame:
    kept = records_not_late(topic, late)
    minute = kept["ts"].dt.floor("1min")
    return (
        kept.assign(window_start=minute.dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        .groupby(["k", "window_start"])
        .agg(n=("amount", "size"), total=("amount", "sum"))
        .reset_index()
    )


def test_on_time_records_of_a_lagging_bucket_are_not_late_with_or_without_a_kill(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Realtime starts far behind; the shared read limit lets the small buckets race ahead
    in event time. Only the records that were late when they arrived are late: the same
    ones in a run left alone and in a run killed and restarted."""
    topic, late = skewed_topic(tmp_path / "events")
    backlog_end = {b: share * 10 for b, share in enumerate(PER_ROUND)}
    calm, killed = windowed(tmp_path, "calm"), windowed(tmp_path, "killed")
    for config in (calm, killed):
        with open_sink(config) as sink:
            generation = sink.start_generation(
                {b: (0, end) for b, end in backlog_end.items()}, "test", definition_of(config)
            )
            assert generation.number == 1
            run_backlog(spark, config, sink, log=print)

    runner = RealtimeThread(spark, calm, tmp_path / "checkpoint")
    runner.start()
    wait_for(lambda: reached(calm) == topic.latest_offsets(), timeout=300)
    runner.stop()

    defs = write_defs(tmp_path / "defs" / "killed", killed, data=tmp_path)
    total = sum(topic.latest_offsets().values())
    run = start_phase(defs, tmp_path, phase="realtime")
    wait_for(lambda: sum(reached(killed).values()) > total * 0.4, timeout=300)
    kill_all(run)
    assert sum(reached(killed).values()) < total
    rerun = start_phase(defs, tmp_path, phase="realtime")
    wait_for(lambda: reached(killed) == topic.latest_offsets(), timeout=300)
    rerun.send_signal(signal.SIGTERM)
    output, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, output

    calm_late, calm_results = late_and_results(calm)
    killed_late, killed_results = late_and_results(killed)
    assert calm_late == late, f"{len(calm_late)} late, {len(calm_late - late)} on time"
    assert killed_late == late
    want = oracle(topic, late)
    assert_same(calm_results, want, ["k", "window_start"])
    assert_same(killed_results, want, ["k", "window_start"])


def test_the_watermark_at_each_arrival_counts_only_what_came_before(tmp_path: Path) -> None:
    topic = create_topic(tmp_path / "t", SCHEMA, timestamp_column="ts", buckets=2)

    def append(bucket: int, seconds: float) -> None:
        time_us = BASE_US + int(seconds * 1_000_000)
        topic.append(
            bucket,
            pa.table(
                {
                    "id": [0],
                    "k": ["a"],
                    "amount": [1.0],
                    "ts": pa.array([time_us], pa.int64()).cast(SCHEMA.field("ts").type),
                }
            ),
        )
        time.sleep(0.01)

    append(0, 100)
    append(1, 40)
    append(0, 200)
    append(1, 50)
    marks = arrival_watermarks(topic, {0: 0, 1: 0}, lateness_us=10_000_000, idle_timeout_s=60)
    got = [None if m is None else (m - BASE_US) / 1e6 for m in marks.values()]
    # First append: no bucket has anything before it. Second: bucket 1 has no record
    # before it yet, so bucket 0's 100 s alone. Then min(100, 40) and min(200, 40).
    assert got == [None, 90.0, 30.0, 30.0]
