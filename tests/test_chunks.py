"""Backlog chunks: their Spark jobs sized against a simulated job cost (a fixed part plus
a per-record one), and the results of a chunk's jobs merged as one job's."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest

from backlog_dagster.phases.chunks import (
    FIRST_CHUNK_RATE,
    FIRST_CHUNK_RECORDS,
    MAX_GROWTH,
    MIN_CHUNK_S,
    Timing,
    chunk_rate,
    goes_on,
    next_chunk_records,
)
from backlog_dagster.pipeline.config import TransformConfig
from backlog_dagster.pipeline.results import layout_of, merge_partials


def simulate(
    interval: float,
    fixed: float,
    per_record: float,
    previous_rate: float | None = None,
    backlog: int = 10**12,
) -> tuple[list[Timing], list[Timing]]:
    """The Spark jobs and the chunks (each read by one job or more, as the backlog reads
    them) of a backlog of ``backlog`` records, at most 12 chunks of it."""
    jobs: list[Timing] = []
    chunks: list[Timing] = []
    left = backlog
    while left and len(chunks) < 12:
        records, seconds = 0, 0.0
        while True:
            n = min(next_chunk_records(interval, jobs, left, previous_rate, seconds), left)
            jobs.append((n, fixed + n * per_record))
            left, records, seconds = left - n, records + n, seconds + jobs[-1][1]
            if not left or not goes_on(interval, seconds):
                break
        chunks.append((records, seconds))
    return jobs, chunks


@pytest.mark.parametrize(
    ("interval", "fixed", "per_record"),
    [
        (2, 0.8, 1 / 2_000_000),
        (5, 0.3, 1 / 500_000),
        (30, 0.8, 1 / 2_000_000),
        (30, 2.0, 1 / 15_000),  # a busy machine: the old first chunk took 70 s here
        (0.5, 0.8, 1 / 2_000_000),  # shorter than a chunk can usefully be
    ],
    ids=["2s", "5s", "30s", "30s-busy-machine", "0.5s"],
)
def test_chunks_settle_at_the_interval_without_outlasting_it(
    interval: float, fixed: float, per_record: float
) -> None:
    target = max(interval, MIN_CHUNK_S)
    jobs, chunks = simulate(interval, fixed, per_record)
    assert jobs[0][0] == min(FIRST_CHUNK_RATE * interval, FIRST_CHUNK_RECORDS)
    for (before, _), (after, _) in itertools.pairwise(jobs):
        assert after <= MAX_GROWTH * before
    assert all(seconds <= 1.5 * target for _, seconds in chunks)
    assert all(abs(seconds - target) <= 0.1 * target for _, seconds in chunks[-3:])


@pytest.mark.parametrize(
    ("interval", "fixed", "per_record", "before"),
    [
        (2, 0.5, 1 / 4_000_000, 2),
        (2, 0.5, 1 / 4_000_000, 0),  # the run before read its backlog in one chunk
        (5, 0.3, 1 / 500_000, 30),
        (30, 2.0, 1 / 15_000, 30),
    ],
    ids=["2s-after-2s", "2s-after-one-chunk", "5s-after-30s", "30s-busy-machine"],
)
def test_a_later_run_takes_the_interval_from_its_first_chunk(
    interval: float, fixed: float, per_record: float, before: float
) -> None:
    """Sized by the rate the run before left, every chunk of the next run takes about
    the interval, the first one too."""
    if before:
        earlier, _ = simulate(before, fixed, per_record)
    else:
        earlier = [(16_000_000, fixed + 16_000_000 * per_record)]
    jobs, chunks = simulate(interval, fixed, per_record, chunk_rate(earlier))
    target = max(interval, MIN_CHUNK_S)
    assert all(abs(seconds - target) <= 0.5 * target for _, seconds in chunks), chunks
    assert len(jobs) == len(chunks)  # sized right, no chunk needs a second job


@pytest.mark.parametrize(
    ("interval", "fixed", "per_record", "backlog"),
    [
        (2, 0.5, 1 / 4_000_000, 16_000_000),  # the bench's: the first chunks took 0.5 and 1 s
        (2, 0.8, 1 / 2_000_000, 16_000_000),
        (2, 0.3, 1 / 3_000_000, 21_000_000),
        (5, 0.3, 1 / 500_000, 16_000_000),
        (5, 0.3, 1 / 12_000_000, 40_000_000),  # under one interval after the first jobs
    ],
    ids=["2s-bench", "2s-slower", "2s-tail", "5s", "5s-short-backlog"],
)
def test_a_first_run_takes_the_interval_from_its_first_chunk_to_its_last(
    interval: float, fixed: float, per_record: float, backlog: int
) -> None:
    """The first chunk, sized before any job was timed, reads on in more jobs rather than
    commit short; short first jobs do not hold the next one back, and the backlog's last
    records are not left to a short last chunk."""
    jobs, chunks = simulate(interval, fixed, per_record, backlog=backlog)
    assert sum(records for records, _ in chunks) == backlog
    target = max(interval, MIN_CHUNK_S)
    assert all(abs(seconds - target) <= 0.5 * target for _, seconds in chunks), (jobs, chunks)


def test_what_is_left_under_two_chunks_is_read_in_two_halves_or_one() -> None:
    timings = [(1_000_000, 2.0)]
    planned = next_chunk_records(2, timings, 10**9)
    assert next_chunk_records(2, timings, 2 * planned) == planned
    assert next_chunk_records(2, timings, planned + 11) == (planned + 11 + 1) // 2
    assert next_chunk_records(2, timings, planned) == planned
    assert next_chunk_records(2, timings, 5) == 5


def test_the_results_of_a_chunks_jobs_merge_as_one_jobs() -> None:
    """Per key (a null key too): counts and sums add, min and max keep the extreme, each
    sketch is the union of its parts, in the columns and types Spark gave."""
    from datasketches import hll_sketch, tgt_hll_type

    def hll(*values: str) -> bytes:
        sketch = hll_sketch(12, tgt_hll_type.HLL_8)
        for value in values:
            sketch.update(value)
        return sketch.serialize_compact()

    layout = layout_of(
        pipeline_transform(
            {"name": "n", "function": "count"},
            {"name": "total", "function": "sum", "column": "amount"},
            {"name": "low", "function": "min", "column": "amount"},
            {"name": "high", "function": "max", "column": "amount"},
            {"name": "seen", "function": "count_distinct", "column": "customer_id"},
        )
    )
    schema = pa.schema(
        [
            ("region", pa.string()),
            ("n", pa.int64()),
            ("total", pa.float64()),
            ("low", pa.float64()),
            ("high", pa.float64()),
            ("_seen_hll", pa.binary()),
        ]
    )
    first = pa.table(
        [["a", None], [2, 1], [3.0, 1.0], [1.0, 1.0], [2.0, 1.0], [hll("x"), hll("y")]],
        schema=schema,
    )
    second = pa.table(
        [
            ["b", "a", None],
            [1, 3, 1],
            [5.0, 6.0, None],
            [5.0, 0.5, None],
            [5.0, 4.0, None],
            [hll("z"), hll("x", "w"), None],
        ],
        schema=schema,
    )
    merged = merge_partials([first, second], layout)
    assert merged.schema == schema
    rows = {row["region"]: row for row in merged.to_pylist()}
    assert set(rows) == {"a", "b", None}
    assert (rows["a"]["n"], rows["a"]["total"], rows["a"]["low"], rows["a"]["high"]) == (
        5,
        9.0,
        0.5,
        4.0,
    )
    assert (rows[None]["n"], rows[None]["total"], rows[None]["low"]) == (2, 1.0, 1.0)
    assert rows["b"] == second.to_pylist()[0]
    estimate = hll_sketch.deserialize(rows["a"]["_seen_hll"]).get_estimate()
    assert round(estimate) == 2
    assert merge_partials([first], layout).equals(first)


def pipeline_transform(*aggregations: dict[str, str]) -> TransformConfig:
    return TransformConfig.model_validate({"keys": ["region"], "aggregations": aggregations})
