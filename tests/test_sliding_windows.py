"""Sliding windows: each record counts in every window it falls in, in the backlog and in
realtime, and a record late for some of its windows still counts in the others."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from pydantic import ValidationError
from pyspark.sql import DataFrame, SparkSession

from backlog_dagster.log import Topic
from backlog_dagster.phases import micro_batch
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.bad_records import DEAD_LETTER
from backlog_dagster.phases.micro_batch import _late_candidates
from backlog_dagster.phases.transform import earliest_window_ends, partial_results, window_ends
from backlog_dagster.pipeline.config import PipelineConfig, WindowConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.source.records import APPENDED_COLUMN, BUCKET_COLUMN, OFFSET_COLUMN
from backlog_dagster.source.schema import TIMESTAMP
from tests.conftest import MakeTopic
from tests.pipelines import (
    CUSTOMER_TOTALS,
    REGION_MINUTES,
    assert_same,
    in_chunks,
    records_up_to,
)
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached

SIZE_S, SLIDE_S = 60, 20
#: Keyed by a band that is null for large orders: those are dead letters, once each.
SLIDING = {
    "columns": {"band": "CASE WHEN amount > 500 THEN NULL ELSE region END"},
    "keys": ["band"],
    "window": {"size": f"{SIZE_S}s", "slide": f"{SLIDE_S}s", "allowed_lateness": "30s"},
    "aggregations": [
        {"name": "orders", "function": "count"},
        {"name": "total_amount", "function": "sum", "column": "amount"},
    ],
}


def sliding_oracle(records: pd.DataFrame, too_late: dict[int, int] | None = None) -> pd.DataFrame:
    """Per band and window: count and sum, each record in each window it falls in but
    those ``too_late`` (order id → watermark µs) came for (windows ending by then)."""
    records = records[records["amount"] <= 500]
    at = records["event_time"].astype("datetime64[us, UTC]").astype("int64")
    size, slide = SIZE_S * 1_000_000, SLIDE_S * 1_000_000
    last = at - at % slide
    rows = []
    for k in range(-(-size // slide)):
        start = last - k * slide
        inside = start + size > at
        rows.append(records[inside].assign(start=start[inside]))
    exploded = pd.concat(rows)
    for order_id, mark in (too_late or {}).items():
        closed = (exploded["order_id"] == order_id) & (exploded["start"] + size <= mark)
        exploded = exploded[~closed]
    starts = pd.to_datetime(exploded["start"], unit="us", utc=True)
    return (
        exploded.assign(window_start=starts.dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        .rename(columns={"region": "band"})
        .groupby(["band", "window_start"])
        .agg(orders=("amount", "size"), total_amount=("amount", "sum"))
        .reset_index()
    )


def test_a_record_falls_in_size_over_slide_windows() -> None:
    window = WindowConfig.model_validate({"size": "60s", "slide": "20s"})
    assert window_ends(65_000_000, window) == [80_000_000, 100_000_000, 120_000_000]
    assert window_ends(60_000_000, window) == [80_000_000, 100_000_000, 120_000_000]
    uneven = WindowConfig.model_validate({"size": "50s", "slide": "20s"})
    assert window_ends(65_000_000, uneven) == [70_000_000, 90_000_000, 110_000_000]
    tumbling = WindowConfig.model_validate({"size": "60s"})
    assert window_ends(65_000_000, tumbling) == [120_000_000] and not tumbling.sliding
    with pytest.raises(ValidationError, match="slide"):
        WindowConfig.model_validate({"size": "20s", "slide": "60s"})


@pytest.mark.parametrize(
    "window", [{"size": "60s"}, {"size": "60s", "slide": "20s"}, {"size": "50s", "slide": "20s"}]
)
def test_records_read_here_give_the_late_candidates_spark_gives(
    spark: SparkSession, window: dict[str, str]
) -> None:
    """The late check's candidates found in the Arrow table a micro-batch was read into
    are those Spark's filter finds: the same window ends, the nulls left out."""
    rng = np.random.default_rng(3)
    base = 1_700_000_000_000_000
    times = base + rng.integers(0, 600_000_000, 2_000)
    times[:4] = [base, base + 20_000_000, base + 60_000_000, base + 59_999_999]  # edges
    valid = rng.random(2_000) > 0.05
    records = pa.table(
        {
            BUCKET_COLUMN: pa.array(rng.integers(0, 4, 2_000), pa.int32()),
            OFFSET_COLUMN: pa.array(np.arange(2_000), pa.int64()),
            "ts": pa.array(times, pa.int64(), mask=~valid).cast(TIMESTAMP),
            APPENDED_COLUMN: pa.array(times + 1_000, pa.int64()).cast(TIMESTAMP),
        }
    )
    config = PipelineConfig.model_validate(
        {
            "name": "late_candidates",
            "source": {"path": "unused", "event_time": "ts"},
            "transform": {
                "keys": ["k"],
                "window": window,
                "aggregations": [{"name": "n", "function": "count"}],
            },
            "sink": {"path": "unused.sqlite", "table": "late_candidates"},
        }
    )
    assert config.transform.window is not None
    expected = [window_ends(int(t), config.transform.window)[0] for t in times]
    assert earliest_window_ends(times, config.transform.window).tolist() == expected
    batch = spark.createDataFrame(records)
    highest = base + 300_000_000
    for by_arrival in (True, False):
        here = _late_candidates(batch, records, config, highest, by_arrival)
        there = _late_candidates(batch, None, config, highest, by_arrival)
        assert 0 < here.num_rows < valid.sum()
        assert here.schema.types == there.schema.types
        assert here.sort_by("offset").to_pylist() == there.sort_by("offset").to_pylist()


