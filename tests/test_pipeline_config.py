"""Mistakes in a pipeline's defs.yaml: each named with file, field and what is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from backlog_dagster.cli import main
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import PipelineFileError, load_pipeline
from tests.conftest import MakeTopic

GOOD = {
    "name": "t",
    "source": {"path": "orders", "event_time": "event_time"},
    "transform": {
        "keys": ["customer_id"],
        "aggregations": [{"name": "total", "function": "sum", "column": "amount"}],
    },
    "sink": {"path": "results.sqlite", "table": "t"},
}

BAD_YAML = """\
type: backlog_dagster.BacklogPipeline
attributes:
  name: t
  source: {path: orders, event_time: event_time}
  transform:
    keys: [customer_id]
    aggregations:
      - {name: total, function: summ, column: amount}
  sink: {path: s.db, table: t, colour: blue}
  backlog: {checkpoint_interval: -3}
  realtime: {shuffle_partitions: many}
"""


def make_project(root: Path, defs_yaml: str) -> Path:
    """A minimal dg project whose one component is ``defs_yaml``; return its defs.yaml."""
    package = root / "badproj"
    (package / "defs" / "p").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent("""\
        [tool.dg]
        directory_type = "project"
        [tool.dg.project]
        root_module = "badproj"
        defs_module = "badproj.defs"
        """)
    )
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(
        textwrap.dedent("""\
        from pathlib import Path
        import dagster as dg
        defs = dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
        """)
    )
    path = package / "defs" / "p" / "defs.yaml"
    path.write_text(defs_yaml)
    return path


def dagster_validate(root: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``dagster definitions validate`` on the project ``make_project`` made under ``root``,
    with ``env`` over this process's environment."""
    return subprocess.run(
        [
            str(Path(sys.executable).with_name("dagster")),
            "definitions",
            "validate",
            "-m",
            "badproj.definitions",
            "-d",
            str(root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": "", **env},
    )


def test_dagster_definitions_validate_names_file_line_and_field(tmp_path: Path) -> None:
    defs = make_project(tmp_path, BAD_YAML)
    result = dagster_validate(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    for field, line, message in [
        (
            "transform.aggregations.0.function",
            8,
            "Input should be 'count', 'sum', 'min', 'max', 'avg', 'count_distinct' or 'quantiles'",
        ),
        ("sink.colour", 9, "Extra inputs are not permitted"),
        ("backlog.checkpoint_interval", 10, "Input should be greater than or equal to 0"),
        ("realtime.shuffle_partitions", 11, "Input should be a valid integer"),
    ]:
        assert f"attributes.{field} at {defs}:{line}" in output, output[-4000:]
        assert message in output


def test_loading_a_kafka_pipeline_connects_to_no_broker_and_still_checks_its_columns(
    tmp_path: Path,
) -> None:
    """Dagster loads a code location on every reload: a broker that is down must not slow
    or break it. The pipeline's columns are checked against its declared record schema,
    which is in the file; nothing connects to the broker (a listener on its address sees
    no connection)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    connected: list[object] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            try:
                connected.append(listener.accept()[1])
            except TimeoutError:
                continue

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    port = listener.getsockname()[1]
    defs = make_project(
        tmp_path,
        textwrap.dedent(f"""\
        type: backlog_dagster.BacklogPipeline
        attributes:
          name: t
          source:
            kind: kafka
            kafka: {{bootstrap_servers: "127.0.0.1:{port}", topic: orders}}
            event_time: event_time
            record_schema: "customer_id BIGINT, amount DOUBLE, event_time TIMESTAMP"
          transform:
            keys: [region]
            aggregations:
              - {{name: total, function: sum, column: amount}}
          sink: {{path: s.db, table: t}}
        """),
    )
    try:
        result = dagster_validate(tmp_path)
    finally:
        done.set()
        watcher.join()
        listener.close()
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"attributes.transform.keys.0 at {defs}:10" in output, output[-4000:]
    assert "'region' is not a column of the source" in output, output[-4000:]
    assert connected == []


def test_the_cli_names_file_and_field(tmp_path: Path) -> None:
    defs = tmp_path / "defs.yaml"
    defs.write_text(BAD_YAML)
    result = CliRunner().invoke(main, ["pipeline", "status", str(defs)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {defs}: 4 mistake(s) in the pipeline's attributes:")
    assert "  attributes.sink.colour: Extra inputs are not permitted" in result.output


def with_change(path: str, value: object) -> dict:  # type: ignore[type-arg]
    import copy

    attributes = copy.deepcopy(GOOD)
    *parents, last = path.split(".")
    node = attributes
    for part in parents:
        node = node.setdefault(part, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return attributes


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("transform.keys", None, "attributes.transform: Value error, aggregations need keys"),
        ("transform.keys", [], "attributes.transform: Value error, aggregations need keys"),
        (
            "transform.aggregations",
            [],
            "attributes.transform: Value error, keys without aggregations: add aggregations",
        ),
        (
            "transform.aggregations",
            [{"name": "m", "function": "avg"}],
            "attributes.transform.aggregations.0: Value error, avg needs a column",
        ),
        (
            "transform.aggregations",
            [{"name": "customer_id", "function": "count"}],
            "attributes.transform: Value error, output column name(s) used twice: customer_id",
        ),
        (
            "transform.aggregations",
            [{"name": "total amount", "function": "count"}],
            "attributes.transform.aggregations.0.name: Value error, 'total amount' is not a plain",
        ),
        (
            "transform.window",
            {"allowed_lateness": "30s"},
            "attributes.transform.window.size: Field required",
        ),
        (
            "transform.window",
            {"size": "a minute"},
            "attributes.transform.window.size: Value error, 'a minute' is not a duration",
        ),
        (
            "source.start",
            {"timestamp": "2026-11-20T00:00:00"},
            "attributes.source.start: Value error, timestamp needs a time zone",
        ),
        (
            "source.start",
            {"timestamp": "2026-11-20T00:00:00Z", "offsets": {0: 1}},
            "attributes.source.start: Value error, give one of timestamp or offsets, not both",
        ),
        (
            "source.start",
            "latest",
            "attributes.source.start: Input should be a valid dictionary or instance of StartAt",
        ),
        ("source.event_time", None, "attributes.source.event_time: Field required"),
        ("sink.kind", "mysql", "attributes.sink: Input tag 'mysql' found using 'kind' does not"),
        ("sink.kind", "postgres", "attributes.sink.dsn: Field required"),
        (
            "sink",
            {"kind": "postgres", "dsn": "host=db password=hunter2", "table": "t"},
            "attributes.sink.dsn: Value error, holds a password; write {env: NAME}",
        ),
        (
            "sink",
            {"kind": "postgres", "dsn": "postgresql://me:hunter2@db/results", "table": "t"},
            "attributes.sink.dsn: Value error, holds a secret",
        ),
        (
            "realtime.checkpoint_interval",
            0,
            "attributes.realtime.checkpoint_interval: Input should be greater than 0",
        ),
        (
            "backlog.watermark_lag_threshold",
            "0s",
            "attributes.backlog.watermark_lag_threshold: Input should be greater than 0",
        ),
        (
            "backlog.boundary",
            "none",
            "attributes: Value error, backlog.boundary is none but "
            "backlog.watermark_lag_threshold is not set: nothing would decide when the "
            "backlog ends; set one of them",
        ),
        (
            "source.idle_timeout",
            -1,
            "attributes.source.idle_timeout: Input should be greater than 0",
        ),
    ],
)
def test_each_kind_of_mistake(tmp_path: Path, field: str, value: object, expected: str) -> None:
    import yaml

    defs = tmp_path / "defs.yaml"
    defs.write_text(
        yaml.safe_dump(
            {"type": "backlog_dagster.BacklogPipeline", "attributes": with_change(field, value)}
        )
    )
    with pytest.raises(PipelineFileError) as error:
        load_pipeline(defs)
    assert str(error.value).startswith(f"{defs}: ")
    assert expected in str(error.value)


def test_a_lag_threshold_must_exceed_the_allowed_lateness(tmp_path: Path) -> None:
    attributes = with_change("backlog", {"watermark_lag_threshold": "30s"})
    attributes["transform"]["window"] = {"size": "1m", "allowed_lateness": "30s"}
    assert (
        "attributes: Value error, backlog.watermark_lag_threshold (30 s) must exceed "
        "transform.window.allowed_lateness (30 s)"
    ) in refusal(tmp_path / "defs.yaml", attributes)


def test_one_spark_for_both_phases_when_the_backlog_run_goes_on(tmp_path: Path) -> None:
    """With ``switch.continue_as_realtime`` (the default) one Spark, launched with the
    backlog's settings, serves both phases: the realtime phase may set SQL settings of its
    own, not launch it differently; and no standby is started beside it."""
    defs = tmp_path / "defs.yaml"
    attributes = with_change("switch", {"continue_as_realtime": True})
    attributes["backlog"] = {"spark_conf": {"spark.driver.memory": "2g"}}
    attributes["realtime"] = {"spark_conf": {"spark.sql.shuffle.partitions": "2"}}
    assert loaded(defs, attributes).backlog.spark_conf  # the backlog's serve both
    attributes["realtime"]["spark_conf"]["spark.driver.memory"] = "1g"
    assert (
        "attributes: Value error, switch.continue_as_realtime: the backlog run's Spark goes "
        "on as the realtime run's, so realtime.spark_conf cannot launch it differently (not "
        "as in backlog.spark_conf: spark.driver.memory)"
    ) in refusal(defs, attributes)
    attributes["realtime"]["spark_conf"]["spark.driver.memory"] = "2g"
    assert loaded(defs, attributes).switch.continue_as_realtime

    # A standby and a backlog run that goes on: one of the two starts realtime.
    attributes["switch"]["standby"] = True
    assert "attributes.switch: Value error, standby and continue_as_realtime are both on" in (
        refusal(defs, attributes)
    )
    attributes["switch"]["continue_as_realtime"] = False
    assert loaded(defs, attributes).switch.standby


def loaded(defs: Path, attributes: dict[str, Any]) -> PipelineConfig:
    """The pipeline of a defs.yaml written with ``attributes``."""
    import yaml

    defs.write_text(
        yaml.safe_dump({"type": "backlog_dagster.BacklogPipeline", "attributes": attributes})
    )
    return load_pipeline(defs)


def refusal(defs: Path, attributes: dict[str, Any]) -> str:
    """Why a defs.yaml written with ``attributes`` is refused."""
    with pytest.raises(PipelineFileError) as error:
        loaded(defs, attributes)
    return str(error.value)


def test_durations_take_units(tmp_path: Path) -> None:
    import yaml

    defs = tmp_path / "defs.yaml"
    attributes = with_change("backlog", {"checkpoint_interval": "500ms"})
    attributes["transform"]["window"] = {"size": "1m", "allowed_lateness": 30}
    defs.write_text(yaml.safe_dump({"type": "x", "attributes": attributes}))
    config = load_pipeline(defs)
    assert config.backlog.checkpoint_interval == 0.5
    assert config.transform.window is not None and config.transform.window.size == 60


MISFIT_YAML = """\
type: backlog_dagster.BacklogPipeline
attributes:
  name: t
  source: {path: orders, event_time: event_time}
  transform:
    keys: [customer]
    aggregations:
      - {name: total, function: sum, column: region}
  sink: {path: s.db, table: t}
"""


def test_a_pipeline_that_does_not_fit_its_topic_is_refused_when_dagster_loads_it(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The topic declares its columns: no Spark is needed to see a wrong key or a sum over
    text, so `dagster definitions validate` names the file, line and field."""
    data = tmp_path / "data"
    make_topic(records=10, buckets=1, name="data/orders")
    defs = make_project(tmp_path / "project", MISFIT_YAML)
    result = dagster_validate(tmp_path / "project", BACKLOG_DAGSTER_DATA=str(data))
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"attributes.transform.keys.0 at {defs}:6" in output, output[-4000:]
    assert "'customer' is not a column of the source nor one of transform.columns" in output
    assert f"attributes.transform.aggregations.0.column at {defs}:8" in output
    assert "sum needs a numeric input, and 'region' is STRING" in output


def test_the_cli_names_the_file_of_a_run_time_mistake_and_exits_non_zero(
    make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_topic(records=10, buckets=1, name="orders")
    defs = tmp_path / "defs.yaml"
    defs.write_text(MISFIT_YAML)
    monkeypatch.setenv("BACKLOG_DAGSTER_DATA", str(tmp_path))
    result = CliRunner().invoke(main, ["pipeline", "backlog", str(defs)])
    assert result.exit_code == 1
    assert result.output.startswith(
        f"Error: {defs}: attributes.transform.keys.0: 'customer' is not a column of the "
        "source nor one of transform.columns"
    ), result.output
    assert "Traceback" not in result.output


def test_a_password_in_the_dsn_is_refused_at_load_naming_the_line_not_the_password(
    tmp_path: Path,
) -> None:
    defs = make_project(
        tmp_path,
        BAD_YAML.replace(
            "  sink: {path: s.db, table: t, colour: blue}\n",
            "  sink:\n    kind: postgres\n    dsn: host=db user=me password=hunter2\n"
            "    table: t\n",
        ),
    )
    result = dagster_validate(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"attributes.sink.dsn at {defs}:11" in output, output[-4000:]
    assert "holds a password" in output
    assert "hunter2" not in output
