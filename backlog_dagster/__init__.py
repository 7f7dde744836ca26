"""backlog-dagster: catch a PySpark pipeline up at batch speed, then keep it live.

Importing the package stays light: no pyspark, and Dagster only when the component is
asked for. Spark's Python workers and a Spark Connect server's commit process import
the package too, each at its start, and need neither (Dagster alone took 0.9 s of it).
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["BacklogPipeline"]


def __getattr__(name: str) -> Any:
    """``backlog_dagster.BacklogPipeline``, as Dagster's YAML and ``dg`` name it."""
    if name == "BacklogPipeline":
        from backlog_dagster.components.component import BacklogPipeline

        return BacklogPipeline
    raise AttributeError(f"module 'backlog_dagster' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
