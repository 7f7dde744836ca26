"""Stateless pipelines (no keys, no aggregations): every record that passes the filter
lands in the results table once, in its own shape, in both sinks: across chunks, a
SIGKILL inside the backlog, and the switch to realtime."""

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
from tests.pipelines import LARGE_ORDERS, assert_each_kept_once, in_chunks, records_up_to
from tests.test_backlog import kill_and_rerun_backlog, wait_for
from tests.test_realtime import RealtimeThread, reached
from tests.test_sink_contract import on_sink

#: Large orders enriched by the user's function (with_tax, and a band that is null for
#: some records: no key needs it here, so they are kept).
BANDED_ORDERS = {"function": "tests.user_functions:banded", **LARGE_ORDERS}


def realtime_appends(spark: SparkSession, config: PipelineConfig, topic: Topic, tmp: Path) -> None:
    runner = RealtimeThread(spark, config, tmp / "checkpoint")
    runner.start()
    for seed in range(3):
        append_orders(topic, 4_000, seed=seed + 10)
        time.sleep(0.5)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    assert runner.error is None, runner.error


def test_a_killed_stateless_backlog_and_realtime_keep_each_record_once(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=200_000, buckets=4)
    config = in_chunks(tmp_path, LARGE_ORDERS, "large_orders")  # the first chunk: 200,000
    kill_and_rerun_backlog(config, topic, tmp_path)
    realtime_appends(spark, config, topic, tmp_path)
    with Topic(topic.path) as log:
        assert_each_kept_once(config, records_up_to(log, log.latest_offsets()))


def test_a_stateless_pipeline_with_a_function_in_postgresql(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, postgres_dsn: str
) -> None:
    topic = make_topic(records=30_000, buckets=2)
    config = on_sink(in_chunks(tmp_path, BANDED_ORDERS, "banded_orders"), "postgres", postgres_dsn)
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    assert_each_kept_once(config, records_up_to(topic, topic.latest_offsets()), banded=True)
    realtime_appends(spark, config, topic, tmp_path)
    assert_each_kept_once(config, records_up_to(topic, topic.latest_offsets()), banded=True)


def test_keys_without_aggregations_and_a_window_without_them_are_refused(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from tests.pipelines import pipeline

    with pytest.raises(ValidationError, match="keys without aggregations: add aggregations"):
        pipeline(tmp_path, {"keys": ["region"]})
    with pytest.raises(ValidationError, match="aggregations need keys"):
        pipeline(tmp_path, {"aggregations": [{"name": "n", "function": "count"}]})
    with pytest.raises(ValidationError, match="a window groups records for aggregations"):
        pipeline(tmp_path, {"window": {"size": "1m"}})
