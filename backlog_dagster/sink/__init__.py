"""Where results and progress go: the ``Sink`` contract and its implementations.

Only this package knows which implementation a pipeline's ``sink.kind`` names; the rest
of the code opens a sink with ``open_sink`` and depends on ``Sink`` alone.
"""

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.results import layout_of
from backlog_dagster.pipeline.secrets import resolve
from backlog_dagster.sink.base import (
    DEAD_LETTER_COLUMNS,
    BucketState,
    Generation,
    GenerationEnded,
    PhaseChange,
    ProgressConflict,
    Sink,
    SinkUnreachable,
)


def open_sink(config: PipelineConfig) -> Sink:
    """The pipeline's sink, opened (tables created if missing); close it after use.

    A connection string read from the environment is read now, in the process that
    uses it (``pipeline.secrets``).
    """
    sink, layout = config.sink, layout_of(config.transform)
    if sink.kind == "postgres":
        from backlog_dagster.sink.postgres import open_postgres_sink

        dsn = resolve(sink.dsn, "sink.dsn")
        return open_postgres_sink(
            dsn, sink.db_schema, sink.table, config.name, layout, sink.describe()
        )
    from backlog_dagster.sink.sqlite import open_sqlite_sink

    return open_sqlite_sink(sink.path, sink.table, config.name, layout)


def for_other_processes(config: PipelineConfig) -> PipelineConfig:
    """``config`` with the sink's settings read from the environment now, for code that
    opens the sink in a process without this one's environment (a Spark Connect server
    runs a realtime query's commits). The value travels to that process only."""
    sink = config.sink
    if sink.kind != "postgres" or isinstance(sink.dsn, str):
        return config
    resolved = sink.model_copy(update={"dsn": resolve(sink.dsn, "sink.dsn")})
    return config.model_copy(update={"sink": resolved})


__all__ = [
    "DEAD_LETTER_COLUMNS",
    "BucketState",
    "Generation",
    "GenerationEnded",
    "PhaseChange",
    "ProgressConflict",
    "Sink",
    "SinkUnreachable",
    "for_other_processes",
    "open_sink",
]
