"""Where records come from: the ``Source`` contract and its implementations.

Only this package knows which implementation a pipeline's source names; the rest of the
code opens a source with ``open_source`` and depends on ``Source`` alone.
"""

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.source.base import Arrivals, Bounds, Payload, Source, SourceError


def open_source(config: PipelineConfig) -> Source:
    """The source ``source.kind`` names, opened; close it after use. ``SourceError`` if
    it is missing."""
    from backlog_dagster.log import Topic

    return Topic(config.source.path)


__all__ = ["Arrivals", "Bounds", "Payload", "Source", "SourceError", "open_source"]
