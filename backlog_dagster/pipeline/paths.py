"""Where a pipeline's relative data paths point (the log, a SQLite sink, reference data,
realtime checkpoints), with or without Dagster."""

from __future__ import annotations

import os
from pathlib import Path

from backlog_dagster.pipeline.config import PipelineConfig

#: The folder relative data paths point into, when set.
DATA_ENV = "BACKLOG_DAGSTER_DATA"


def data_root(project_root: Path) -> Path:
    """Where relative data paths point: ``$BACKLOG_DAGSTER_DATA``, else ``<project>/.data``."""
    return Path(os.environ.get(DATA_ENV, project_root / ".data"))


def with_paths_under(config: PipelineConfig, root: Path) -> PipelineConfig:
    """The config with its relative paths (source, SQLite sink, reference data, realtime
    checkpoints) made absolute under ``root``."""
    source = config.source
    if source.path is not None:
        source = source.model_copy(update={"path": str(root / source.path)})
    if source.archive is not None:
        archive = source.archive.model_copy(update={"path": str(root / source.archive.path)})
        source = source.model_copy(update={"archive": archive})
    sink = config.sink
    if sink.kind == "sqlite":
        sink = sink.model_copy(update={"path": str(root / sink.path)})
    transform = config.transform
    if transform.join is not None and transform.join.path is not None:
        join = transform.join.model_copy(update={"path": str(root / transform.join.path)})
        transform = transform.model_copy(update={"join": join})
    realtime = config.realtime.model_copy(
        update={"checkpoint_location": str(root / config.realtime.checkpoint_location)}
    )
    return config.model_copy(
        update={"source": source, "sink": sink, "transform": transform, "realtime": realtime}
    )
