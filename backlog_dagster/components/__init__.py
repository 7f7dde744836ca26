"""Dagster wiring: the component users declare in YAML, and what it builds.

Dagster is imported only when the component is asked for: ``dev_server`` (how the demo,
tests and benches run ``dagster dev``) lives here too, and the ``backlog-dagster``
command imports it, so every command would otherwise pay Dagster's import (0.6 s of the
1.1 s of CPU ``backlog-dagster --help`` took).
"""

from typing import Any

__all__ = ["BacklogPipeline"]


def __getattr__(name: str) -> Any:
    if name == "BacklogPipeline":
        from backlog_dagster.components.pipeline import BacklogPipeline

        return BacklogPipeline
    raise AttributeError(f"module 'backlog_dagster.components' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
