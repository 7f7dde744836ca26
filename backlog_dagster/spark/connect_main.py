"""The application ``spark-submit`` runs for the project's Spark Connect server.

Spark's own server class (``SparkConnectServer``) forces per-session artifact isolation:
every client session gets class loaders and a Python worker factory of its own, so each
Dagster run generates and compiles its query plans' classes again and starts its own
Python daemons, kept until the server stops. A server that serves one project's runs
shares them: Spark's documented plugin (``spark.plugins=...SparkConnectPlugin``) starts
the same Connect service inside any application, and this one, a driver with isolation
off (``spark.sql.artifact.isolation.enabled=false``, given on the command line by
``spark.servers``), only keeps Spark up until it stops (on SIGTERM, through Spark's
shutdown hook). Nothing here is compiled: the driver is Python, the service Spark's.
"""

from __future__ import annotations

import time


def main() -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    context = spark.sparkContext
    while not context._jsc.sc().isStopped():
        time.sleep(1)


if __name__ == "__main__":
    main()
