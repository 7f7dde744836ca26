"""The backlog phase: markers, batch catch-up in chunks, commits, crashes, resets."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from backlog_dagster.components.assets import backlog_asset
from backlog_dagster.log import Topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.markers import DefinitionChanged, current_generation, reset
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import (
    CUSTOMER_TOTALS,
    REGION_MINUTES,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
    region_minutes_oracle,
    write_defs,
)


def markers_of(config) -> dict[int, int]:  # type: ignore[no-untyped-def]
    with open_sink(config) as sink:
        generation = sink.current_generation()
    assert generation is not None
    return {b: s.marker for b, s in generation.buckets.items()}


@pytest.mark.parametrize("interval", [0, 0.02])
def test_backlog_equals_the_oracle_and_stops_at_the_markers(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, interval: float
) -> None:
    topic = make_topic(records=60_000, buckets=4)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, backlog={"checkpoint_interval": interval})
    with open_sink(config) as sink:
        current_generation(sink, topic, config, print)  # markers now...
        append_orders(topic, 5_000)  # ...so these records are after them
        report = run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
    markers = markers_of(config)
    assert sum(markers.values()) == report.rows_read == 60_000
    assert (report.chunks == 1) == (interval == 0)
    assert_same(results, customer_totals_oracle(records_up_to(topic, markers)), ["customer_id"])


@pytest.mark.parametrize(
    ("transform", "keys"),
    [(CUSTOMER_TOTALS, ["customer_id"]), (REGION_MINUTES, ["region", "window_start"])],
    ids=["customer_totals", "region_minutes"],
)
def test_a_chunk_that_took_under_half_the_interval_reads_on_and_commits_once(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    transform: dict[str, Any],
    keys: list[str],
) -> None:
    """A first backlog's first job is sized before any was timed: when it is short, the
    chunk reads on in another job, and the two jobs' results commit once, merged."""
    from backlog_dagster.phases import chunks

    monkeypatch.setattr(chunks, "FIRST_CHUNK_RECORDS", 15_000)
    topic = make_topic(records=60_000, buckets=4)
    config = pipeline(tmp_path, transform, backlog={"checkpoint_interval": 60})
    logged: list[str] = []
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=logged.append)
        results = sink.read_results().to_pandas()
    # The second job is sized to the rest of the minute: it takes what is left.
    assert [records for records, _ in report.job_timings] == [15_000, 45_000]
    assert report.chunks == 1 and [n for n, _ in report.chunk_timings] == [60_000]
    assert any("chunk of 60,000 in" in m and "/s, 2 Spark jobs)" in m for m in logged), logged
    records = records_up_to(topic, topic.latest_offsets())
    oracle = (
        customer_totals_oracle(records)
        if transform is CUSTOMER_TOTALS
        else region_minutes_oracle(records)
    )
    assert_same(results, oracle, keys)
    assert report.rows_written == len(oracle)


def test_records_that_arrived_during_the_backlog_are_read_in_batch_too(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=60_000, buckets=4)
    config = pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        backlog={"checkpoint_interval": 0, "residual_records": 1_000},
    )
    with open_sink(config) as sink:
        first = current_generation(sink, topic, config, print).number
        append_orders(topic, 5_000)  # more than residual_records after the markers
        report = run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
        generation = sink.current_generation()
    assert generation is not None and generation.number == report.generation == first + 1
    assert "5,000 records arrived meanwhile" in generation.reason
    assert report.rows_read == 65_000 and generation.finished
    assert_same(
        results,
        customer_totals_oracle(records_up_to(topic, topic.latest_offsets())),
        ["customer_id"],
    )


def test_windowed_backlog_takes_every_record_however_late(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=40_000, buckets=3)
    config = pipeline(
        tmp_path, REGION_MINUTES, name="region_minutes", backlog={"checkpoint_interval": 0.3}
    )
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
    assert list(results.columns) == [
        "region",
        "window_start",
        "window_end",
        "orders",
        "total_amount",
    ]
    oracle = region_minutes_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["region", "window_start"])


