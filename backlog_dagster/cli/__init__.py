"""The ``backlog-dagster`` command."""

from __future__ import annotations

import click

from backlog_dagster.cli.kafka import kafka_group
from backlog_dagster.cli.log import log_group
from backlog_dagster.cli.pipeline import pipeline_group
from backlog_dagster.cli.spark import spark_group
from backlog_dagster.tools.demo import demo


@click.group()
@click.version_option(package_name="backlog-dagster")
def main() -> None:
    """Catch a Spark pipeline up at batch speed, then keep it live at streaming latency."""


main.add_command(log_group)
main.add_command(demo)
main.add_command(pipeline_group)
main.add_command(spark_group)
main.add_command(kafka_group)
