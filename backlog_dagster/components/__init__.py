"""Dagster wiring: the component users declare in YAML (``component.py``), what it builds
(``assets.py``), the switch sensor, the observations the UI shows and the scaffolder.

Importing the package imports no Dagster (``backlog_dagster.BacklogPipeline`` names the
component, and imports it when asked).
"""
