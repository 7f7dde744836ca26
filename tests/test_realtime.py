"""The realtime phase: continues at the markers from the backlog's state, exactly once."""

from __future__ import annotations

import contextlib
import io
import json
import signal
import threading
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from backlog_dagster.components.assets import realtime_asset
from backlog_dagster.implementations import open_source
from backlog_dagster.log import Topic
from backlog_dagster.phases import micro_batch
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.lock import exclusive_run
from backlog_dagster.phases.markers import continue_backlog, current_generation
from backlog_dagster.phases.query_start import QueryStart, write_start
from backlog_dagster.phases.realtime import (
    QUERY_START_ATTEMPTS,
    WORKER_SLOW_TO_START,
    ArmedQuery,
    BacklogNotFinished,
    RealtimeRun,
    arm_beside,
    armed_realtime,
    read_limit,
    run_realtime,
    start_query,
)
from backlog_dagster.phases.standby import await_switch
from backlog_dagster.phases.transform import partial_results, read_schema
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import Sink, open_sink
from backlog_dagster.spark.session import apply_sql_settings, sql_settings_after
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
from tests.test_backlog import kill_all, start_phase, wait_for


def reached(config: PipelineConfig) -> dict[int, int]:
    with open_sink(config) as sink:
        generation = sink.current_generation()
    assert generation is not None
    return {b: s.reached for b, s in generation.buckets.items()}


class RealtimeThread(threading.Thread):
    """run_realtime in the test's own Spark session, stopped by ``stop()``."""

    def __init__(self, spark: SparkSession, config: PipelineConfig, checkpoint: Path) -> None:
        super().__init__(daemon=True)
        self.spark, self.config, self.checkpoint = spark, config, checkpoint
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with open_sink(self.config) as sink, open_sink(self.config) as status_sink:
                run_realtime(
                    self.spark,
                    self.config,
                    sink,
                    status_sink,
                    RealtimeRun(
                        checkpoint_dir=self.checkpoint,
                        should_stop=self.stopping.is_set,
                        status_every_s=1.0,
                    ),
                )
        except BaseException as error:  # reported by stop()
            self.error = error

    def stop(self) -> None:
        self.stopping.set()
        self.join(120)
        assert not self.is_alive()
        if self.error is not None:
            raise self.error


def test_the_read_limit_follows_the_interval_unless_set(tmp_path: Path) -> None:
    """Realtime catches up at most the read limit a micro-batch: auto scales it with the
    interval the run uses."""
    auto = pipeline(tmp_path, CUSTOMER_TOTALS)
    assert read_limit(auto, 2) == 500_000
    assert read_limit(auto, 0.2) == 100_000
    written = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"max_records_per_trigger": "auto"})
    assert read_limit(written, 2) == 500_000
    fixed = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"max_records_per_trigger": 1_000})
    assert read_limit(fixed, 2) == 1_000
    unlimited = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"max_records_per_trigger": None})
    assert read_limit(unlimited, 2) is None


class StartingWriter:
    """A stream writer whose first starts fail with the errors given."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.starts = list(errors), 0

    def start(self) -> str:
        self.starts += 1
        if self.errors:
            raise self.errors.pop(0)
        return "query"


def test_a_query_start_is_tried_again_after_growing_waits_only_when_a_python_worker_was_slow() -> (
    None
):
    slow_error = RuntimeError(f"SparkException: {WORKER_SLOW_TO_START}.")
    said: list[str] = []
    waits: list[float] = []
    slow = StartingWriter(*[slow_error] * 4)
    assert start_query(slow, said.append, waits.append) == "query"  # type: ignore[arg-type]
    assert slow.starts == 5
    assert waits == [5, 10, 20, 30]
    assert "starting it again in 5 s (attempt 2 of 6)" in said[0]
    never = StartingWriter(*[slow_error] * QUERY_START_ATTEMPTS)
    with pytest.raises(RuntimeError, match=WORKER_SLOW_TO_START):
        start_query(never, said.append, waits.append)  # type: ignore[arg-type]
    assert never.starts == QUERY_START_ATTEMPTS
    broken = StartingWriter(RuntimeError("AnalysisException: no such column"))
    with pytest.raises(RuntimeError, match="no such column"):
        start_query(broken, said.append, waits.append)  # type: ignore[arg-type]
    assert broken.starts == 1


def test_a_micro_batch_lands_only_in_the_generation_its_query_started_in(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Once the switch went back (a newer generation took over from the progress), a
    later batch of the old query commits nothing, even where its range starts at that
    progress: it touches neither the batch nor the sink."""
    make_topic(records=100, buckets=1)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    checkpoint = tmp_path / "checkpoint"
    with open_sink(config) as sink:
        first = sink.start_generation({0: (0, 100)}, "first start", "d").number
        newer = sink.start_generation({0: (0, 200)}, "went back", "d")
        write_start(checkpoint, QueryStart(first, {0: 100}))
        log_offsets(checkpoint, 0, {"0": 150})
        with exclusive_run(sink, config, "realtime", holder="realtime run test"):
            commit = micro_batch.MicroBatchCommit(
                config, holder="realtime run test", checkpoint=str(checkpoint)
            )
            commit(None, 0)  # type: ignore[arg-type]
        held = sink.current_generation()
    assert held == newer