def keyed_by_k(
    name: str, window: dict[str, str], aggregations: list[dict[str, Any]]
) -> PipelineConfig:
    """A pipeline over records held in memory: keyed by ``k``, event time ``ts``."""
    return PipelineConfig.model_validate(
        {
            "name": name,
            "source": {"path": "unused", "event_time": "ts"},
            "transform": {"keys": ["k"], "window": window, "aggregations": aggregations},
            "sink": {"path": "unused.sqlite", "table": name},
        }
    )


@pytest.mark.parametrize(
    "window", [{"size": "60s", "slide": "20s"}, {"size": "50s", "slide": "20s"}]
)
def test_by_panes_the_partials_are_those_of_a_row_per_window(
    spark: SparkSession, window: dict[str, str]
) -> None:
    """Aggregated once per pane (the size and slide's greatest common divisor) and merged
    into the windows, every partial equals the one a row per window gives: counts, sums,
    minima and maxima exactly, the distinct count's sketch to the same estimate, the
    quantiles' sketch over the same records; a bad record stays one dead letter."""
    from pyspark.sql import functions as F

    rng = np.random.default_rng(5)
    n = 3_000
    base = 1_700_000_000_000_000
    times = base + rng.integers(-50_000_000, 400_000_000, n)
    times[:3] = [base, base + 10_000_000, base + 49_999_999]  # pane and window edges
    keys = np.where(rng.random(n) < 0.02, None, rng.choice(["a", "b", "c"], n))
    records = pa.table(
        {
            "k": pa.array(keys.tolist(), pa.string()),
            "ts": pa.array(times, pa.int64()).cast(TIMESTAMP),
            "v": pa.array(rng.normal(100, 30, n)),
            "who": pa.array(rng.integers(0, 400, n).astype(str).tolist(), pa.string()),
            BUCKET_COLUMN: pa.array(np.zeros(n), pa.int32()),
            OFFSET_COLUMN: pa.array(np.arange(n), pa.int64()),
        }
    )
    config = keyed_by_k(
        "panes",
        window,
        [
            {"name": "n", "function": "count"},
            {"name": "total", "function": "sum", "column": "v"},
            {"name": "low", "function": "min", "column": "v"},
            {"name": "high", "function": "max", "column": "v"},
            {"name": "mean", "function": "avg", "column": "v"},
            {"name": "who", "function": "count_distinct", "column": "who"},
            {"name": "v", "function": "quantiles", "column": "v", "quantiles": [0.5]},
        ],
    )
    batch = spark.createDataFrame(records)
    by_panes = partial_results(batch, config)
    # A late window no record is in: the same records, one row per window they fall in.
    per_window = partial_results(batch, config, late_windows={(7, 0): [-1]})

    def readable(partials: DataFrame) -> pd.DataFrame:
        columns = [c for c in partials.columns if not c.endswith(("_hll", "_kll"))]
        hll = next(c for c in partials.columns if c.endswith("_hll"))
        kll = next(c for c in partials.columns if c.endswith("_kll"))
        table = partials.select(
            *columns,
            F.hll_sketch_estimate(hll).alias("distinct"),
            F.kll_sketch_get_n_double(kll).alias("kll_n"),
        )
        frame = table.toPandas()
        frame[DEAD_LETTER] = frame[DEAD_LETTER].map(lambda d: None if d is None else d["offset"])
        order = ["k", "window_start", DEAD_LETTER]
        return frame.sort_values(order, ignore_index=True, na_position="first")

    got, expected = readable(by_panes), readable(per_window)
    # A dead letter's row keeps only the letter (its aggregates are not kept).
    letters = got[DEAD_LETTER].dropna().tolist()
    assert letters == expected[DEAD_LETTER].dropna().tolist()
    assert len(letters) == (keys == None).sum() > 0  # noqa: E711
    good, expected_good = got[got[DEAD_LETTER].isna()], expected[expected[DEAD_LETTER].isna()]
    assert len(good) > 30
    pd.testing.assert_frame_equal(good, expected_good, check_exact=False, rtol=1e-12)


