"""How many records the next backlog chunk takes, so that it lasts about the interval.

Each chunk is given the records the latest chunks' rate (their records over their
seconds, from the start of each job to its commit) reads in ``checkpoint_interval``.
That rate counts what a chunk costs whatever its size (planning and starting the Spark
job, collecting its results, the sink's commit of every key it touched), so the chunks
settle where they take the interval: a chunk that ran long lowers the rate and the next
is smaller, one that ran short raises it. Counting the fixed part, that rate undershoots
while chunks are short; the line through the last two chunks' (records, seconds) sees
the fixed part, and takes the next chunk to the interval in a step or two.

Below about ``MIN_CHUNK_S`` that fixed part is most of a chunk, and a rate that counts
it would shrink each next chunk until the backlog crawls (measured before: 0.5 s
chunks ran at 2,000 to 17,000 records/s): a chunk is planned to take at least that.

The first chunk of a run is sized by the rate the pipeline's previous backlog run
left in the sink (``phases.progress.RunProgress.chunk_rate``): the same records and
transform, usually on the same Spark, so its first chunk takes about the interval too
(without it, measured: the first chunks of a 2 s interval took 0.5 and 1 s, so only
about half of them were within ±50 % of it). A pipeline's first backlog has no such
rate. Earlier, its first chunk had a million records a second of interval: on a busy
machine's slower rate, a 30 s interval's first chunk took every record and 70 s. So
that first chunk assumes a modest rate and has at most ``FIRST_CHUNK_RECORDS``, and a
chunk takes at most ``MAX_GROWTH`` times the records of the one before: a rate
measured on small chunks is not trusted far beyond them.

While the latest chunks all took under half the interval (a first backlog's first
chunk), their fixed part is a large share of each and their rate undershoots: the next
chunk takes one and a half times what that rate reads in the interval. That cannot run
past one and a half intervals whatever the fixed part (the chunk's records cost at most
what they cost in the rate, and its own fixed part is at most theirs: measured at a 2 s
interval, the second chunk took 1.0 s by the rate alone).

The backlog's last records are not left to a short last chunk (measured: 0.7 s at a
2 s interval): what is left under two chunks is read in two halves, and under one in
one. The halves are of time: a chunk that has read for a while already (below) takes
that much less, so that it and the last chunk take about as long.

A chunk is what commits, and it may be read by more than one Spark job: while it has
taken under half the interval (``goes_on``) it reads on in another job, sized to the rest
of it, and the jobs' results merge before the one commit. So a chunk sized before its
rate was known does not commit short: a first backlog's first chunks (measured at a 2 s
interval on a warm session, before: 0.3 and 0.6 s, the later chunks about 2 s), or a
first chunk sized by a slower hour's rate. The sizing above goes job by job (its
timings are the jobs'). Whether a chunk goes on is judged by the interval as set, not
by ``MIN_CHUNK_S``: a short interval still commits often.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The rate (records/s) the first chunk is sized by, before any chunk has been timed,
#: and the most records it takes.
FIRST_CHUNK_RATE = 250_000
FIRST_CHUNK_RECORDS = 500_000
MIN_CHUNK_RECORDS = 10_000
#: A chunk is planned to take at least this long (s).
MIN_CHUNK_S = 2.0
#: A chunk takes at most this many times the records of the one before.
MAX_GROWTH = 8
#: The rate is that of this many of the latest chunks: it changes as the machine's
#: load does.
RECENT = 3

#: A timed chunk: (records, seconds from the start of its job to its commit).
Timing = tuple[int, float]


def next_chunk_records(
    interval: float,
    timings: Sequence[Timing],
    left: int,
    previous_rate: float | None = None,
    elapsed: float = 0.0,
) -> int:
    """The records for the next Spark job of a chunk of about ``interval`` seconds
    (``interval`` > 0), ``elapsed`` seconds into that chunk, with ``left`` records still
    to read; ``timings``: the jobs' so far; ``previous_rate``: the records/s of the
    pipeline's previous backlog run, if known."""
    rest = max(interval, MIN_CHUNK_S) - elapsed
    planned = _planned(interval, rest, timings, previous_rate)
    if left >= 2 * planned:
        return planned
    if left <= planned:
        return left
    # Two halves in time: the chunk under way has already spent ``elapsed``.
    spent = int(elapsed * planned / rest)
    return -(-(left - spent) // 2)


def goes_on(interval: float, elapsed: float) -> bool:
    """Whether a chunk that has taken ``elapsed`` seconds so far reads on in another
    Spark job before it commits (never with ``interval`` 0: one job reads it all)."""
    return elapsed < interval / 2


def _planned(
    interval: float, target: float, timings: Sequence[Timing], previous_rate: float | None
) -> int:
    if not timings and previous_rate:
        return max(MIN_CHUNK_RECORDS, int(previous_rate * target))
    if not timings:
        return max(MIN_CHUNK_RECORDS, min(int(FIRST_CHUNK_RATE * interval), FIRST_CHUNK_RECORDS))
    # The rate counts each chunk's fixed part, so it undershoots while chunks are
    # shorter than the target; the line through the last two chunks sees the fixed
    # part and gets there sooner (within reason: noise can flatten that line).
    by_rate = int(chunk_rate(timings) * target)
    short = all(seconds <= target / 2 for _, seconds in timings[-RECENT:])
    least = int(1.5 * by_rate) if short else by_rate
    records = max(least, min(_by_last_two(timings, target), 3 * by_rate))
    return max(MIN_CHUNK_RECORDS, min(records, MAX_GROWTH * timings[-1][0]))


def _by_last_two(timings: Sequence[Timing], target: float) -> int:
    """Where the line through the last two chunks reaches ``target`` (0 when they are
    too alike in size to draw it, or it does not rise)."""
    if len(timings) < 2:
        return 0
    (n1, s1), (n2, s2) = timings[-2], timings[-1]
    if abs(n2 - n1) < 0.2 * max(n1, n2):
        return 0
    slope = (s2 - s1) / (n2 - n1)
    return int(n2 + (target - s2) / slope) if slope > 0 else 0


def chunk_rate(timings: Sequence[Timing]) -> float:
    """Records per second of the latest Spark jobs timed, their fixed costs counted."""
    recent = timings[-RECENT:]
    return sum(n for n, _ in recent) / max(sum(s for _, s in recent), 1e-3)
