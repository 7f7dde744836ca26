"""Watermark lag from the log and the sink, and round trips realtime → backlog → realtime."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
from click.testing import CliRunner
from pyspark.sql import SparkSession

from backlog_dagster.cli import main
from backlog_dagster.log import Topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.lag import watermark_lag
from backlog_dagster.phases.markers import continue_backlog, current_generation
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import (
    CUSTOMER_TOTALS,
    REGION_MINUTES,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
    write_defs,
)
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached


def test_watermark_lag_comes_from_the_next_record_then_the_commits_and_ignores_idle_buckets(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=2_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    config = config.model_copy(
        update={"source": config.source.model_copy(update={"idle_timeout": 1.0})}
    )
    now = time.time()
    with open_sink(config) as sink:
        generation = current_generation(sink, topic, config, print)
        # Nothing committed yet: each bucket's next record stands in for its watermark.
        lag = watermark_lag(generation, topic, config, now)
        first = min(topic.record_time(b, 0) for b in (0, 1))
        assert lag.watermark_us == first and lag.active_buckets == (0, 1)
        assert abs(lag.seconds - (now - first / 1e6)) < 1e-3  # type: ignore[operator]

        # Commits carry each bucket's latest event time; the smallest is the watermark.
        end = topic.latest_offsets()
        times = {0: first + 50_000_000, 1: first + 20_000_000}
        sink.commit(generation.number, {0: 0, 1: 0}, end, pa.table({}), event_times=times)
        generation = sink.current_generation()
        assert generation is not None
        assert watermark_lag(generation, topic, config, now).watermark_us == first + 20_000_000

        # Windowed: the watermark trails by the allowed lateness (30 s).
        windowed = config.model_copy(
            update={"transform": pipeline(tmp_path, REGION_MINUTES).transform}
        )
        assert (
            watermark_lag(generation, topic, windowed, now).watermark_us
            == first + 20_000_000 - 30_000_000
        )

        # Everything read and nothing appended for the idle timeout: the source is idle.
        time.sleep(1.1)
        lag = watermark_lag(generation, topic, config, time.time())
        assert lag.idle and lag.describe() == "source idle"
        append_orders(topic, 10)  # active again: checked afresh
        lag = watermark_lag(generation, topic, config, time.time())
        assert not lag.idle


def test_round_trips_between_realtime_and_backlog_lose_and_double_nothing(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=30_000, buckets=3)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.5})
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    for trip in range(2):
        runner = RealtimeThread(spark, config, tmp_path / f"checkpoint-{trip}")
        runner.start()
        append_orders(topic, 4_000)
        wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
        append_orders(topic, 20_000)  # in flight while the switch goes back
        with open_sink(config) as sink, Topic(config.source.path) as log:
            generation = continue_backlog(sink, log, config, f"trip {trip}", 99.0, print)
        runner.join(60)  # the realtime run stops by itself: its generation was replaced
        assert not runner.is_alive() and runner.error is None
        with open_sink(config) as sink:
            # Its query's later batches committed nothing into the new generation.
            held = sink.current_generation()
            assert held is not None and held.number == generation.number
            assert {b: s.reached for b, s in held.buckets.items()} == {
                b: s.reached for b, s in generation.buckets.items()
            }
        append_orders(topic, 3_000)  # after the new markers: for the next realtime run
        with open_sink(config) as sink:
            report = run_backlog(spark, config, sink, log=print)
            assert report.generation == generation.number
            done = sink.current_generation()
            assert done is not None and done.finished
            sink.record_phase(done.number, "realtime", "test switch")
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint-last")
    runner.start()
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
        history = [(c.generation, c.phase, c.cause) for c in sink.phase_history()]
    assert history == [
        (1, "backlog", "first start"),
        (2, "backlog", "trip 0"),
        (2, "realtime", "test switch"),
        (3, "backlog", "trip 1"),
        (3, "realtime", "test switch"),
    ]
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])

    status = CliRunner().invoke(main, ["pipeline", "status", str(write_defs(tmp_path, config))])
    assert status.exit_code == 0, status.output
    assert "realtime, generation 3" in status.output and "trip 1" in status.output


def test_a_backlog_that_reaches_its_markers_still_lagging_goes_on_in_the_same_run(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Records kept arriving: the run takes new markers itself, then stops once caught up."""
    topic = make_topic(records=20_000, buckets=2)  # event times of 2026-09-21: far behind
    config = pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        backlog={"checkpoint_interval": 0, "watermark_lag_threshold": 60},
    )
    appended: list[str] = []

    def log(line: str) -> None:
        print(line)
        if line.startswith("backlog 100%") and not appended:
            append_orders(topic, 3_000, live=True)  # arrived while the first round ran
            appended.append(line)

    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=log)
        done = sink.current_generation()
        history = [(c.generation, c.phase, c.cause) for c in sink.phase_history()]
        results = sink.read_results().to_pandas()
    assert appended and report.generation == 2 and report.rows_read == 23_000
    assert done is not None and done.finished and done.number == 2
    assert {b: s.reached for b, s in done.buckets.items()} == topic.latest_offsets()
    assert history[0] == (1, "backlog", "first start")
    assert history[1][:2] == (2, "backlog") and "new markers at the log's end" in history[1][2]
    assert len(history) == 2  # the live records are within the threshold: no third round
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])

    # The switch's record of a phase change for a generation that is no longer the
    # newest is refused: the run took new markers after the sensor read the old ones.
    with open_sink(config) as sink:
        assert not sink.record_phase(1, "realtime", "stale decision")
        assert sink.record_phase(2, "realtime", "current decision")
        with Topic(config.source.path) as live:
            append_orders(live, 10)
            assert sink.continue_generation(live.latest_offsets(), "x", if_phase="backlog") is None
