"""The settings a run's Spark starts with, and the Spark it is launched from."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from backlog_dagster.spark import home
from backlog_dagster.spark.session import LAUNCH_CONF, SparkSettingRefused, spark_config


def test_a_run_s_settings_come_after_the_project_s_and_a_connect_server_takes_sql_only() -> None:
    local = spark_config("local[2]", "run", {"spark.driver.memory": "1g"})
    assert local["spark.master"] == "local[2]" and local["spark.driver.memory"] == "1g"
    assert local["spark.ui.enabled"] == LAUNCH_CONF["spark.ui.enabled"]
    remote = spark_config("sc://127.0.0.1:15002", "run", {"spark.sql.shuffle.partitions": "4"})
    assert remote["spark.remote"] == "sc://127.0.0.1:15002"
    assert remote["spark.sql.shuffle.partitions"] == "4" and "spark.ui.enabled" not in remote
    with pytest.raises(SparkSettingRefused, match=r"spark\.driver\.memory"):
        spark_config("sc://127.0.0.1:15002", "run", {"spark.driver.memory": "1g"})


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
    assert home.installed_home() == Path(pyspark.__file__).parent
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")  # a Spark home the user set is kept
    assert home.spark_home() == Path("/opt/spark")
