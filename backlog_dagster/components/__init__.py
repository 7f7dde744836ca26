"""Dagster wiring: the component users declare in YAML, and what it builds."""

from backlog_dagster.components.pipeline import BacklogPipeline

__all__ = ["BacklogPipeline"]
