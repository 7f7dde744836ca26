"""A user's own Dagster project, made the way a user makes one.

The wheel ``python -m build`` makes of this checkout is installed (not editable) into a
fresh virtualenv outside the checkout, beside Dagster's own tools; ``create-dagster``
scaffolds a project; ``backlog-dagster log create`` and ``log append`` give it a topic
of its own from a Parquet file; ``dg scaffold defs`` writes a pipeline and ``dg check
defs`` loads it. No file of the repository is on the user's path but the wheel, and no
JDK: the PATH holds a Java runtime and no compiler.

On the newest Python the whole lifecycle runs under ``dg dev`` (daemon and sensor): the
sensor's backlog run, the switch, realtime over live records, results equal to a pandas
oracle. On the oldest, a backlog through Dagster's CLI, and the refusals of an install
without the optional extras.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from backlog_dagster.log import Topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.pipeline.paths import with_paths_under
from backlog_dagster.sink import open_sink
from backlog_dagster.tools.dev_server import dagster_dev
from tests import pythons
from tests.conftest import all_records
from tests.pipelines import assert_same
from tests.wheel import DAGSTER_TOOLS, ROOT, build, fresh_venv, install, run, without_checkout

SCHEMA = "user_id STRING, amount DOUBLE, event_time TIMESTAMP"
PIPELINE = "per_user"
HISTORY_RECORDS = 20_000


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("dist"))[0]


@dataclass(frozen=True)
class UserProject:
    """A ``create-dagster`` project and its own virtualenv, run as its user runs them."""

    root: Path
    bin: Path
    environment: dict[str, str]

    def run(self, *command: str) -> str:
        return run([str(self.bin / command[0]), *command[1:]], cwd=self.root, env=self.environment)

    def fails(self, *command: str, **environment: str) -> str:
        """Run ``command``, which must fail; all it printed."""
        done = subprocess.run(
            [str(self.bin / command[0]), *command[1:]],
            cwd=self.root,
            env=self.environment | environment,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert done.returncode != 0, done.stdout[-3000:]
        return done.stdout + done.stderr

    @property
    def defs(self) -> Path:
        return self.root / "src" / self.root.name / "defs"

    @property
    def data(self) -> Path:
        return self.root / ".data"

    def config(self) -> PipelineConfig:
        """The scaffolded pipeline as Dagster reads it, its paths under the data root."""
        return with_paths_under(load_pipeline(self.defs / PIPELINE / "defs.yaml"), self.data)

    def append(self, records: pa.Table, name: str) -> None:
        """``backlog-dagster log append`` of ``records``, written to a Parquet file."""
        path = self.root.parent / f"{name}.parquet"
        pq.write_table(records, path)
        self.run("backlog-dagster", "log", "append", ".data/events", str(path), "--key", "user_id")


def jre_only_path(folder: Path) -> Path:
    """A folder of links to every program on this PATH but the JDK's own tools (its
    compiler and the rest) and the checkout's (its virtualenv, if activated): ``java``
    is the runtime's, nothing can compile Java."""
    folder.mkdir()
    for directory in map(Path, os.environ["PATH"].split(os.pathsep)):
        if directory.resolve().is_relative_to(ROOT):
            continue
        for program in sorted(directory.glob("*")) if directory.is_dir() else []:
            real = program.resolve()
            jdk_tool = "/jvm/" in real.as_posix() and program.name != "java"
            if jdk_tool or (folder / program.name).exists() or not os.access(real, os.X_OK):
                continue
            (folder / program.name).symlink_to(real)
    assert shutil.which("javac", path=str(folder)) is None
    assert shutil.which("java", path=str(folder)) is not None
    return folder


def records(count: int, first_us: int, last_us: int, seed: int) -> pa.Table:
    """``count`` events of 500 users, their times spread over ``[first_us, last_us]``."""
    rng = np.random.default_rng(seed)
    times = np.sort(rng.integers(first_us, last_us, count))
    return pa.table(
        {
            "user_id": pa.array([f"user-{u}" for u in rng.zipf(1.3, count) % 500]),
            "amount": pa.array(np.round(rng.random(count) * 100, 2)),
            "event_time": pa.array(times, pa.timestamp("us", tz="UTC")),
        }
    )


def user_project(where: Path, version: str, wheel: Path) -> UserProject:
    """Virtualenv, project, topic and pipeline, as a user makes them; ``dg check defs``."""
    python = pythons.find(version)
    assert python is not None, f"no Python {version} here (PATH or pyenv)"
    where.mkdir(parents=True)
    assert ROOT not in where.resolve().parents
    venv_bin = fresh_venv(where / "venv", python, [str(wheel), *DAGSTER_TOOLS])
    environment = without_checkout(dict(os.environ)) | {
        "PATH": os.pathsep.join([str(venv_bin), str(jre_only_path(where / "programs"))]),
        "VIRTUAL_ENV": str(where / "venv"),
        "DAGSTER_HOME": str(where / "dagster_home"),
    }
    environment.pop("JAVA_HOME", None)
    (where / "dagster_home").mkdir()
    create = [str(venv_bin / "create-dagster"), "project", "myproj", "--no-uv-sync"]
    run(create, cwd=where, env=environment)
    project = UserProject(where / "myproj", venv_bin, environment)
    install(venv_bin, ["-e", str(project.root)])  # what `uv sync` does for a user
    installed = project.run(
        "python", "-c", "import backlog_dagster; print(backlog_dagster.__file__)"
    )
    assert Path(installed.strip()).is_relative_to(where / "venv"), installed
    project.run(
        "backlog-dagster", "log", "create", ".data/events", "--schema", SCHEMA,
        "--timestamp-column", "event_time", "--buckets", "4",
    )  # fmt: skip
    now_us = time.time_ns() // 1000
    project.append(records(HISTORY_RECORDS, now_us - 2 * 86_400_000_000, now_us, 1), "history")
    scaffold = ["dg", "scaffold", "defs", "backlog_dagster.BacklogPipeline", PIPELINE]
    project.run(*scaffold, "--topic", "events")
    project.run("dg", "check", "defs")
    return project


