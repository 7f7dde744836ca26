"""Backlog chunk sizing against a simulated chunk cost: a fixed part plus a per-record one."""

from __future__ import annotations

import itertools

import pytest

from backlog_dagster.phases.chunks import (
    FIRST_CHUNK_RATE,
    FIRST_CHUNK_RECORDS,
    MAX_GROWTH,
    MIN_CHUNK_S,
    chunk_rate,
    next_chunk_records,
)


def simulate(
    interval: float,
    fixed: float,
    per_record: float,
    previous_rate: float | None = None,
    backlog: int = 10**12,
) -> list[tuple[int, float]]:
    """The chunks of a backlog of ``backlog`` records (at most 12 of them)."""
    timings: list[tuple[int, float]] = []
    left = backlog
    while left and len(timings) < 12:
        records = min(next_chunk_records(interval, timings, left, previous_rate), left)
        timings.append((records, fixed + records * per_record))
        left -= records
    return timings


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
    timings = simulate(interval, fixed, per_record)
    assert timings[0][0] == min(FIRST_CHUNK_RATE * interval, FIRST_CHUNK_RECORDS)
    for (before, _), (after, _) in itertools.pairwise(timings):
        assert after <= MAX_GROWTH * before
    assert all(seconds <= 1.5 * target for _, seconds in timings)
    assert all(abs(seconds - target) <= 0.1 * target for _, seconds in timings[-3:])


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
        earlier = simulate(before, fixed, per_record)
    else:
        earlier = [(16_000_000, fixed + 16_000_000 * per_record)]
    timings = simulate(interval, fixed, per_record, chunk_rate(earlier))
    target = max(interval, MIN_CHUNK_S)
    assert all(abs(seconds - target) <= 0.5 * target for _, seconds in timings), timings


@pytest.mark.parametrize(
    ("interval", "fixed", "per_record", "backlog"),
    [
        (2, 0.5, 1 / 4_000_000, 16_000_000),  # the bench's: the first chunks took 0.5 and 1 s
        (2, 0.8, 1 / 2_000_000, 16_000_000),
        (2, 0.3, 1 / 3_000_000, 21_000_000),
        (5, 0.3, 1 / 500_000, 16_000_000),
    ],
    ids=["2s-bench", "2s-slower", "2s-tail", "5s"],
)
def test_a_first_run_takes_the_interval_from_its_second_chunk_to_its_last(
    interval: float, fixed: float, per_record: float, backlog: int
) -> None:
    """Short first chunks do not hold the next one back, and the backlog's last records
    are not left to a short last chunk."""
    timings = simulate(interval, fixed, per_record, backlog=backlog)
    assert sum(records for records, _ in timings) == backlog
    target = max(interval, MIN_CHUNK_S)
    assert all(abs(seconds - target) <= 0.5 * target for _, seconds in timings[1:]), timings


def test_what_is_left_under_two_chunks_is_read_in_two_halves_or_one() -> None:
    timings = [(1_000_000, 2.0)]
    planned = next_chunk_records(2, timings, 10**9)
    assert next_chunk_records(2, timings, 2 * planned) == planned
    assert next_chunk_records(2, timings, planned + 11) == (planned + 11 + 1) // 2
    assert next_chunk_records(2, timings, planned) == planned
    assert next_chunk_records(2, timings, 5) == 5
