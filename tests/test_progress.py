"""Where a pipeline is, in numbers and words: backlog progress and ETA, the keeps_up rule."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from backlog_dagster.components.switch import keeps_up_verdict
from backlog_dagster.phases.policy import MIN_LAG_GROWTH, lag_grew
from backlog_dagster.phases.progress import (
    NEW_ROUND,
    RunProgress,
    backlog_progress,
    backlog_round,
    published_run,
    readable_duration,
)
from backlog_dagster.sink import BucketState, Generation, PhaseChange, open_sink
from tests.pipelines import CUSTOMER_TOTALS, pipeline
from tests.test_sink_contract import on_sink


def generation(reached: tuple[int, int]) -> Generation:
    buckets = {
        0: BucketState(0, 0, 1_000_000, reached[0]),
        1: BucketState(1, 100, 1_000_100, reached[1]),
    }
    return Generation(1, 0.0, "first start", "", buckets)


def run(records: int, seconds: float, read_to: dict[int, int], arrival: float = 0.0) -> RunProgress:
    return RunProgress("r", 1, 1_000.0, 1_000.0 + seconds, records, read_to, arrival)


def test_progress_counts_the_chunk_under_way_and_the_eta_follows_the_rate(tmp_path: Path) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    # Nothing committed; Spark's finished read tasks stand for 250,000 records per bucket.
    progress = backlog_progress(
        generation((0, 100)), run(500_000, 10, {0: 250_000, 1: 250_100}), config
    )
    assert (progress.done, progress.total) == (500_000, 2_000_000)
    assert [b.percent for b in progress.buckets] == [25.0, 25.0]
    assert progress.records_per_s == 50_000
    assert progress.eta_s == 30  # 1,500,000 left at 50,000/s
    assert progress.describe() == "catching up 25 % (500,000 of 2,000,000 records), ETA 30 s"
    # The markers strategy's switch does not wait for what arrives meanwhile.
    arriving = backlog_progress(
        generation((0, 100)), run(500_000, 10, {0: 250_000, 1: 250_100}, 20_000), config
    )
    assert arriving.eta_s == 30
    # A chunk under way never counts past a marker; a finished bucket is 100 %.
    done = backlog_progress(generation((1_000_000, 500_100)), run(1, 1, {1: 1_400_100}), config)
    assert [b.percent for b in done.buckets] == [100.0, 100.0]
    assert done.eta_s == 0
    # A chunk read whose commit is in flight counts once: before and after it lands.
    for reached in ((0, 100), (400_000, 100)):
        both = backlog_progress(generation(reached), run(800_000, 10, {0: 400_000}), config)
        assert both.done == 400_000


def test_with_a_lag_threshold_the_eta_counts_what_arrives(tmp_path: Path) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS, backlog={"watermark_lag_threshold": 60})
    gaining = backlog_progress(generation((0, 100)), run(500_000, 10, {}, 20_000), config)
    assert gaining.eta_s == pytest.approx(2_000_000 / 30_000)
    losing = backlog_progress(generation((0, 100)), run(500_000, 10, {}, 60_000), config)
    assert losing.eta_s is None
    assert losing.describe().endswith("records), not gaining on the input")


def test_progress_of_another_generation_or_none_yet(tmp_path: Path) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    other = RunProgress("r", 2, 0.0, 10.0, 500, {0: 500})
    progress = backlog_progress(generation((0, 100)), other, config)
    assert progress.done == 0 and progress.records_per_s is None and progress.eta_s is None
    assert progress.describe() == "catching up 0 % (0 of 2,000,000 records)"


def test_a_backlog_that_took_new_markers_at_the_logs_end_says_which_round_it_is_in(
    tmp_path: Path,
) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    extended = f"{NEW_ROUND}, but 396,051 records arrived meanwhile"
    history = [
        PhaseChange(1, "backlog", 0.0, "first start"),
        PhaseChange(2, "backlog", 1.0, extended),
        PhaseChange(3, "backlog", 2.0, extended),
    ]
    assert backlog_round(history[:1]) == 1 and backlog_round(history) == 3
    # A way back starts the rounds again.
    back = [*history, PhaseChange(3, "realtime", 3.0, "x"), PhaseChange(4, "backlog", 4.0, "lag")]
    assert backlog_round(back) == 1
    second = backlog_progress(generation((0, 100)), None, config, history[:2])
    assert second.describe() == (
        "catching up, round 2: 0 % (0 of 2,000,000 records that arrived during round 1)"
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_sink_keeps_the_newest_published_progress(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None
    config = on_sink(pipeline(tmp_path, CUSTOMER_TOTALS, switch={"status_every": 1}), kind, dsn)
    now = time.time()
    with open_sink(config) as sink:
        assert sink.published_progress() is None
        sink.publish_progress("a", run(1, 1, {0: 1}).to_json())
        fresh = RunProgress("b", 1, now - 5, now, 7, {0: 3, 1: 4}, 12.5)
        sink.publish_progress("b", fresh.to_json())
        assert published_run(sink, config, now) == fresh
        # Older than three heartbeats: the run may be gone, its figures are not shown.
        assert published_run(sink, config, now + 3.5) is None


def test_durations_read_as_people_say_them() -> None:
    assert [readable_duration(s) for s in (0.84, 40, 200, 3_600, 7_500)] == [
        "0.8 s",
        "40 s",
        "3 min 20 s",
        "1 h",
        "2 h 5 min",
    ]


def test_a_growing_lag_is_one_that_rose_through_the_window() -> None:
    now, window = 1_000.0, 180.0
    rising = [(now - window + 6 * i, 20_000 + 1_000 * i) for i in range(31)]
    assert lag_grew(rising, window, now)
    # Noise: a lag that goes up and down by a micro-batch is not growing.
    noisy = [(t, 20_000 + (5_000 if i % 2 else 0)) for i, (t, _) in enumerate(rising)]
    assert not lag_grew(noisy, window, now)
    # Risen, but by less than MIN_LAG_GROWTH records.
    small = [(t, 1_000 + i * (MIN_LAG_GROWTH // 40)) for i, (t, _) in enumerate(rising)]
    assert not lag_grew(small, window, now)
    # Samples that do not cover the window yet say nothing.
    assert not lag_grew(rising[-10:], window, now)


def test_keeps_up_says_what_failed_and_what_to_do() -> None:
    history = [PhaseChange(1, "backlog", 0.0, "first start"), PhaseChange(1, "realtime", 1, "x")]
    passed, description, _ = keeps_up_verdict(history, 100.0)
    assert passed and description.startswith("0 way(s) back")
    passed, description, _ = keeps_up_verdict(history, 100.0, lag_growth=(12_000, 450_000))
    assert not passed
    assert "the realtime lag grew from 12,000 to 450,000 records" in description
    assert "more resources" in description
    passed, description, _ = keeps_up_verdict(history, 100.0, watermark_over=(50.0, 45.0))
    assert not passed and "watermark lag (50 s) is over the threshold (45 s)" in description


def test_the_realtime_runs_last_status_says_where_the_pipeline_went(tmp_path: Path) -> None:
    from backlog_dagster.components.observations import (
        backlog_finished_metadata,
        realtime_ended_metadata,
    )
    from backlog_dagster.phases.realtime import RealtimeStatus

    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    status = RealtimeStatus(records=5, offsets={0: 10}, offset_lag={0: 2}, input_lag_s=1.5)
    with open_sink(config) as sink:
        first = sink.start_generation({0: (0, 10)}, "first start", "d")
        sink.record_phase(first.number, "backlog", "first start")
        done = backlog_finished_metadata(sink, first.number, 1_234_567, 75)
        assert done["phase"].value == "backlog"
        assert "1,234,567 records in 1 min 15 s" in str(done["where"].value)
        # The keys of a backlog in progress, with the same meaning.
        assert done["records_done"].value == 1_234_567 and done["percent_done"].value == 100
        assert done["read_rate"].value == "16,461 records/s read, since the run began to read"
        sink.record_phase(first.number, "realtime", "markers reached")
        running = realtime_ended_metadata(status, sink)
        assert running["phase"].value == "realtime"
        assert str(running["where"].value) == "streaming, lag 1.5 s of input (2 records)"
        assert running["lag"].value == "1.5 s of input"
        back = sink.continue_generation({0: 20}, "watermark lag 50 s above the threshold")
        assert back is not None
        ended = realtime_ended_metadata(status, sink)
        assert (ended["phase"].value, ended["generation"].value) == ("backlog", back.number)
        assert "watermark lag 50 s above the threshold" in str(ended["where"].value)
        # The run's own figures stay beside the phase.
        assert ended["lag_records"].value == 2
