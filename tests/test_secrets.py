"""A Spark Connect URL with a token comes from the environment and shows nowhere.

Runs ``dagster asset materialize`` (a process of its own, as a user runs it: a Spark
Connect client stays in its process) against a real Spark Connect server on loopback
that requires a token.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyspark
import pytest
from dagster._serdes import serialize_value

from backlog_dagster.pipeline.config import FromEnv, PipelineConfig
from backlog_dagster.pipeline.load import PipelineFileError, load_pipeline
from backlog_dagster.sink import open_sink
from backlog_dagster.spark.servers import free_port
from tests.conftest import MakeTopic
from tests.pipelines import (
    CUSTOMER_TOTALS,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
    write_defs,
)

DAGSTER = str(Path(sys.executable).with_name("dagster"))
TOKEN = "tok-6f1c2a9e-never-shown"
VARIABLE = "BACKLOG_TEST_SPARK_REMOTE"

DEFINITIONS = """\
from pathlib import Path

import dagster as dg

from backlog_dagster.components.assets import backlog_asset
from backlog_dagster.pipeline.load import load_pipeline

DEFS = Path(__file__).with_name("defs.yaml")
defs = dg.Definitions(assets=[backlog_asset(load_pipeline(DEFS), DEFS)])
"""


def test_a_written_token_is_refused_naming_the_field_not_the_token(tmp_path: Path) -> None:
    config = pipeline(tmp_path, CUSTOMER_TOTALS).model_dump(mode="json")
    defs = write_defs(tmp_path, PipelineConfig.model_validate(config))
    text = defs.read_text().replace(
        "spark_master: local[*]", f"spark_master: sc://h/;token={TOKEN}"
    )
    defs.write_text(text)
    with pytest.raises(PipelineFileError) as error:
        load_pipeline(defs)
    assert str(error.value) == (
        f"{defs}: 1 mistake(s) in the pipeline's attributes:\n"
        "  attributes.spark_master: Value error, holds a secret (a token or a password); "
        "write {env: NAME} and set the environment variable NAME to the URL instead, so the "
        "secret stays out of the file, the UI and the logs"
    )


@pytest.fixture(scope="module")
def connect_port() -> Iterator[int]:
    """A Spark Connect server on loopback that requires ``TOKEN``."""
    home = Path(pyspark.__file__).parent
    port = free_port()
    server = subprocess.Popen(
        [
            str(home / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.authenticate.token={TOKEN}",
            "--conf",
            "spark.ui.enabled=false",
            "spark-internal",
        ],
        env={**os.environ, "SPARK_HOME": str(home), "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            assert server.poll() is None, "the Spark Connect server exited"
            assert time.monotonic() < deadline, "the Spark Connect server did not start"
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.5)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)


def materialize(tmp_path: Path, url: str | None) -> tuple[str, str, str]:
    """``dagster asset materialize`` of the backlog; (status, its output, its event log)."""
    home = tmp_path / "dagster_home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    env.pop(VARIABLE, None)
    if url is not None:
        env[VARIABLE] = url
    command = [DAGSTER, "asset", "materialize", "-f", str(tmp_path / "definitions.py")]
    result = subprocess.run(
        [*command, "--select", "customer_totals_backlog"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    with dg.DagsterInstance.from_config(str(home)) as instance:
        run = instance.get_runs(limit=1)[0]
        events = "\n".join(serialize_value(e) for e in instance.all_logs(run.run_id))
        status = run.status.value
    return status, result.stdout + result.stderr, events


def test_a_token_from_the_environment_reaches_spark_connect_and_shows_nowhere(
    connect_port: int, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=3_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    config = config.model_copy(update={"spark_master": FromEnv(env=VARIABLE)})
    defs = write_defs(tmp_path, config)
    (tmp_path / "definitions.py").write_text(DEFINITIONS)

    # Not set: the run fails at once, naming the file, the field and the variable.
    status, output, events = materialize(tmp_path, None)
    assert status == "FAILURE"
    assert (
        f"{defs}: attributes.spark_master: environment variable {VARIABLE} is not set "
        "(or empty); set it where the runs start" in events
    )

    # A wrong token: refused by the server; neither token is in the error or the logs.
    wrong = "tok-wrong-0d5b"
    status, output, events = materialize(tmp_path, f"sc://localhost:{connect_port}/;token={wrong}")
    assert status == "FAILURE"
    for text in (output, events):
        assert TOKEN not in text and wrong not in text

    # The right one: the backlog runs on the Connect server, and the token shows nowhere.
    status, output, events = materialize(tmp_path, f"sc://localhost:{connect_port}/;token={TOKEN}")
    assert status == "SUCCESS", output[-3000:]
    assert TOKEN not in output and TOKEN not in events
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])
