"""A machine or an install that lacks what a pipeline needs gets one sentence saying what
to install: Java missing or too old, Spark Connect without the connect extra, a
PostgreSQL sink without its driver. (The user's-project test meets the extras for real,
in a virtualenv that has none.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from backlog_dagster import extras
from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.load import PipelineFileError, load_pipeline
from backlog_dagster.spark import java
from backlog_dagster.spark.resource import spark_resource

PIPELINE = """type: backlog_dagster.BacklogPipeline
attributes:
  name: per_user
  source: {{path: events, event_time: event_time}}
  transform:
    keys: [user_id]
    aggregations: [{{name: records, function: count}}]
  sink: {sink}
  spark_master: {master}
"""


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Make the named modules look not installed."""

    def hide(*modules: str) -> None:
        monkeypatch.setattr(extras, "_importable", lambda module: module not in modules)

    return hide


def write(tmp_path: Path, sink: str, master: str = "local[*]") -> Path:
    defs = tmp_path / "defs.yaml"
    defs.write_text(PIPELINE.format(sink=sink, master=master))
    return defs


def test_a_postgres_sink_without_its_driver_is_refused_at_load_naming_file_line_and_field(
    tmp_path: Path, without
) -> None:  # type: ignore[no-untyped-def]
    without("psycopg")
    defs = write(tmp_path, "{kind: postgres, dsn: 'host=localhost', table: per_user}")
    with pytest.raises(PipelineFileError) as error:
        load_pipeline(defs)
    said = str(error.value)
    assert str(defs) in said and "sink.kind" in said
    assert "needs the psycopg driver" in said
    assert "pip install 'backlog-dagster[postgres]'" in said
    load_pipeline(write(tmp_path, "{path: results.sqlite, table: per_user}"))  # SQLite needs none


def test_a_spark_connect_url_without_the_connect_extra_is_refused_at_load_and_at_run(
    tmp_path: Path, without, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    without("grpc_status")
    sink = "{path: results.sqlite, table: per_user}"
    with pytest.raises(PipelineFileError) as error:
        load_pipeline(write(tmp_path, sink, "sc://127.0.0.1:15002"))
    assert "spark_master" in str(error.value)
    assert "pip install 'backlog-dagster[connect]'" in str(error.value)
    # A URL read from the environment is known only when a run starts.
    load_pipeline(write(tmp_path, sink, "{env: SPARK_URL}"))
    with pytest.raises(extras.MissingExtra, match=r"no module grpc_status\): pip install"):
        spark_resource("sc://127.0.0.1:15002")
    assert issubclass(extras.MissingExtra, UserError)


def fake_java(folder: Path, banner: str) -> Path:
    """A ``JAVA_HOME`` whose ``java -version`` says ``banner``."""
    java_bin = folder / "bin"
    java_bin.mkdir(parents=True)
    (java_bin / "java").write_text(f"#!/bin/sh\necho '{banner}' >&2\n")
    (java_bin / "java").chmod(0o755)
    return folder


@pytest.mark.parametrize(
    ("banner", "words"),
    [
        ('openjdk version "11.0.2" 2019-01-15', "Spark needs Java 17 or newer; .* is Java 11"),
        ('java version "1.8.0_381"', "Spark needs Java 17 or newer; .* is Java 8"),
        ("something else", "is an unknown version"),
    ],
)
def test_a_java_too_old_is_one_sentence_before_spark_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, banner: str, words: str
) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path / "jdk", banner)))
    java.java_problem.cache_clear()
    try:
        with pytest.raises(java.JavaMissing, match=words):
            spark_resource("local[1]")
    finally:
        java.java_problem.cache_clear()


def test_no_java_at_all_is_one_sentence_naming_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    java.java_problem.cache_clear()
    try:
        with pytest.raises(java.JavaMissing, match="none was found on the PATH"):
            spark_resource("local[1]")
        monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-such-jdk"))
        java.java_problem.cache_clear()
        with pytest.raises(java.JavaMissing, match="none was found on JAVA_HOME"):
            spark_resource("local[1]")
    finally:
        java.java_problem.cache_clear()
    assert issubclass(java.JavaMissing, UserError)


def test_this_machine_s_java_is_new_enough_and_its_version_is_read() -> None:
    assert java.java_problem() is None, java.java_problem()
    assert java.major_version('openjdk version "21.0.1" 2023-10-17') == 21
    assert java.major_version('openjdk version "17" 2021-09-14') == 17
    assert os.environ.get("JAVA_HOME") or java.java_command() is not None
