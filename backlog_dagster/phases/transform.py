"""The declared transform as a Spark plan producing partial results (see pipeline.results)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.results import WINDOW_END, WINDOW_START, Partial, layout_of
from backlog_dagster.spark.records import BUCKET_COLUMN, OFFSET_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame


class TransformError(ValueError):
    """The transform names something the source does not have."""


def partial_results(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """Filter, derive, (window,) group by the keys and compute each partial aggregate."""
    from pyspark.sql import functions as F

    transform = config.transform
    if transform.filter:
        records = records.where(F.expr(transform.filter))
    for name, expression in transform.columns.items():
        records = records.withColumn(name, F.expr(expression))
    missing = [k for k in transform.keys if k not in records.columns]
    if missing:
        raise TransformError(
            f"pipeline {config.name}: transform.keys names {', '.join(missing)}, which the "
            f"source does not have (columns: {', '.join(records.columns)})"
        )
    group: list[Column] = [F.col(k) for k in transform.keys]
    if transform.window is not None:
        if config.source.event_time not in records.columns:
            raise TransformError(
                f"pipeline {config.name}: a window needs source.event_time, and "
                f"{config.source.event_time!r} is not a source column"
            )
        size = f"{round(transform.window.size * 1_000_000)} microseconds"
        window = F.window(F.col(config.source.event_time), size)
        group += [window.start.alias(WINDOW_START), window.end.alias(WINDOW_END)]
    aggregates = [_partial(p) for p in layout_of(transform, config.source.event_time).partials]
    return records.groupBy(*group).agg(*aggregates)


def window_end(config: PipelineConfig) -> Column:
    """The end of the tumbling window each record falls in (windowed pipelines only)."""
    from pyspark.sql import functions as F

    assert config.transform.window is not None
    size = f"{round(config.transform.window.size * 1_000_000)} microseconds"
    return F.window(F.col(config.source.event_time), size).end


def _partial(partial: Partial) -> Column:
    from pyspark.sql import functions as F

    value = F.lit(1) if partial.column is None else F.expr(partial.column)
    function = {"count": F.count, "sum": F.sum, "min": F.min, "max": F.max}[partial.function]
    return function(value).alias(partial.name)


@dataclass(frozen=True)
class BucketSeen:
    """What a Spark job read of one bucket: its offsets ``[low, high]`` and latest event time."""

    low: int
    high: int
    event_time_us: int | None


def observe_buckets(
    records: DataFrame, config: PipelineConfig, buckets: list[int]
) -> tuple[DataFrame, Callable[[], dict[int, BucketSeen] | None]]:
    """``records`` with per-bucket offsets and latest event time observed as they flow by.

    An observation rides along whatever job reads ``records`` first (no second pass over
    the data); the function returned gives its result after that job ran: the buckets
    that had records, or None if some record came from a bucket not in ``buckets``.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    observation = Observation("buckets")
    bucket, offset = F.col(BUCKET_COLUMN), F.col(OFFSET_COLUMN)
    event_time = F.unix_micros(F.col(config.source.event_time))
    measures = [F.count(F.when(~bucket.isin(buckets), 1)).alias("unknown")]
    for b in buckets:
        mine = bucket == b
        measures += [
            F.min(F.when(mine, offset)).alias(f"low_{b}"),
            F.max(F.when(mine, offset)).alias(f"high_{b}"),
            F.max(F.when(mine, event_time)).alias(f"time_{b}"),
        ]

    def seen() -> dict[int, BucketSeen] | None:
        values = observation.get
        if values.get("unknown"):
            return None
        return {
            b: BucketSeen(values[f"low_{b}"], values[f"high_{b}"], values[f"time_{b}"])
            for b in buckets
            if values.get(f"low_{b}") is not None
        }

    return records.observe(observation, *measures), seen
