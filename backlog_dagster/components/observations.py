"""What the pipeline's assets show in Dagster's UI: events a reader takes in at a glance.

Every event carries a one-line description (the Events list shows it) and the same four
keys, ``phase``, ``phase_since``, ``generation`` and ``where`` (the pipeline's state in
one line, as the sensor's ticks and the asset checks say it), so the asset's overview
says where the pipeline is without opening an event. That overview shows the newest
materialization's metadata once the asset has one (Dagster 1.13), observations only
before: so the realtime run's status is a materialization (its commits do change the
results), and its last one says where the pipeline went when the run ended.

One vocabulary: a backlog in progress and a finished one have the same keys
(``records_done``, ``records_total``, ``percent_done``, ``read_rate``); a count is a
number, a rate and a duration are text with their unit and what they count; a time is
written as ``phases.progress.clock`` writes it. Per-bucket values are tables.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import dagster as dg

from backlog_dagster.phases.progress import (
    BacklogProgress,
    RealtimeLag,
    clock,
    readable_duration,
    realtime_where,
)

if TYPE_CHECKING:
    from backlog_dagster.phases.realtime import RealtimeStatus
    from backlog_dagster.sink import BucketState, PhaseChange, Sink

#: The ``event`` of the observation that reports buckets reaching their markers (the Fluss
#: seed's name for it).
FINISH_EVENT = "BacklogFinishEvent"


def phase_metadata(
    phase: str, since: float, generation: int, where: str
) -> dict[str, dg.MetadataValue]:
    """The keys every observation carries: where the pipeline is."""
    return {
        "phase": dg.MetadataValue.text(phase),
        "phase_since": dg.MetadataValue.text(clock(since)),
        "generation": dg.MetadataValue.int(generation),
        "where": dg.MetadataValue.text(where),
    }


def read_rate(records_per_s: float | None) -> dg.MetadataValue:
    """The backlog run's reading rate, saying what it counts."""
    if not records_per_s:
        return dg.MetadataValue.text("not measured yet (the run has not read a chunk)")
    return dg.MetadataValue.text(
        f"{records_per_s:,.0f} records/s read, since the run began to read"
    )


def phase_observation(
    key: dg.AssetKey, phase: str, since: float, generation: int, where: str
) -> dg.AssetObservation:
    """The phase, on an asset whose own events would otherwise tell an older story."""
    return dg.AssetObservation(
        asset_key=key,
        description=where,
        metadata=phase_metadata(phase, since, generation, where),
    )


def backlog_observation(
    key: dg.AssetKey, progress: BacklogProgress, since: float
) -> dg.AssetObservation:
    """The backlog's progress while a run works: done of total, per bucket, rate, ETA."""
    where = progress.describe()
    metadata = {
        **phase_metadata("backlog", since, progress.generation, where),
        "percent_done": dg.MetadataValue.float(round(progress.percent, 1)),
        "records_done": dg.MetadataValue.int(progress.done),
        "records_total": dg.MetadataValue.int(progress.total),
        "read_rate": read_rate(progress.records_per_s),
        "eta": dg.MetadataValue.text(
            "unknown" if progress.eta_s is None else readable_duration(progress.eta_s)
        ),
        "round": dg.MetadataValue.int(progress.round),
        "buckets": dg.MetadataValue.table(
            records=[
                dg.TableRecord(
                    {
                        "bucket": b.bucket,
                        "done": b.done,
                        "total": b.total,
                        "percent": round(b.percent, 1),
                    }
                )
                for b in progress.buckets
            ],
            schema=dg.TableSchema(
                columns=[
                    dg.TableColumn("bucket", "int"),
                    dg.TableColumn("done", "int"),
                    dg.TableColumn("total", "int"),
                    dg.TableColumn("percent", "float"),
                ]
            ),
        ),
    }
    if progress.arrival_per_s:
        metadata["arrival_rate"] = dg.MetadataValue.text(
            f"{progress.arrival_per_s:,.0f} records/s arriving at the source"
        )
    return dg.AssetObservation(asset_key=key, description=where, metadata=metadata)


def finish_observation(
    key: dg.AssetKey, generation: int, reached: list[BucketState], left: int
) -> dg.AssetObservation:
    """The buckets that reached their markers at one tick, each reported once."""
    names = ", ".join(str(b.bucket) for b in reached)
    which = (
        f"buckets {names} reached their markers"
        if len(reached) > 1
        else f"bucket {names} reached its marker {reached[0].marker:,}"
    )
    to_go = f"{left:,} bucket(s) to go" if left else "every bucket has"
    return dg.AssetObservation(
        asset_key=key,
        description=f"{which} (generation {generation}; {to_go})",
        metadata={
            "event": FINISH_EVENT,
            "generation": generation,
            "buckets": dg.MetadataValue.table(
                records=[
                    dg.TableRecord({"bucket": b.bucket, "marker": b.marker, "reached": b.reached})
                    for b in reached
                ],
                schema=dg.TableSchema(
                    columns=[dg.TableColumn(c, "int") for c in ("bucket", "marker", "reached")]
                ),
            ),
        },
    )


def finished_buckets(observation: dg.AssetObservation) -> list[tuple[int, int, int]]:
    """(generation, bucket, marker) of each bucket a finish observation reports; none for
    any other observation."""
    metadata = observation.metadata
    event, generation, buckets = (metadata.get(k) for k in ("event", "generation", "buckets"))
    if event is None or event.value != FINISH_EVENT:
        return []
    assert isinstance(generation, dg.IntMetadataValue) and generation.value is not None
    assert isinstance(buckets, dg.TableMetadataValue)
    rows = [(row.data["bucket"], row.data["marker"]) for row in buckets.records]
    return [(generation.value, int(bucket or 0), int(marker or 0)) for bucket, marker in rows]