def log_offsets(checkpoint: Path, batch_id: int, offsets: dict[str, int]) -> None:
    """A micro-batch's end offsets as Spark logs them in the query's checkpoint."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    metadata = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
    text = f"v1\n{metadata}\n{json.dumps(offsets)}"
    (checkpoint / "offsets" / str(batch_id)).write_text(text)


def test_a_query_waiting_for_its_start_ends_once_its_run_stops_beating(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """On a shared Spark the query of a killed standby would wait on for ever: its empty
    micro-batches while it waits check that the run that armed it still beats."""
    make_topic(records=100, buckets=1)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, switch={"heartbeat_timeout": 0.2})
    checkpoint = tmp_path / "checkpoint"
    log_offsets(checkpoint, 0, {"waiting": 1})
    commit = micro_batch.MicroBatchCommit(
        config, holder="realtime run test", checkpoint=str(checkpoint), run_id="run-1"
    )
    with open_sink(config) as sink:
        sink.beat("run-1")
        commit(None, 0)  # type: ignore[arg-type]  # it beats: the batch is let be
        time.sleep(0.4)
        with pytest.raises(micro_batch.RunGone, match="run-1"):
            commit(None, 0)  # type: ignore[arg-type]
        assert sink.current_generation() is None  # nothing was touched


def test_an_armed_query_reads_nothing_until_the_switch_then_goes_on_exactly(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The standby arms its query while the backlog runs: Spark plans and runs it, but
    it reads nothing until ``run_realtime`` writes where it starts; from there on it is
    the realtime query, exactly once."""
    topic = make_topic(records=30_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.3})
    checkpoint = tmp_path / "checkpoint"
    said: list[str] = []
    with (
        open_sink(config) as sink,
        open_sink(config) as status_sink,
        armed_realtime(
            spark, config, RealtimeRun(checkpoint_dir=checkpoint, log=said.append)
        ) as armed,
    ):
        run_backlog(spark, config, sink, log=print)
        markers = reached(config)
        append_orders(topic, 5_000)
        time.sleep(2)  # micro-batch triggers pass: nothing is read or committed
        assert armed.query.isActive and reached(config) == markers
        waited = [str(p["sources"][0]["endOffset"]) for p in armed.query.recentProgress]
        assert waited and all('"waiting"' in offsets for offsets in waited), waited

        go_on_from_the_switch(spark, config, topic, (sink, status_sink), checkpoint, armed, said)
    assert_armed_query_went_on_exactly(config, topic, said)


def go_on_from_the_switch(
    spark: SparkSession,
    config: PipelineConfig,
    topic: Topic,
    sinks: tuple[Sink, Sink],
    checkpoint: Path,
    armed: ArmedQuery,
    said: list[str],
) -> None:
    """More records arrive; ``run_realtime`` goes on with the armed query until caught up."""
    append_orders(topic, 5_000)
    run_realtime(
        spark,
        config,
        *sinks,
        RealtimeRun(
            checkpoint_dir=checkpoint,
            should_stop=lambda: reached(config) == topic.latest_offsets(),
            log=said.append,
        ),
        armed=armed,
        source_reached=True,
    )


