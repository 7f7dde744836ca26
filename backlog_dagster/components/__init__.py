"""Dagster wiring: the component users declare in YAML (``pipeline.py``), and what it builds.

Importing the package imports no Dagster: ``tools.dev_server`` (how the demo, tests and
benches run ``dagster dev``) lives here too, and the ``backlog-dagster`` command imports
it, so every command would otherwise pay Dagster's import (0.6 s of the 1.1 s of CPU
``backlog-dagster --help`` took). ``backlog_dagster.BacklogPipeline`` names the component.
"""
