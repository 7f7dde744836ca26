"""The settings a run's Spark starts with, the class-data archive its driver maps, and
the Spark home it is launched from."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from backlog_dagster.spark import class_archive, home
from backlog_dagster.spark.session import spark_config
from backlog_dagster.tools.class_archive import write_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_OPTIONS = class_archive.DRIVER_JAVA_OPTIONS


def test_a_local_driver_is_given_the_class_archive_when_one_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    archive = tmp_path / "spark-driver.jsa"
    monkeypatch.setattr(class_archive, "archive_path", lambda: archive)
    option = f"-XX:SharedArchiveFile={archive}"
    assert JAVA_OPTIONS not in spark_config("local[*]", "run")  # none written yet
    archive.write_bytes(b"written by backlog-dagster spark class-archive")
    assert spark_config("local[*]", "run")[JAVA_OPTIONS] == option
    assert spark_config("spark://127.0.0.1:7077", "run")[JAVA_OPTIONS] == option
    # The run's own Java options come after it; a driver with jars of its own on its
    # classpath would not fit the archive, and a Connect server started without it.
    given = spark_config("local[*]", "run", {JAVA_OPTIONS: "-Dwhy=1"})
    assert given[JAVA_OPTIONS] == f"{option} -Dwhy=1"
    jars = spark_config("local[*]", "run", {"spark.driver.extraClassPath": "/opt/x.jar"})
    assert JAVA_OPTIONS not in jars
    assert JAVA_OPTIONS not in spark_config("sc://127.0.0.1:15002", "run")


def test_a_local_driver_maps_the_class_archive() -> None:
    """With ``-Xshare:on`` a JVM refuses to start unless it maps every archive it is
    given: a driver started through the project's settings runs a job."""
    path = write_archive(log=lambda _: None)  # make wrote it already
    assert f"-XX:SharedArchiveFile={path}" in spark_config("local[1]", "t")[JAVA_OPTIONS]
    started = subprocess.run(
        [
            sys.executable,
            "-c",
            "from backlog_dagster.implementations import open_session; "
            "spark = open_session('local[1]', 'archive-test', "
            "{'spark.driver.extraJavaOptions': '-Xshare:on'}); "
            "print('rows', spark.range(3).count())",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert "rows 3" in started.stdout


def imported_pyspark(spark: SparkSession) -> str:
    """Where the Python workers of ``spark`` import PySpark from."""
    from pyspark.sql import functions as F

    @F.udf("string", useArrow=False)
    def pyspark_file(_: int) -> str:
        import pyspark

        return str(pyspark.__file__)

    row = spark.range(1).select(pyspark_file("id").alias("file")).first()
    assert row is not None
    return str(row["file"])


def test_spark_is_launched_from_the_installation_without_its_zipped_pyspark(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    launch = home.launch_home()
    assert home.launch_home() == launch  # made once
    assert (launch / "bin" / "spark-submit").exists()
    assert sorted(p.name for p in (launch / "jars").iterdir()) == sorted(
        p.name for p in (home.installed_home() / "jars").iterdir()
    )
    assert not (launch / "python").exists()
    assert home.spark_home() == launch
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")  # a Spark home the user set is kept
    assert home.spark_home() == Path("/opt/spark")


def test_spark_s_python_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    """Not the zipped copy Spark puts first on their path, whose modules every process
    compiles again."""
    assert imported_pyspark(spark) == str(home.installed_home() / "__init__.py")