def backlog_finished_metadata(
    sink: Sink, generation: int, records: int, seconds: float
) -> dict[str, dg.MetadataValue]:
    """The backlog run's materialization, which its asset's overview shows from then on:
    the phase the pipeline went on in, what the backlog read and how fast, under the keys
    of a backlog in progress."""
    history = sink.phase_history()
    phase = history[-1].phase if history else "backlog"
    where = f"backlog finished: {records:,} records in {readable_duration(seconds)}"
    if phase == "realtime":
        where += ", the pipeline streams"
    return {
        **phase_metadata(phase, _since(history), generation, where),
        "records_done": dg.MetadataValue.int(records),
        "percent_done": dg.MetadataValue.float(100.0),
        "read_rate": read_rate(records / seconds if seconds else None),
        "duration": dg.MetadataValue.text(readable_duration(seconds)),
        "finished_at": dg.MetadataValue.text(clock(time.time())),
    }


def realtime_metadata(
    status: RealtimeStatus, since: float, generation: int
) -> dict[str, dg.MetadataValue]:
    """The realtime run's status: the lag net of the allowed lateness, in records and
    seconds of input, the rate, the records set aside; offsets per bucket as a table."""
    lag = RealtimeLag(sum(status.offset_lag.values()), status.offset_lag, status.input_lag_s)
    where = realtime_where(lag)
    if status.late_records or status.bad_records:
        where += f"; {status.late_records:,} late, {status.bad_records:,} bad records set aside"
    metadata: dict[str, dg.MetadataValue] = {
        **phase_metadata("realtime", since, generation, where),
        "lag_records": dg.MetadataValue.int(lag.records),
        "records": dg.MetadataValue.int(status.records),
        "commit_rate": dg.MetadataValue.text(
            f"{status.records_per_s:,.0f} records/s committed, over the last status interval"
        ),
        "batches": dg.MetadataValue.int(status.batches),
        "late_records": dg.MetadataValue.int(status.late_records),
        "bad_records": dg.MetadataValue.int(status.bad_records),
        "buckets": _offsets_table(status.offsets, status.offset_lag),
    }
    if lag.input_lag_s is not None:
        metadata["lag"] = dg.MetadataValue.text(
            f"{readable_duration(max(0.0, lag.input_lag_s))} of input"
        )
    if status.watermark is not None:
        metadata["watermark"] = dg.MetadataValue.text(status.watermark)
    return metadata


def realtime_ended_metadata(status: RealtimeStatus, sink: Sink) -> dict[str, dg.MetadataValue]:
    """The realtime run's last status, under the phase the pipeline is in as the run ends
    (back in backlog, as a rule): what the realtime asset's overview goes on showing."""
    history = sink.phase_history()
    metadata = realtime_metadata(status, _since(history), _generation(sink))
    if history and history[-1].phase != "realtime":
        change = history[-1]
        where = f"{change.phase} since {clock(change.changed_at)}: {change.cause}"
        metadata |= phase_metadata(change.phase, change.changed_at, change.generation, where)
    return metadata


def _since(history: list[PhaseChange]) -> float:
    """Since when the pipeline is in its current phase."""
    return history[-1].changed_at if history else time.time()


def _generation(sink: Sink) -> int:
    generation = sink.current_generation()
    return 0 if generation is None else generation.number


def _offsets_table(offsets: dict[int, int], lag: dict[int, int]) -> dg.TableMetadataValue:
    buckets: Iterable[int] = sorted(set(offsets) | set(lag))
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord({"bucket": b, "offset": offsets.get(b, 0), "lag_records": lag.get(b, 0)})
            for b in buckets
        ],
        schema=dg.TableSchema(
            columns=[dg.TableColumn(c, "int") for c in ("bucket", "offset", "lag_records")]
        ),
    )


def realtime_reporter(
    key: dg.AssetKey,
    sink: Sink,
    report_every: float,
    log_event: Callable[[dg.AssetMaterialization | dg.AssetCheckEvaluation], None],
    check: Callable[[], dg.AssetCheckEvaluation | None] = lambda: None,
) -> Callable[[RealtimeStatus], None]:
    """The realtime run's ``on_status``: a materialization when something worth knowing
    changed (a bucket appeared, records were set aside as late or bad), else one every
    ``report_every`` seconds, each followed by ``check``'s evaluation; the evaluation
    alone at a status where its verdict changed."""
    last: dict[str, Any] = {"at": -math.inf, "seen": None, "passed": None}

    def report(status: RealtimeStatus) -> None:
        seen = (tuple(sorted(status.offsets)), status.late_records, status.bad_records)
        now = time.monotonic()
        evaluation = check()
        if seen != last["seen"] or now - last["at"] >= report_every:
            last.update(at=now, seen=seen)
            metadata = realtime_metadata(status, _since(sink.phase_history()), _generation(sink))
            description = str(metadata["where"].value)
            log_event(dg.AssetMaterialization(key, description=description, metadata=metadata))
        elif evaluation is None or evaluation.passed == last["passed"]:
            return
        if evaluation is not None:
            last["passed"] = evaluation.passed
            log_event(evaluation)

    return report