def test_sliding_windows_in_backlog_then_realtime_equal_the_oracle(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=2)
    config = in_chunks(tmp_path, SLIDING, "bands")
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
        letters = sink.read_dead_letters().to_pandas()
    before = records_up_to(topic, topic.latest_offsets())
    assert_same(results, sliding_oracle(before), ["band", "window_start"])
    # A bad record is one dead letter, not one per window it falls in.
    assert len(letters) == (before["amount"] > 500).sum() > 0
    assert letters[["bucket", "offset"]].duplicated().sum() == 0

    # In realtime: one record late for the first of its windows, one on time for all.
    newest = before["event_time"].max()
    partly = before.iloc[[0]].assign(order_id=10**9, event_time=newest - pd.Timedelta(seconds=55))
    fully = before.iloc[[1]].assign(order_id=10**9 + 1, event_time=newest - pd.Timedelta(minutes=5))
    fine = before.iloc[[2]].assign(order_id=10**9 + 2, event_time=newest - pd.Timedelta(seconds=5))
    for row in (partly, fully, fine):
        topic.append(0, pa.Table.from_pandas(row, preserve_index=False))
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        late = sink.read_late().to_pandas()
        results = sink.read_results().to_pandas()
    end = topic.latest_offsets()[0]
    assert sorted(late["offset"]) == [end - 3, end - 2]
    marks = late.set_index("offset")["watermark"].astype("datetime64[us, UTC]").astype("int64")
    with Topic(topic.path) as log:
        everything = records_up_to(log, log.latest_offsets())
    too_late = {10**9: int(marks[end - 3]), 10**9 + 1: int(marks[end - 2])}
    oracle = sliding_oracle(everything, too_late)
    assert_same(results, oracle, ["band", "window_start"])
    # The partly late record still counts in its windows that were open.
    partly_windows = window_ends(
        int(pd.Timestamp(partly["event_time"].iloc[0]).value // 1000),
        config.transform.window,  # type: ignore[arg-type]
    )
    assert any(e > too_late[10**9] for e in partly_windows)
    assert any(e <= too_late[10**9] for e in partly_windows)


def spark_compilations(spark: SparkSession) -> Any:
    """Spark's count of the classes it compiled for plans (``getCount()``), JVM-wide."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()


def test_each_micro_batch_s_late_windows_compile_no_new_code(spark: SparkSession) -> None:
    """The windows records came too late for are left out by their (bucket, offset,
    window start) as data: a micro-batch with other late records than the last one's
    runs the code Spark generated for it, where a filter naming them had Spark compile
    new code each time (it writes a literal's value into the code); and the rows left
    out are exactly those windows'."""
    compilations = spark_compilations(spark)
    n, slide_us, size_us = 600, SLIDE_S * 1_000_000, SIZE_S * 1_000_000
    base = 1_700_000_040_000_000  # a multiple of the slide
    records = pa.table(
        {
            "k": pa.array(["a", "b", "c"] * (n // 3), pa.string()),
            "ts": pa.array(base + np.arange(n) * 100_000, pa.int64()).cast(TIMESTAMP),
            "v": pa.array(np.ones(n)),
            BUCKET_COLUMN: pa.array(np.arange(n) % 2, pa.int32()),
            OFFSET_COLUMN: pa.array(np.arange(n), pa.int64()),
        }
    )
    config = keyed_by_k(
        "late_windows",
        {"size": f"{SIZE_S}s", "slide": f"{SLIDE_S}s"},
        [{"name": "n", "function": "count"}],
    )
    batch = spark.createDataFrame(records)
    # Every record here falls in the windows starting at base - 2 slides, - 1 and + 0.
    first_end = base - 2 * slide_us + size_us

    def counts(late: dict[tuple[int, int], list[int]]) -> dict[tuple[str, int], int]:
        rows = partial_results(batch, config, late_windows=late).collect()
        return {(r["k"], int(r["window_start"].timestamp() * 1e6)): r["n"] for r in rows}

    everything = counts({(0, first_end): [-1]})
    before = compilations.getCount()
    late = {(0, first_end): [0, 2, 4], (1, first_end + slide_us): [1, 3]}
    got = counts(late)
    assert compilations.getCount() == before
    # Offsets 0, 3 are key a, 1, 4 key b, 2 key c (offset % 3).
    start = base - 2 * slide_us
    expected = dict(everything)
    for key, window_start in [("a", start), ("c", start), ("b", start), ("b", start + slide_us)]:
        expected[key, window_start] -= 1
    expected["a", start + slide_us] -= 1
    assert got == expected


@pytest.mark.parametrize(
    ("transform", "read_here"),
    [(SLIDING, True), (REGION_MINUTES, True), (CUSTOMER_TOTALS, True), (CUSTOMER_TOTALS, False)],
    ids=["sliding", "tumbling", "no windows", "no windows, Spark's scan"],
)
def test_a_warm_realtime_query_compiles_no_new_code_whatever_its_micro_batches_hold(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    transform: dict[str, Any],
    read_here: bool,
) -> None:
    """Once warm, a realtime query's micro-batches run the code Spark generated for the
    first ones, whatever each holds (a watermark moving on, records late for windows
    that closed): nothing a micro-batch plans may carry its own values as literals, or
    Spark compiles new code for every one. Sliding, tumbling and no windows, records read
    where the commit runs; and without windows through Spark's scan (a large
    micro-batch). A large windowed micro-batch's late check names the watermark as a
    literal on purpose (``micro_batch._late_candidates``: cheaper than any join)."""
    if not read_here:
        monkeypatch.setattr(micro_batch, "READ_HERE_MAX_RECORDS", {False: -1, True: -1})
    compilations = spark_compilations(spark)
    topic = make_topic(records=2_000, buckets=1)
    config = in_chunks(tmp_path, transform, "guarded")
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
    with Topic(topic.path) as log:
        newest = records_up_to(log, log.latest_offsets())["event_time"].max()
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    counts = []
    try:
        for round_ in range(5):
            # On time (the watermark moves on), and late for every window it falls in.
            rows = records_up_to(topic, topic.latest_offsets()).iloc[[round_, round_ + 10]]
            rows = rows.assign(
                order_id=[10**9 + 2 * round_, 10**9 + 2 * round_ + 1],
                event_time=[
                    newest + pd.Timedelta(seconds=round_),
                    newest - pd.Timedelta(seconds=90 + 5 * round_),
                ],
            )
            topic.append(0, pa.Table.from_pandas(rows, preserve_index=False))
            wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
            counts.append(compilations.getCount())
    finally:
        runner.stop()
    if "window" in transform:
        with open_sink(config) as sink:
            assert len(sink.read_late().to_pandas()) == 5
    # The first micro-batches plan each path once; the last two add nothing.
    assert counts[-1] == counts[2], counts
