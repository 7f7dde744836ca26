"""The declared transform as a Spark plan producing partial results (see pipeline.results)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.results import WINDOW_END, WINDOW_START, Partial, layout_of

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