def oracle(topic: Path) -> pd.DataFrame:
    """What the scaffolded pipeline computes: per user, a count and the sum of amounts."""
    with Topic(topic) as log:
        every = all_records(log).to_pandas()
    grouped = every.groupby("user_id").agg(
        records=("amount", "size"), total_amount=("amount", "sum")
    )
    return grouped.reset_index()


def assert_results_are_the_oracle(config: PipelineConfig) -> None:
    assert config.source.path is not None
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(results, oracle(Path(config.source.path)), ["user_id"])


def progress(config: PipelineConfig) -> tuple[str, dict[int, int]]:
    """The pipeline's phase and its buckets' progress, as its sink holds them."""
    with open_sink(config) as sink:
        generation = sink.current_generation()
        done = {} if generation is None else {b: s.reached for b, s in generation.buckets.items()}
        return sink.phase(), done


def latest(config: PipelineConfig) -> dict[int, int]:
    assert config.source.path is not None
    with Topic(Path(config.source.path)) as log:
        return log.latest_offsets()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


@pytest.mark.dagster_dev
@pytest.mark.timeout(1500)
def test_on_the_newest_python_a_user_project_catches_up_switches_and_streams_under_dg_dev(
    wheel: Path, tmp_path: Path
) -> None:
    project = user_project(tmp_path / "newest", pythons.NEWEST, wheel)
    config = project.config()
    home = Path(project.environment["DAGSTER_HOME"])
    dev = [str(project.bin / "dg"), "dev"]
    with dagster_dev(
        project.root, home, project.data, command=dev, environment=project.environment
    ):
        wait_until(lambda: progress(config)[0] == "realtime", 600, "the sensor's switch")
        for round_ in range(2):
            now_us = time.time_ns() // 1000
            project.append(records(3_000, now_us - 1_000_000, now_us, 10 + round_), f"live{round_}")
            time.sleep(3)
        wait_until(lambda: progress(config)[1] == latest(config), 300, "realtime to read them")
    assert_results_are_the_oracle(config)
    instance = dg.DagsterInstance.from_config(str(home))
    backlog_runs = instance.get_runs(
        dg.RunsFilter(job_name=f"{PIPELINE}_backlog_then_realtime_job")
    )
    assert backlog_runs, "no backlog run"
    assert {run.tags.get("dagster/sensor_name") for run in backlog_runs} == {f"{PIPELINE}_switch"}


def with_attributes(project: UserProject, name: str, **attributes: object) -> Path:
    """Another pipeline beside the scaffolded one, with ``attributes`` changed."""
    document = yaml.safe_load((project.defs / PIPELINE / "defs.yaml").read_text())
    document["attributes"] |= {"name": name, **attributes}
    folder = project.defs / name
    folder.mkdir()
    (folder / "defs.yaml").write_text(yaml.safe_dump(document, sort_keys=False))
    return folder


@pytest.mark.timeout(1500)
def test_on_the_oldest_python_a_user_project_runs_a_backlog_and_says_what_its_install_lacks(
    wheel: Path, tmp_path: Path
) -> None:
    project = user_project(tmp_path / "oldest", pythons.OLDEST, wheel)
    needs = {
        "postgres": ("sink", {"kind": "postgres", "dsn": "host=localhost", "table": "t"}),
        "connect": ("spark_master", "sc://127.0.0.1:15002"),
    }
    for extra, (field, value) in needs.items():  # Dagster stops at the first refusal
        folder = with_attributes(project, f"on_{extra}", **{field: value})
        said = project.fails("dg", "check", "defs")
        assert f"on_{extra}/defs.yaml" in said and field in said, said[-3000:]
        assert f"pip install 'backlog-dagster[{extra}]'" in said, said[-3000:]
        shutil.rmtree(folder)
    materialize = ["dagster", "asset", "materialize", "-m", "myproj.definitions"]
    materialize += ["--select", f"{PIPELINE}_backlog"]
    said = project.fails(*materialize, JAVA_HOME=str(tmp_path / "no-java"))
    assert "Spark needs a Java runtime (17 or newer) and none was found on JAVA_HOME" in said
    project.run(*materialize)
    config = project.config()
    assert progress(config)[1] == latest(config)
    assert_results_are_the_oracle(config)
