"""Pipelines on a Spark that outlives runs, started by the tests on loopback from the
pyspark installation: a Spark Connect server, and a standalone cluster of two workers."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from backlog_dagster.log import Topic
from backlog_dagster.phases.micro_batch import (
    LOCK_PATIENCE_S,
    MicroBatchCommit,
    unreachable_in,
)
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import SinkUnreachable, open_sink
from backlog_dagster.spark import home, servers
from backlog_dagster.spark.session import SparkSettingRefused, spark_config
from backlog_dagster.tools.sample_run import warm_up_server
from tests.conftest import MakeTopic, append_orders
from tests.connect_server import connect_server_cli
from tests.pipelines import (
    CUSTOMER_TOTALS,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
    write_defs,
)
from tests.test_backlog import kill_all, start_phase, wait_for
from tests.test_realtime import reached


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.SparkServer]:
    """``backlog-dagster spark connect-server`` as a user runs it (without the warm-up,
    which ``warm_up_server``'s own test runs on it), from when it says it is up until
    SIGTERM."""
    folder = tmp_path_factory.mktemp("connect")
    with connect_server_cli(folder, master="local[2]") as (server, said):
        yield server
    assert server.process.returncode == 0, "".join(said)
    assert f"Spark Connect server up: {server.url}" in "".join(said)


def server_processes(server: servers.SparkServer, marker: str) -> set[int]:
    """The processes under the server whose command line holds ``marker``."""
    found = set()
    for process in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if marker in " ".join(process.cmdline()):
                found.add(process.pid)
        except psutil.Error:
            continue
    return found


def commit_workers(server: servers.SparkServer) -> set[int]:
    """The Python processes in which the Connect server runs queries' ``foreachBatch``."""
    return server_processes(server, "foreach_batch_worker")


def test_on_spark_connect_a_dead_runs_query_commits_nothing_and_stops_and_the_next_run_is_exact(
    connect: servers.SparkServer, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Both phases run on the server; the realtime commits run there too. The realtime
    run's process is SIGKILLed: its query lives on in the server, but commits nothing
    more (its run no longer holds the run lock) and stops; the next run goes on from the
    sink's progress. Then the server's process that commits that run's micro-batches is
    SIGKILLed: the run starts its query again from the sink's progress and goes on. The
    results equal the oracle."""
    topic = make_topic(records=20_000, buckets=3)
    config = pipeline(
        tmp_path, CUSTOMER_TOTALS, realtime={"checkpoint_interval": 0.3}, spark_master=connect.url
    )
    defs = write_defs(tmp_path / "defs" / "customer_totals", config, data=tmp_path)
    backlog = start_phase(defs, tmp_path)
    output, _ = backlog.communicate(timeout=300)
    assert backlog.returncode == 0, output
    done = sum(reached(config).values())
    assert done == 20_000

    run = start_phase(defs, tmp_path, phase="realtime")
    deadline = time.monotonic() + 180
    while sum(reached(config).values()) == done:  # live load until a batch commits
        assert time.monotonic() < deadline, "the realtime run committed nothing"
        append_orders(topic, 1_000)
        time.sleep(0.3)
    assert commit_workers(connect), "the commits do not run on the Connect server"
    kill_all(run)  # the client only: the query and its commits are on the server
    # A micro-batch that passed its check before the kill may still commit (the sink's
    # progress fences it), however long it takes; none planned after the kill may.
    at_kill = topic.latest_offsets()
    append_orders(topic, 5_000)
    time.sleep(LOCK_PATIENCE_S + 5)
    after = reached(config)
    assert all(after[b] <= at_kill[b] for b in after), ("the dead run's query went on", after)
    wait_for(lambda: not commit_workers(connect), timeout=60)  # and it stopped

    rerun = start_phase(defs, tmp_path, phase="realtime", temp=tmp_path / "temp")
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=180)
    # The server wrote the query's checkpoint on this machine, where the run said (a
    # micro-batch's commit log follows its commit to the sink).
    (checkpoint,) = (tmp_path / "temp").glob("realtime-checkpoint-*")
    commits = checkpoint / "commits"
    wait_for(lambda: commits.is_dir() and any(commits.iterdir()), timeout=30)
    workers = commit_workers(connect)
    assert workers, "the commits do not run on the Connect server"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    append_orders(topic, 5_000)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=180)
    rerun.send_signal(signal.SIGTERM)
    output, _ = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, output
    assert "one of Spark's Python workers exited unexpectedly" in output, output
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def test_a_backlog_and_a_standby_go_on_in_new_sessions_when_their_connect_server_starts_again(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A backlog in chunks on a Connect server of its own, SIGKILLed after the first
    chunk's commit and started again on its port: the same run goes on in a new session
    from the sink's last commit, says so, and the results equal the oracle. Then a
    standby's armed query, its server killed and started again while it waits for the
    switch: the standby goes on in a new session too, and reads what arrived since."""
    topic = make_topic(records=2_000_000, buckets=4)
    with servers.connect_server(tmp_path / "server", master="local[2]") as first:
        config = pipeline(
            tmp_path,
            CUSTOMER_TOTALS,
            backlog={"checkpoint_interval": 1},
            spark_master=first.url,
        )
        defs = write_defs(tmp_path / "defs" / "customer_totals", config, data=tmp_path)
        backlog = start_phase(defs, tmp_path)
        assert backlog.stdout is not None
        said = []
        for line in backlog.stdout:
            said.append(line)
            if "then the sink's commit" in line:  # a chunk committed
                break
        at_kill = sum(reached(config).values())
        assert 0 < at_kill < 2_000_000, "".join(said)
        killed_at = time.monotonic()
        again = restart(first)
        try:
            output, _ = backlog.communicate(timeout=600)
            print(f"\nbacklog finished {time.monotonic() - killed_at:.1f} s after the kill")
            output = "".join(said) + output
            assert backlog.returncode == 0, output
            assert "backlog: the Spark Connect server started again under this run" in output
            assert sum(reached(config).values()) == 2_000_000

            go = tmp_path / "switch"
            standby = start_standby(defs, go, total=2_100_000, data=tmp_path)
            try:
                assert standby.stdout is not None
                said = []
                for line in standby.stdout:
                    said.append(line)
                    if line.strip() == "armed":
                        break
                assert said[-1:] == ["armed\n"], "".join(said)
                again = restart(again)
                append_orders(topic, 100_000)
                go.touch()
                output, _ = standby.communicate(timeout=600)
                output = "".join(said) + output
            finally:
                if standby.poll() is None:
                    kill_all(standby)
        finally:
            servers.stop(again)
    assert standby.returncode == 0, output
    assert "realtime: the Spark Connect server started again under this run" in output, output
    assert sum(reached(config).values()) == 2_100_000
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def restart(server: servers.SparkServer) -> servers.SparkServer:
    """SIGKILL a Connect server and start it again on its port and folder 3 s later."""
    servers.stop(server, signal.SIGKILL)
    time.sleep(3)
    return servers.start_connect_server(server.port, server.log.parent, master="local[2]")


def start_standby(defs: Path, go: Path, total: int, data: Path) -> subprocess.Popen[str]:
    """``tests/standby_worker.py`` in its own process group (see there)."""
    worker = str(Path(__file__).with_name("standby_worker.py"))
    return subprocess.Popen(
        [sys.executable, worker, str(defs), str(go), str(total)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "BACKLOG_DAGSTER_DATA": str(data)},
    )


def test_a_warm_up_leaves_the_process_that_asked_for_it_free_to_start_a_local_spark(
    connect: servers.SparkServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Connect client marks its process as one; the warm-up's client is a process of its
    own, so the demo's (and a bench's) later local Sparks still start."""
    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
    said: list[str] = []
    warm_up_server(connect.url, tmp_path, 1, said.append)
    assert re.search(r"server warmed up in \d+ s \([1-9]\d* micro-batches\)", said[-1]), said
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_a_connect_server_s_python_processes_import_the_installed_pyspark(
    connect: servers.SparkServer,
) -> None:
    """The server is launched from ``spark.home``'s launch home, so the processes it starts
    for a client's Python code import the installed PySpark, not the zipped copy."""
    script = (
        "import sys; from backlog_dagster.implementations import open_session; "
        "from tests.test_spark_source import imported_pyspark; "
        "print(imported_pyspark(open_session(sys.argv[1])))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, connect.url], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(home.installed_home() / "__init__.py")


def python_daemons(server: servers.SparkServer) -> set[int]:
    """The server's Python daemons (each forks Spark's Python workers of one kind)."""
    return server_processes(server, "pyspark.daemon")


def test_the_server_s_sessions_share_its_generated_code_and_python_workers(
    connect: servers.SparkServer,
) -> None:
    """Each run is a session of its own. On the server the project starts
    (``spark.connect_main``) a session's query whose plan another session ran
    before generates no code of its own (Spark's cache of compiled plan code holds), and
    its Python UDF runs in the Python workers that were started for the other."""
    script = (
        "import sys; from pyspark.sql import functions as F; "
        "from backlog_dagster.implementations import open_session; "
        "spark = open_session(sys.argv[1]); plus = F.udf(lambda v: v + 1, 'long'); "
        "rows = spark.range(1000).select(plus('id').alias('v'))"
        ".groupBy((F.col('v') % 7).alias('k')).count().collect(); print(len(rows))"
    )

    def run_in_a_session() -> None:
        done = subprocess.run(
            [sys.executable, "-c", script, connect.url], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == "7"

    def code_generated() -> int:
        return connect.log.read_text(errors="replace").count("Code generated in")

    run_in_a_session()
    generated, daemons = code_generated(), python_daemons(connect)
    assert generated > 0 and daemons
    run_in_a_session()
    assert code_generated() == generated
    assert python_daemons(connect) == daemons


def test_a_picked_port_is_free_and_not_one_the_kernel_hands_out_for_bind_0() -> None:
    """A server started on a picked port some seconds later (``dagster dev``, a Connect
    server started again) must not find it taken by another process's ephemeral socket:
    CI once saw a Spark JVM's py4j gateway answer on dagster's port."""
    low, _ = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(20):
        port = servers.free_port()
        assert port < low
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))


def test_a_launch_setting_for_a_connect_server_is_refused_by_name() -> None:
    settings = spark_config("sc://127.0.0.1:15002", "x", {"spark.sql.shuffle.partitions": "3"})
    assert settings["spark.remote"] == "sc://127.0.0.1:15002"
    assert settings["spark.sql.shuffle.partitions"] == "3"
    assert "spark.driver.memory" not in settings
    with pytest.raises(SparkSettingRefused, match=r"spark\.executor\.memory.*--conf"):
        spark_config("sc://127.0.0.1:15002", "x", {"spark.executor.memory": "2g"})
    local = spark_config("local[2]", "x", {"spark.executor.memory": "2g"})
    assert local["spark.master"] == "local[2]" and local["spark.executor.memory"] == "2g"


def test_a_commit_that_cannot_reach_the_sink_says_so_before_reading_its_batch(
    tmp_path: Path,
) -> None:
    """On Spark Connect the commit opens the sink on the server's host: where that fails,
    the run learns it from the query's error, found by its prefix, before any Spark job
    of the micro-batch ran (the batch is not touched: here it is not even a DataFrame)."""
    (tmp_path / "a_file").write_text("")
    where = tmp_path / "a_file" / "results.sqlite"  # a folder that cannot be made
    config = pipeline(
        tmp_path, CUSTOMER_TOTALS, sink={"path": str(where), "table": "customer_totals"}
    )
    commit = MicroBatchCommit(config, holder="realtime run test")
    with pytest.raises(SinkUnreachable) as raised:
        commit(None, 0)  # type: ignore[arg-type]
    reason = unreachable_in(f"StreamingQueryException: {raised.value}\n  at ...")
    assert reason is not None and str(where) in reason and "cannot open" in reason


def test_spark_conf_is_checked_and_read_as_text(tmp_path: Path) -> None:
    config = pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        backlog={
            "spark_conf": {"spark.sql.shuffle.partitions": 16, "spark.sql.ansi.enabled": True}
        },
    )
    assert config.backlog.spark_conf == {
        "spark.sql.shuffle.partitions": "16",
        "spark.sql.ansi.enabled": "true",
    }
    with pytest.raises(ValueError, match=r"'executor\.memory' is not a Spark setting"):
        pipeline(tmp_path, CUSTOMER_TOTALS, realtime={"spark_conf": {"executor.memory": "2g"}})


def test_on_a_standalone_cluster_killed_workers_and_master_lose_nothing(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A master and two workers, each its own JVM with its own executors and Python
    workers. One worker (with its executor) is SIGKILLed mid-backlog, another mid-realtime:
    their tasks run again on the workers left. Then the master is killed: the realtime
    run goes on, and once the master is back a new run starts. Results equal the oracle."""
    topic = make_topic(records=400_000, buckets=4)
    with servers.standalone_cluster(tmp_path / "cluster", workers=2, cores=1) as (master, workers):
        # Both workers' executors for each run: a killed worker takes part of the work.
        spread = {"spark.cores.max": "2", "spark.executor.cores": "1"}
        config: PipelineConfig = pipeline(
            tmp_path,
            CUSTOMER_TOTALS,
            spark_master=master.url,
            backlog={"spark_conf": spread, "shuffle_partitions": 8},
            realtime={"spark_conf": spread, "checkpoint_interval": 0.5},
        )
        defs = write_defs(tmp_path / "defs" / "customer_totals", config, data=tmp_path)
        backlog = start_phase(defs, tmp_path)
        assert backlog.stdout is not None
        for line in backlog.stdout:
            if "records to read up to the markers" in line:
                break
        wait_for(lambda: executors_of(workers[0]) and executors_of(workers[1]), timeout=120)
        killed_at = time.monotonic()
        os.killpg(workers[0].process.pid, signal.SIGKILL)
        output, _ = backlog.communicate(timeout=600)
        assert backlog.returncode == 0, output
        print(f"\nbacklog finished {time.monotonic() - killed_at:.1f} s after a worker died")
        assert sum(reached(config).values()) == 400_000

        replacement = servers.start_worker(master.url, tmp_path / "cluster", cores=1)
        restarted: servers.SparkServer | None = None
        run: subprocess.Popen[str] | None = None
        try:
            servers.wait_until_listening(replacement)
            run = start_phase(defs, tmp_path, phase="realtime")
            wait_for(lambda: executors_of(workers[1]) and executors_of(replacement), timeout=180)
            live(topic)
            os.killpg(workers[1].process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            live(topic)
            wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=300)
            print(f"realtime caught up {time.monotonic() - killed_at:.1f} s after a worker died")
            # Without its master a running application goes on (it has its executors);
            # a new one starts once the master is back and the workers registered again.
            os.killpg(master.process.pid, signal.SIGKILL)
            live(topic)
            wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=300)
            stop_phase(run)
            restarted = servers.start_master(master.port, tmp_path / "cluster")
            servers.wait_until_listening(restarted)
            run = start_phase(defs, tmp_path, phase="realtime")
            live(topic)
            wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=300)
            stop_phase(run)
        finally:
            if run is not None and run.poll() is None:
                kill_all(run)
            for server in (replacement, restarted):
                if server is not None:
                    servers.stop(server)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    oracle = customer_totals_oracle(records_up_to(topic, topic.latest_offsets()))
    assert_same(results, oracle, ["customer_id"])


def live(topic: Topic) -> None:
    """About 6,000 live records/s for 3 s."""
    for _ in range(10):
        append_orders(topic, 2_000, live=True)
        time.sleep(0.3)


def stop_phase(run: subprocess.Popen[str]) -> None:
    """SIGTERM a ``pipeline realtime`` process: it stops its query and exits cleanly."""
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output


def executors_of(worker: servers.SparkServer) -> bool:
    """Whether the worker runs an executor (a JVM it started) now."""
    try:
        children = psutil.Process(worker.process.pid).children(recursive=True)
    except psutil.Error:
        return False
    for child in children:
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                return True
        except psutil.Error:
            continue
    return False