def assert_armed_query_went_on_exactly(
    config: PipelineConfig, topic: Topic, said: list[str]
) -> None:
    assert any("the query armed before the switch" in line for line in said)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def test_a_query_armed_beside_the_backlog_takes_the_realtime_settings_on_its_own_session(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog run that goes on as the realtime run arms its query on its own session
    while the backlog runs (``arm_beside``): the backlog keeps its settings, the query's
    copy of the session takes the realtime phase's with its first micro-batch, and from
    the switch on it is the realtime query, exactly once."""
    topic = make_topic(records=30_000, buckets=2)
    config = pipeline(
        tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.3, "shuffle_partitions": 3}
    )
    taken: list[str] = []

    def recorded(session: SparkSession, settings: dict[str, str | None]) -> None:
        apply_sql_settings(session, settings)
        taken.append(str(session.conf.get("spark.sql.shuffle.partitions")))

    monkeypatch.setattr(micro_batch, "apply_sql_settings", recorded)
    said: list[str] = []
    backlog_settings = {"spark.sql.shuffle.partitions": "11", "spark.sql.adaptive.enabled": "true"}
    apply_sql_settings(spark, backlog_settings)
    try:
        with (
            contextlib.ExitStack() as stack,
            open_sink(config) as sink,
            open_sink(config) as status_sink,
        ):
            armed = arm_beside(
                stack,
                spark,
                config,
                RealtimeRun(checkpoint_dir=tmp_path / "checkpoint", log=said.append),
                run_id="run-1",
                session_settings=sql_settings_after("local[2]", backlog_settings, {}),
            )
            report = run_backlog(spark, config, sink, log=print)
            query = armed()
            assert query is not None and query.query.isActive
            # The backlog's settings stayed on its session.
            partitions = report.spark_settings["spark.sql.shuffle.partitions"]
            assert spark.conf.get("spark.sql.shuffle.partitions") == partitions != "3"

            go_on_from_the_switch(
                spark, config, topic, (sink, status_sink), tmp_path / "checkpoint", query, said
            )
    finally:
        apply_sql_settings(spark, dict.fromkeys(backlog_settings))
    assert taken == ["3"], taken  # once, on the query's own session
    assert_armed_query_went_on_exactly(config, topic, said)


def test_realtime_refuses_to_start_before_the_backlog_is_done(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=1000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink, pytest.raises(BacklogNotFinished, match="run the backlog"):
        run_realtime(
            spark,
            config,
            sink,
            sink,
            RealtimeRun(checkpoint_dir=tmp_path / "c", should_stop=lambda: True),
        )


@pytest.mark.parametrize("read_here", [True, False], ids=["read-here", "spark-scan"])
def test_realtime_continues_from_the_backlog_state_exactly(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    read_here: bool,
) -> None:
    """Whether the commit reads a micro-batch's records itself or Spark's scan does (a
    batch with a bucket born since the query started is always Spark's scan)."""
    if not read_here:
        monkeypatch.setattr(micro_batch, "READ_HERE_MAX_RECORDS", {False: -1, True: -1})
    topic = make_topic(records=30_000, buckets=3)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.5})
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    markers = reached(config)
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    for _ in range(3):
        append_orders(topic, 4_000)
        time.sleep(0.7)
    topic.add_buckets(1)  # a bucket born during the realtime phase
    append_orders(topic, 4_000)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert set(reached(config)) == {0, 1, 2, 3}
    assert sum(topic.latest_offsets().values()) - sum(markers.values()) == 16_000
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def test_a_small_micro_batch_read_where_it_commits_is_aggregated_without_a_shuffle(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=2_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_source(config) as source:
        # A static read stands in for the stream's DataFrame: only its session and
        # schema are used when the records are read here.
        batch = source.read_batch(spark, read_schema(config, source))
        records, table = micro_batch._records_of(
            batch, batch.schema, source, {0: 0, 1: 0}, topic.latest_offsets(), windowed=False
        )
    plan = io.StringIO()
    with contextlib.redirect_stdout(plan):
        partial_results(records, config).explain()
    assert table is not None and table.num_rows == 2_000
    assert "HashAggregate" in plan.getvalue() and "Exchange" not in plan.getvalue()


def test_late_records_go_to_the_late_table_not_the_results(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=2)
    config = pipeline(
        tmp_path, REGION_MINUTES, name="region_minutes", realtime={"checkpoint_interval": 0.5}
    )
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    with Topic(topic.path) as log:
        before = records_up_to(log, log.latest_offsets())
    newest = before["event_time"].max()
    late_one = before.iloc[[0]].assign(order_id=10**9, event_time=newest - pd_minutes(5))
    on_time = before.iloc[[1]].assign(order_id=10**9 + 1, event_time=newest - pd_seconds(10))
    for row in (late_one, on_time):
        topic.append(0, pa.Table.from_pandas(row, preserve_index=False))
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        late = sink.read_late().to_pylist()
        results = sink.read_results().to_pandas()
    assert [(r["bucket"], r["offset"]) for r in late] == [(0, topic.latest_offsets()[0] - 2)]
    with Topic(topic.path) as log:
        everything = records_up_to(log, log.latest_offsets())
    kept = everything[everything["order_id"] != 10**9]
    assert_same(results, region_minutes_oracle(kept), ["region", "window_start"])


def pd_minutes(n: int):  # type: ignore[no-untyped-def]
    import pandas as pd

    return pd.Timedelta(minutes=n)


def pd_seconds(n: int):  # type: ignore[no-untyped-def]
    import pandas as pd

    return pd.Timedelta(seconds=n)


def test_a_killed_realtime_run_restarts_with_no_loss_or_duplicate(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=3)
    config = pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.3})
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    defs = write_defs(tmp_path / "defs" / "customer_totals", config, data=tmp_path)
    done = sum(reached(config).values())
    run = start_phase(defs, tmp_path, phase="realtime")
    deadline = time.monotonic() + 180
    while sum(reached(config).values()) == done:  # live load until a batch commits
        assert time.monotonic() < deadline, "the realtime run committed nothing"
        append_orders(topic, 1_000)
        time.sleep(0.3)
    append_orders(topic, 10_000)  # then kill it while this is in flight
    time.sleep(0.2)
    kill_all(run)
    assert done < sum(reached(config).values()) < sum(topic.latest_offsets().values())
    append_orders(topic, 5_000)
    rerun = start_phase(defs, tmp_path, phase="realtime")
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=180)
    rerun.send_signal(signal.SIGTERM)  # the driver only: it stops the query itself
    output, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, output
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def test_a_standby_run_switches_the_moment_the_backlog_lets_go(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=200_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    switched: list[bool] = []

    def standby(generation: int) -> None:
        with open_sink(config) as sink:
            switched.append(
                await_switch(config, sink, generation, lambda: False, print, poll_s=0.05)
            )

    with open_sink(config) as sink:
        generation = current_generation(sink, topic, config, print)  # the markers
        waiting = threading.Thread(target=standby, args=(generation.number,))
        waiting.start()
        time.sleep(1)
        assert waiting.is_alive()  # nothing reached the markers yet: it waits
        run_backlog(spark, config, sink, log=print)
        ended = time.time()
        waiting.join(30)
        assert switched == [True]
        change = sink.phase_history()[-1]
        assert change.phase == "realtime"
        assert change.cause == (
            "every bucket reached its marker (switched by the standby realtime run)"
        )
        assert change.changed_at - ended < 1.0

        # A standby follows a newer generation of its definition (the backlog went on
        # to new markers), and switches once that one's backlog is done.
        with Topic(config.source.path) as log:
            continue_backlog(sink, log, config, "test", None, print)
    standby(generation.number)
    assert switched == [True, True]
    # One replaced by a generation of another definition ends without switching.
    with open_sink(config) as sink, Topic(config.source.path) as log:
        markers = {b: (0, end) for b, end in log.latest_offsets().items()}
        sink.start_generation(markers, "reset", "another definition")
    standby(generation.number)
    assert switched == [True, True, False]
    # As Dagster runs it, such a standby ends unused: it materializes nothing.
    result = dg.materialize(
        [realtime_asset(config)],
        run_config={
            "ops": {
                "customer_totals_realtime": {
                    "config": {"standby_for_generation": generation.number}
                }
            }
        },
    )
    assert result.success
    assert result.asset_materializations_for_node("customer_totals_realtime") == []
