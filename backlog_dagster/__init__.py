"""backlog-dagster: catch a PySpark pipeline up at batch speed, then keep it live.

Importing the package stays light (no pyspark import), so Dagster definitions load fast.
"""

__version__ = "0.1.0"

from backlog_dagster.components import BacklogPipeline

__all__ = ["BacklogPipeline"]