def test_each_results_table_has_a_clean_view(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Keys, window bounds as SQLite date-times, the aggregations in declared order: no
    internal partial columns."""
    import sqlite3

    make_topic(records=2_000, buckets=2)
    config = pipeline(
        tmp_path,
        {**REGION_MINUTES, "aggregations": [*REGION_MINUTES["aggregations"], MEAN]},
        name="region_minutes",
    )
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        cursor = db.execute("SELECT * FROM region_minutes_view ORDER BY window_start LIMIT 1")
        row = dict(zip([c[0] for c in cursor.description], cursor.fetchone(), strict=True))
        stored = [c[1] for c in db.execute("PRAGMA table_info(region_minutes)")]
    assert list(row) == ["region", "window_start", "window_end", "orders", "total_amount", "mean"]
    assert re.fullmatch(r"2026-09-21 14:\d\d:00", row["window_start"])  # the records' day
    assert row["mean"] == pytest.approx(row["total_amount"] / row["orders"])
    assert "_mean_sum" in stored  # the partials stay in the table itself


MEAN = {"name": "mean", "function": "avg", "column": "amount"}


def test_a_replayed_commit_changes_nothing(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=5_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        before = sink.read_results().to_pandas()
        generation = sink.current_generation()
        assert generation is not None
        start = {b: s.start for b, s in generation.buckets.items()}
        end = {b: s.reached for b, s in generation.buckets.items()}
        from backlog_dagster.phases.transform import partial_results

        replay = partial_results(
            spark.read.format("bucketlog").option("path", str(topic.path)).load(), config
        ).toArrow()
        assert sink.commit(generation.number, start, end, replay) is False
        assert_same(sink.read_results().to_pandas(), before, ["customer_id"])
        assert run_backlog(spark, config, sink, log=print).rows_read == 0


def test_new_buckets_have_no_backlog_and_are_tracked(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=8_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    messages: list[str] = []
    with open_sink(config) as sink:
        current_generation(sink, topic, config, messages.append)
        topic.add_buckets(1)
        append_orders(topic, 3_000)
        report = run_backlog(spark, config, sink, log=messages.append)
        generation = sink.current_generation()
    assert generation is not None
    assert generation.buckets[2].start == generation.buckets[2].marker == 0
    assert generation.buckets[2].finished
    assert report.rows_read == 8_000
    assert any("tracking new bucket(s) [2]" in m for m in messages)


def test_reset_starts_a_new_generation_and_a_changed_definition_is_refused(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=5_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        append_orders(topic, 1_000)
        generation = reset(sink, topic, config, "test reset", print)
        assert generation.number == 2 and generation.reason == "test reset"
        assert sum(b.marker for b in generation.buckets.values()) == 6_000
        assert sink.read_results().num_rows == 0
        assert run_backlog(spark, config, sink, log=print).rows_read == 6_000
    changed = pipeline(tmp_path, {**CUSTOMER_TOTALS, "keys": ["region"]})
    with open_sink(changed) as sink, pytest.raises(DefinitionChanged, match="pipeline reset"):
        current_generation(sink, topic, changed, print)


def test_a_later_backlog_run_sizes_its_first_chunk_by_the_rate_the_one_before_left(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The sink keeps the rate of a backlog run's last chunks once the run has ended; the
    pipeline's next backlog run (here after a reset) sizes its first chunk by it."""
    from backlog_dagster.phases.chunks import chunk_rate, next_chunk_records
    from backlog_dagster.phases.progress import previous_chunk_rate

    topic = make_topic(records=100_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    messages: list[str] = []
    with open_sink(config) as sink:
        assert previous_chunk_rate(sink) is None
        first = run_backlog(spark, config, sink, checkpoint_interval=0.04, log=print)
        assert len(first.job_timings) >= 2
        rate = previous_chunk_rate(sink)
        assert rate == pytest.approx(chunk_rate(first.job_timings))
        reset(sink, topic, config, "test reset", print)
        second = run_backlog(spark, config, sink, checkpoint_interval=0.04, log=messages.append)
    assert second.previous_chunk_rate == rate and second.rows_read == 100_000
    assert rate is not None
    assert second.job_timings[0][0] == next_chunk_records(0.04, [], 100_000, rate)
    assert any("the first sized by the previous backlog run's" in m for m in messages), messages


def start_phase(
    defs: Path, data: Path, phase: str = "backlog", temp: Path | None = None
) -> subprocess.Popen[str]:
    """Run ``backlog-dagster pipeline <phase> defs.yaml`` in its own process group;
    ``temp``: its temporary folders' place (the realtime query's checkpoint is one)."""
    cli = str(Path(sys.executable).with_name("backlog-dagster"))
    env = {**os.environ, "BACKLOG_DAGSTER_DATA": str(data), "COLUMNS": "200"}
    if temp is not None:
        temp.mkdir(parents=True, exist_ok=True)
        env["TMPDIR"] = str(temp)
    return subprocess.Popen(
        [cli, "pipeline", phase, str(defs)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )


def kill_all(process: subprocess.Popen[str]) -> None:
    """SIGKILL the run and its Spark JVM (its own process group)."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def wait_for(condition, timeout: float = 180) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_backlog_keeps_its_markers_and_recovers_exactly(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """One chunk (checkpoint interval 0), killed inside it: nothing committed, and the
    next run reads it all. (Chunks killed between commits: tests/test_archive.py, where
    the chunks read an archive.)"""
    topic = make_topic(records=400_000, buckets=4)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, backlog={"checkpoint_interval": 0})
    markers = kill_and_rerun_backlog(config, topic, tmp_path)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    with Topic(topic.path) as log:
        assert_same(results, customer_totals_oracle(records_up_to(log, markers)), ["customer_id"])


def kill_and_rerun_backlog(config: PipelineConfig, topic: Topic, tmp_path: Path) -> dict[int, int]:
    """Run the backlog as Dagster runs it, SIGKILL it mid-way (inside its one chunk, or
    inside a chunk after one committed), append to the log, run it again to the end;
    check what was kept and read, and return the markers."""
    interval = config.backlog.checkpoint_interval
    defs = write_defs(tmp_path / "defs" / config.name, config, data=tmp_path)
    run = start_phase(defs, tmp_path)
    assert run.stdout is not None
    for line in run.stdout:
        if "records to read up to the markers" in line:
            break
    markers = markers_of(config)
    with open_sink(config) as sink:
        if interval:  # let at least one chunk commit, then kill inside the next
            wait_for(
                lambda: any(b.reached > b.start for b in sink.current_generation().buckets.values())
            )  # type: ignore[union-attr]
        else:
            # Inside the one and only chunk, which starts once that line is out: on a fast
            # hour, 400,000 records read in Spark's JVM were committed within 1.5 s.
            time.sleep(0.3)
        kill_all(run)
        held = sink.current_generation()
        assert held is not None
        reached = {b: s.reached for b, s in held.buckets.items()}
        if interval:
            assert 0 < sum(reached.values()) < sum(markers.values())
            assert sink.read_results().num_rows > 0
        else:
            assert sum(reached.values()) == 0 and sink.read_results().num_rows == 0
    append_orders(topic, 20_000)  # the log moves on; the markers must not
    rerun = start_phase(defs, tmp_path)
    output, _ = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, output
    assert markers_of(config) == markers
    read = int(output.split(" records read")[0].split()[-1].replace(",", ""))
    assert read == sum(markers.values()) - sum(reached.values())
    return markers


@pytest.mark.parametrize(
    ("run_config", "expected", "in_chunks"),
    [
        ({}, {"spark.sql.adaptive.enabled": "true", "spark.sql.shuffle.partitions": "1"}, False),
        (
            {
                "adaptive_query_execution": False,
                "shuffle_partitions": "7",
                "checkpoint_interval": 0.001,
                "spark_conf": {"spark.sql.ansi.enabled": "false"},
            },
            {
                "spark.sql.adaptive.enabled": "false",
                "spark.sql.adaptive.coalescePartitions.enabled": "false",
                "spark.sql.shuffle.partitions": "7",
                "spark.sql.ansi.enabled": "false",
            },
            True,
        ),
        (
            {"spark_conf": {"spark.sql.shuffle.partitions": "3"}},
            {"spark.sql.shuffle.partitions": "3"},
            False,
        ),
    ],
    ids=["defaults", "every_field", "spark_conf_over_the_backlogs_own"],
)
def test_each_backlog_run_config_field_is_the_setting_the_run_used(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    run_config: dict[str, Any],
    expected: dict[str, str],
    in_chunks: bool,
) -> None:
    """What the run config asks for is what the batch plan ran with: in the settings the
    materialization reports, in the session after the run, and in the chunks made."""
    make_topic(records=30_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    result = dg.materialize(
        [backlog_asset(config)],
        run_config={"ops": {"customer_totals_backlog": {"config": run_config}}},
    )
    (materialization,) = result.asset_materializations_for_node("customer_totals_backlog")
    used = materialization.metadata["spark_settings"].value
    assert expected.items() <= used.items()  # type: ignore[union-attr]
    for key, value in expected.items():
        assert spark.conf.get(key) == value
    assert (materialization.metadata["chunks"].value > 1) == in_chunks  # type: ignore[operator]


def test_a_backlog_in_one_chunk_publishes_its_progress_while_spark_reads(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpoint_interval: 0`` commits once, at the end; meanwhile the run publishes
    the records Spark's finished read tasks stand for, which the sensor and ``pipeline
    status`` show. (Read in eight tasks, as a backlog of 16,000,000 records or more is,
    so that some end before others.)"""
    import threading

    from backlog_dagster.phases import backlog
    from backlog_dagster.phases.progress import RunProgress

    monkeypatch.setattr(backlog, "ONE_CHUNK_RECORDS_PER_TASK", 100_000)
    make_topic(records=900_000, buckets=4)
    config = pipeline(
        tmp_path, CUSTOMER_TOTALS, backlog={"checkpoint_interval": 0}, switch={"status_every": 0.1}
    )
    seen: list[RunProgress] = []
    done = threading.Event()

    def watch() -> None:
        with open_sink(config) as sink:
            while not done.wait(0.05):
                published = sink.published_progress()
                if published is not None:
                    seen.append(RunProgress.from_json(published))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with open_sink(config) as sink:
            report = run_backlog(spark, config, sink, log=print, run_id="the run")
    finally:
        done.set()
        watcher.join()
    assert report.chunks == 1 and report.rows_read == 900_000
    assert {p.run_id for p in seen} == {"the run"}
    during = [p for p in seen if p.read_to]
    assert any(0 < p.records_read < 900_000 for p in during), sorted(
        {(p.records_read, tuple(p.read_to.values())) for p in seen}
    )
    # Every bucket starts at offset 0: what each has read to adds up to the records read.
    assert all(sum(p.read_to.values()) == p.records_read for p in during)


def test_a_backlog_in_chunks_never_shows_less_done_than_before(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A chunk commits beside the next chunk's job: the progress the sensor computes
    (committed offsets, and what the run published it read) counts it once, before and
    after its commit lands, and never goes back."""
    import threading

    from backlog_dagster.phases.progress import RunProgress, backlog_progress

    make_topic(records=200_000, buckets=4)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, switch={"status_every": 0.02})
    done_seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        with open_sink(config) as sink:
            while not stop.wait(0.01):
                generation, published = sink.current_generation(), sink.published_progress()
                if generation is not None and published is not None:
                    run = RunProgress.from_json(published)
                    done_seen.append(backlog_progress(generation, run, config).done)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with open_sink(config) as sink:
            report = run_backlog(spark, config, sink, checkpoint_interval=0.04, log=print)
    finally:
        stop.set()
        watcher.join()
    assert report.chunks >= 3 and report.rows_read == 200_000
    assert len(set(done_seen)) >= 3, done_seen
    assert done_seen == sorted(done_seen), done_seen


def test_a_one_chunk_backlog_reads_in_more_tasks_as_it_grows() -> None:
    from backlog_dagster.phases.backlog import one_chunk_read_tasks

    records = (0, 1_900_000, 4_000_000, 8_000_000, 16_000_000, 10**9)
    assert [one_chunk_read_tasks(n) for n in records] == [1, 1, 2, 4, 8, 8]
