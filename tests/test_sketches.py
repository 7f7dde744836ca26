"""count_distinct and quantiles: sketches merged across chunks, micro-batches and the
switch like sums, in both sinks; estimates within the sketches' documented bounds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from backlog_dagster.log import Topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import assert_sketched, pipeline, records_up_to
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached
from tests.test_sink_contract import on_sink

SKETCHED = {
    "keys": ["region"],
    # Lateness enough for every live record to be on time: no record is left out.
    "window": {"size": "2m", "slide": "1m", "allowed_lateness": "10m"},
    "aggregations": [
        {"name": "orders", "function": "count"},
        {"name": "customers", "function": "count_distinct", "column": "customer_id"},
        {"name": "amount", "function": "quantiles", "column": "amount", "quantiles": [0.5, 0.99]},
    ],
}


def sketched(config: PipelineConfig, topic: Topic) -> int:
    records = records_up_to(topic, topic.latest_offsets())
    return assert_sketched(config, records, records["amount"])


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_sketches_merge_across_chunks_and_the_switch_within_their_bounds(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    kind: str,
    request: pytest.FixtureRequest,
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None
    topic = make_topic(records=30_000, buckets=2)
    config = on_sink(
        pipeline(
            tmp_path,
            SKETCHED,
            name="sketched",
            backlog={"checkpoint_interval": 0.1},
            realtime={"checkpoint_interval": 0.5},
        ),
        kind,
        dsn,
    )
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=print)
    assert sketched(config, topic) > 0
    print(f"backlog in {report.chunks} chunks")

    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    for seed in range(3):
        append_orders(topic, 5_000, seed=10 + seed, live=True)
        time.sleep(0.5)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    sketched(config, topic)


def test_sketches_of_a_chunks_jobs_merge_before_its_commit(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk read by two Spark jobs (its first one short) commits their sketches unioned."""
    from backlog_dagster.phases import chunks

    monkeypatch.setattr(chunks, "FIRST_CHUNK_RECORDS", 10_000)
    topic = make_topic(records=30_000, buckets=2)
    config = pipeline(tmp_path, SKETCHED, name="sketched", backlog={"checkpoint_interval": 60})
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=print)
    assert len(report.job_timings) == 2 and report.chunks == 1
    assert sketched(config, topic) > 0
