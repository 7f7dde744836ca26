"""The settings a run's Spark starts with, and the Spark it is launched from."""

from __future__ import annotations

from pathlib import Path

import pyspark
import pytest

from backlog_dagster.spark.session import LAUNCH_CONF, SparkSettingRefused, spark_config, spark_home


def test_a_run_s_settings_come_after_the_project_s_and_a_connect_server_takes_sql_only() -> None:
    local = spark_config("local[2]", "run", {"spark.driver.memory": "1g"})
    assert local["spark.master"] == "local[2]" and local["spark.driver.memory"] == "1g"
    assert local["spark.ui.enabled"] == LAUNCH_CONF["spark.ui.enabled"]
    remote = spark_config("sc://127.0.0.1:15002", "run", {"spark.sql.shuffle.partitions": "4"})
    assert remote["spark.remote"] == "sc://127.0.0.1:15002"
    assert remote["spark.sql.shuffle.partitions"] == "4" and "spark.ui.enabled" not in remote
    with pytest.raises(SparkSettingRefused, match=r"spark\.driver\.memory"):
        spark_config("sc://127.0.0.1:15002", "run", {"spark.driver.memory": "1g"})


def test_spark_is_launched_from_the_installation_unless_the_user_set_a_spark_home(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert spark_home() == Path(pyspark.__file__).parent
    assert (spark_home() / "bin" / "spark-submit").exists()
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert spark_home() == Path("/opt/spark")
