"""Paced micro-batch starts: each query's slot, spread from the other live queries'."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from backlog_dagster.spark.pacing import STALE_AFTER_S, Pacer, widest_gap_middle


@pytest.mark.parametrize(
    ("phases", "expected"),
    [
        ([], 0.0),
        ([0.0], 0.5),
        ([0.0, 0.25], 0.625),
        ([0.1, 0.2, 0.9], 0.55),
        ([1.1, 0.3], 0.7),  # taken modulo the interval: 1.1 is 0.1
    ],
)
def test_the_phase_taken_is_the_middle_of_the_widest_gap(
    phases: list[float], expected: float
) -> None:
    assert widest_gap_middle(1.0, phases) == pytest.approx(expected)


def circular_distance(a: float, b: float, interval: float) -> float:
    d = abs(a - b) % interval
    return min(d, interval - d)


def test_queries_on_one_machine_spread_their_slots_and_start_on_them(tmp_path: Path) -> None:
    interval = 0.3
    pacers = [Pacer(interval, folder=tmp_path) for _ in range(3)]
    for pacer in pacers:
        pacer.wait()
        assert pacer.phase is not None
        late = (time.time() - pacer.phase) % interval
        assert late < 0.05, "the wait ends on the query's slot"
    phases = [p.phase for p in pacers]
    assert phases[0] == 0.0 and phases[1] == pytest.approx(interval / 2)
    closest = min(
        circular_distance(a, b, interval) for i, a in enumerate(phases) for b in phases[i + 1 :]
    )
    assert closest == pytest.approx(interval / 4)


def test_a_stopped_querys_slot_is_given_up(tmp_path: Path) -> None:
    stopped = tmp_path / "stopped.json"
    stopped.write_text(json.dumps({"interval": 1.0, "phase": 0.0}))
    old = time.time() - STALE_AFTER_S - 1
    os.utime(stopped, (old, old))
    live = Pacer(1.0, folder=tmp_path, name="live")
    live.wait()
    assert live.phase == 0.0  # the stopped query's slot, free again
    assert not stopped.exists()


def test_a_query_whose_file_was_removed_takes_a_slot_again(tmp_path: Path) -> None:
    pacer = Pacer(0.2, folder=tmp_path)
    pacer.wait()
    next(tmp_path.glob("*.json")).unlink()
    pacer.wait()
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_a_micro_batch_that_overran_its_slot_is_followed_at_once(tmp_path: Path) -> None:
    pacer = Pacer(0.2, folder=tmp_path)
    pacer.wait()
    time.sleep(0.45)  # a micro-batch longer than the interval: the query is behind
    begun = time.monotonic()
    pacer.wait()
    assert time.monotonic() - begun < 0.02
    pacer.wait()  # one that fits: back on the query's slots
    assert pacer.phase is not None
    assert (time.time() - pacer.phase) % 0.2 < 0.05


def test_a_folder_that_cannot_be_written_leaves_spark_s_own_phase(tmp_path: Path) -> None:
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    pacer = Pacer(0.2, folder=not_a_folder / "slots")
    pacer.wait()
    pacer.wait()
    assert pacer.phase == 0.0
