"""The switch, end to end through `dagster dev`: its daemon, the sensors, real runs.

This session runs on PostgreSQL and a shared Spark: Dagster's own storage
(``deploy/dagster-postgres.yaml``) and both example pipelines' sinks, the latter on a
server of the test's own so that the test may restart it; every run's Spark is one
Spark Connect server the test starts (so a realtime query, and its commits, run on the
server, and outlive a run that dies), whose jobs run on a standalone cluster of two
workers the test starts too (each worker its own JVM, with its own executor and Python
workers). customer_totals reads a Kafka topic (a mock cluster on loopback), which holds
the same records as the embedded log region_minutes reads, copied as they are appended,
so both pipelines are checked against the log's oracle. (The crash matrix runs the
example on the embedded log and SQLite sink, each run with a Spark of its own.)
"""

from __future__ import annotations

import itertools
import shutil
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_graphql import DagsterGraphQLClient

from backlog_dagster.components.switch import STANDBY_TAG, STARTED_AS_TAG, runs_of_phase
from backlog_dagster.kafka.mock_broker import mock_broker
from backlog_dagster.log import Topic
from backlog_dagster.phases.policy import flapping
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.spark import servers
from backlog_dagster.spark.servers import SparkServer, connect_server, standalone_cluster
from backlog_dagster.tools import dev_server
from backlog_dagster.tools.dev_server import (
    POSTGRES_INSTANCE,
    all_of,
    copy_project,
    on_kafka,
    on_postgres,
    on_spark,
    postgres_url,
)
from backlog_dagster.tools.mirror import mirrored
from tests.browser import chromium, page_showing
from tests.conftest import MakeTopic, append_orders
from tests.dagster_server import ROOT, bucket_finishes, kill_run_worker, wait_for_run
from tests.pipelines import assert_customer_totals, assert_region_minutes, example_config
from tests.postgres import (
    PrivateServer,
    example_servers,
    holding,
    stopped_commits,
    wait_for_blocked_merge,
)
from tests.test_shared_spark import commit_workers

#: The example's pipelines, by name, as this session declares them.
Configs = dict[str, PipelineConfig]
SINK_DSN = "BACKLOG_TEST_SINK_DSN"
GENERATION_TAG = "backlog_dagster/generation"
SPARK_URL = "BACKLOG_TEST_SPARK"
KAFKA_SERVERS = "BACKLOG_TEST_KAFKA"
#: The Connect server's application takes both workers' cores.
CLUSTER_CONF = {"spark.cores.max": "2"}
#: region_minutes' watermark lag threshold in this session (the example's is 2 minutes):
#: the same way back, a minute and more sooner.
LAG_THRESHOLD_S = 45


def sooner_way_back(attributes: dict[str, Any]) -> bool:
    """An ``edit`` for ``copy_project``: region_minutes' threshold is ``LAG_THRESHOLD_S``
    (its backlog runs go on as its realtime runs, as shipped), and customer_totals has a
    standby realtime run instead; the session runs these two pipelines only."""
    if attributes["name"] == "region_minutes":
        attributes["backlog"]["watermark_lag_threshold"] = f"{LAG_THRESHOLD_S}s"
    if attributes["name"] == "customer_totals":
        attributes["switch"] |= {"standby": True, "continue_as_realtime": False}
    return attributes["name"] in ("customer_totals", "region_minutes")


def sink_state(configs: Configs, pipeline: str) -> tuple[str, dict[int, int]]:
    """The pipeline's phase and per-bucket progress, as the sink holds them."""
    with open_sink(configs[pipeline]) as sink:
        generation = sink.current_generation()
        reached = (
            {} if generation is None else {b: s.reached for b, s in generation.buckets.items()}
        )
        return sink.phase(), reached


def wait_until(condition, timeout: float, what: str, tick=None) -> None:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    deadline = started + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if tick is not None:
            tick()
        time.sleep(1)
    # Where a long session spends its time, in the output of `pytest -rP`.
    print(f"{time.strftime('%H:%M:%S')} waited {time.monotonic() - started:5.0f} s for {what}")


def observations(instance: dg.DagsterInstance, asset: str, having: str) -> list[Any]:
    """The metadata of ``asset``'s observations that have the field ``having``."""
    return [
        r.asset_observation.metadata
        for r in instance.fetch_observations(dg.AssetKey(asset), limit=200).records
        if r.asset_observation is not None and having in r.asset_observation.metadata
    ]


def materializations(instance: dg.DagsterInstance, asset: str, run_id: str = "") -> list[Any]:
    """The metadata of ``asset``'s materializations (by ``run_id``'s run), newest first."""
    return [
        r.asset_materialization.metadata
        for r in instance.fetch_materializations(dg.AssetKey(asset), limit=200).records
        if r.asset_materialization is not None and run_id in ("", r.run_id)
    ]


def runs_of(instance: dg.DagsterInstance, job: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(job_name=job)))


@pytest.mark.dagster_dev
# A backstop (its own waits catch a hang): alone 622 s on a slow night, 1,267 s beside the
# other pytest worker's tests.
@pytest.mark.timeout(1800)
def test_the_example_under_dagster_dev_switches_recovers_goes_back_and_returns(
    make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both pipelines of the example project in one `dagster dev` session, on PostgreSQL
    and a Spark Connect server.

    A backlog run launched as the UI does races the sensor's; customer_totals switches
    with its realtime run's own config, survives its realtime run's death mid-commit and
    stays cancelled when the user says so; region_minutes stalls, goes back into backlog
    and returns; the sink's connection is ended and its server restarted; the Connect
    server is killed and started again under the realtime runs, which go on. One session
    instead of several: each costs a `dagster dev` start and a backlog per pipeline.
    """
    topic = make_topic(records=100_000, buckets=4, name="example/orders")
    project, home = tmp_path / "project", tmp_path / "dagster_home"
    edits = all_of(
        on_postgres("example", SINK_DSN),
        on_spark(SPARK_URL),
        on_kafka("customer_totals", KAFKA_SERVERS, "orders"),
        sooner_way_back,
    )
    copy_project(ROOT, project, edits)
    home.mkdir()
    shutil.copy(ROOT / POSTGRES_INSTANCE, home / "dagster.yaml")
    configs = {
        name: example_config(name, tmp_path, project)
        for name in ("customer_totals", "region_minutes")
    }
    with (
        example_servers() as (dagster_dsn, sink_dsn, sink_server),
        standalone_cluster(tmp_path / "cluster", workers=2, cores=1) as (master, _),
        connect_server(tmp_path / "spark", master=master.url, conf=CLUSTER_CONF) as spark,
        mock_broker(3) as kafka,
    ):
        kafka.create_topic("orders", 4)
        monkeypatch.setenv(KAFKA_SERVERS, kafka.bootstrap)
        monkeypatch.setenv("DAGSTER_POSTGRES_URL", postgres_url(dagster_dsn))
        monkeypatch.setenv(SINK_DSN, sink_dsn)
        monkeypatch.setenv(SPARK_URL, spark.url)
        with (
            mirrored(topic.path, kafka.bootstrap, "orders"),
            dev_server.dagster_dev(project, home, tmp_path) as server,
        ):
            client = DagsterGraphQLClient("127.0.0.1", port_number=server.port)
            instance = dg.DagsterInstance.from_config(str(home))
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            # The project's run queue, written beside the home's own storage settings.
            assert getattr(instance.run_coordinator, "dequeue_use_threads", False)
            by_hand = client.submit_job_execution(
                "customer_totals_backlog_job",
                run_config={
                    "ops": {"customer_totals_backlog": {"config": {"checkpoint_interval": 0.05}}}
                },
            )
            customer_totals_switches_with_its_own_config(instance, configs, topic)
            a_run_launched_by_hand_did_the_work_or_was_refused(instance, client, by_hand)
            wait_until(
                lambda: sink_state(configs, "region_minutes")[0] == "realtime",
                600,
                "region_minutes' first switch to realtime",
            )
            # customer_totals' realtime run dies while region_minutes' stalls: the two
            # recoveries overlap, as they would in production.
            stall_region_minutes_and_see_it_come_back(
                instance,
                configs,
                topic,
                spark,
                sink_dsn,
                meanwhile=lambda: killed_realtime_run_is_restarted(instance, configs, sink_dsn),
            )
            the_ui_shows_the_way_back_and_the_return(
                instance, f"http://127.0.0.1:{server.port}", configs, tmp_path / "chromium"
            )
            wait_until(
                lambda: sink_state(configs, "customer_totals")[1] == topic.latest_offsets(),
                300,
                "customer_totals to catch up",
            )
            the_sink_survives_a_lost_connection_and_a_server_restart(
                instance, configs, topic, sink_dsn, sink_server
            )
            spark = the_shared_spark_dies_and_comes_back(
                instance, configs, topic, spark, master.url
            )
            try:
                cancelled_realtime_run_stays_cancelled(instance, client)
            finally:
                servers.stop(spark)
            instance.dispose()


def customer_totals_switches_with_its_own_config(
    instance: dg.DagsterInstance, configs: Configs, topic: Topic
) -> None:
    wait_until(
        lambda: sink_state(configs, "customer_totals")[0] == "realtime",
        400,
        "the switch to realtime",
    )
    markers = sink_state(configs, "customer_totals")[1]
    assert sum(markers.values()) == 100_000

    def realtime_running() -> bool:
        return any(
            r.status == dg.DagsterRunStatus.STARTED
            for r in runs_of(instance, "customer_totals_realtime_job")
        )

    wait_until(realtime_running, 300, "the realtime run")
    for _ in range(4):  # live records while realtime runs
        append_orders(topic, 3_000, live=True)
        time.sleep(1)
    wait_until(
        lambda: sink_state(configs, "customer_totals")[1] == topic.latest_offsets(),
        300,
        "realtime to catch up with the live records",
    )

    # The run launched by hand may have been active before the sensor's first tick: the
    # sensor then launches no backlog run of its own (it watches the active one).
    sensors = [r for r in runs_of(instance, "customer_totals_backlog_job") if _by_sensor(r)]
    realtime_runs = runs_of(instance, "customer_totals_realtime_job")  # the newest first
    assert len(sensors) <= 1
    # On a loaded machine the Connect server may not get a run's foreachBatch worker up in
    # the 10 s Spark waits for it: that run fails and the sensor starts another. Never two
    # at once: every run before the newest failed.
    assert all(r.status == dg.DagsterRunStatus.FAILURE for r in realtime_runs[1:])
    if len(realtime_runs) > 1:
        print(f"customer_totals: {len(realtime_runs) - 1} realtime run(s) failed and restarted")
    for run in sensors:
        backlog_config = run.run_config["ops"]["customer_totals_backlog"]["config"]
        assert backlog_config["checkpoint_interval"] == 0
    standby = realtime_runs[-1]
    if standby.status != dg.DagsterRunStatus.FAILURE:
        # It took over at the switch, and its tags say so.
        assert standby.tags[STANDBY_TAG] == "false"
        assert standby.tags[STARTED_AS_TAG] == "standby"
    realtime_config = realtime_runs[-1].run_config["ops"]["customer_totals_realtime"]["config"]
    # The first realtime run was started as a standby while the backlog ran (and, unless
    # it failed as above, switched the pipeline the moment the backlog run let go).
    assert realtime_config == {
        "checkpoint_interval": 2.0,
        "shuffle_partitions": 1,
        "standby_for_generation": 1,
        "spark_conf": {},
    }

    # The sensor notes each bucket's finish and the switch at its first tick after them;
    # a standby switched without it, and on a loaded machine that tick can come later.
    wait_until(
        lambda: observations(instance, "customer_totals_realtime", "is_backlog"),
        120,
        "the sensor to note the switch",
    )
    finishes = bucket_finishes(instance, "customer_totals_backlog")
    assert sorted(bucket for _, bucket, _ in finishes) == [0, 1, 2, 3]
    switch = observations(instance, "customer_totals_realtime", "is_backlog")
    assert len(switch) == 1 and switch[0]["is_backlog"].value is False
    assert_customer_totals(configs["customer_totals"], topic.path)


def a_run_launched_by_hand_did_the_work_or_was_refused(
    instance: dg.DagsterInstance, client: DagsterGraphQLClient, run_id: str
) -> None:
    """The launch the UI makes goes through the run queue to the daemon and runs.

    It raced the sensor's backlog run: one of the two read the backlog (exactly once
    between them), and one started while the other held the pipeline was refused,
    saying why.
    """
    status = wait_for_run(client, run_id)
    if status != "SUCCESS":
        assert status == "FAILURE"
        failure = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
        assert "refusing to start a backlog run while another run" in str(failure)
    records = instance.fetch_materializations(
        dg.AssetKey("customer_totals_backlog"), limit=10
    ).records
    read = [
        r.asset_materialization.metadata["records_done"].value
        for r in records
        if r.asset_materialization is not None
    ]
    assert sum(read) == 100_000  # type: ignore[arg-type]


def killed_realtime_run_is_restarted(
    instance: dg.DagsterInstance, configs: Configs, sink_dsn: str
) -> None:
    """customer_totals' realtime run is SIGKILLed while live records arrive, at the worst
    moment for the sink: its commit has bulk loaded a micro-batch and waits to merge it
    (the test holds a lock on the results table). Dagster's code server reports the
    process gone (the heartbeat is only the fallback, for a run whose code server died
    too), and the sensor starts another at its next tick, which goes on from the sink's
    offsets (the oracle is checked once the producer stops)."""
    with holding(sink_dsn, "customer_totals"):
        wait_for_blocked_merge(sink_dsn, "customer_totals")
        dead = runs_of(instance, "customer_totals_realtime_job")[0].run_id
        kill_run_worker(instance, dead)
    at_kill = sink_state(configs, "customer_totals")[1]

    def restarted() -> bool:
        runs = runs_of(instance, "customer_totals_realtime_job")
        return runs[0].run_id != dead and runs[0].status == dg.DagsterRunStatus.STARTED

    wait_until(restarted, 300, "the sensor to restart the dead realtime run")
    assert instance.get_run_by_id(dead).status == dg.DagsterRunStatus.FAILURE  # type: ignore[union-attr]
    failure = instance.all_logs(dead, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert failure and "no heartbeat" not in str(failure)  # Dagster saw it, not the timeout
    wait_until(
        lambda: all(sink_state(configs, "customer_totals")[1][b] > at_kill[b] for b in at_kill),
        300,
        "the restarted run to commit past where the dead one stopped",
    )


def the_sink_survives_a_lost_connection_and_a_server_restart(
    instance: dg.DagsterInstance,
    configs: Configs,
    topic: Topic,
    sink_dsn: str,
    sink_server: PrivateServer,
) -> None:
    """While live records arrive: region_minutes' connection is ended with
    ``pg_terminate_backend`` between its commit's bulk load and merge, and the sink's
    server restarts. The same realtime runs go on (they open the connection again and
    make the interrupted commit once); nothing is lost or doubled."""
    producer = LiveProducer(topic.path, per_second=1_000)
    producer.start()
    try:
        region_run = runs_of_phase(instance, "region_minutes", "realtime")[0].run_id
        with holding(sink_dsn, "region_minutes") as holder:
            backend = wait_for_blocked_merge(sink_dsn, "region_minutes")
            holder.execute("SELECT pg_terminate_backend(%s)", (backend,))
        before = {name: committed(configs, name) for name in configs}
        sink_server.restart()
        for name in configs:
            wait_until(
                lambda n=name: committed(configs, n) > before[n],  # type: ignore[misc]
                120,
                f"{name} to commit after the server restart",
            )
        run = instance.get_run_by_id(region_run)
        assert run is not None and run.status == dg.DagsterRunStatus.STARTED
    finally:
        producer.stop()
    caught_up_and_exact(configs, topic)


def the_shared_spark_dies_and_comes_back(
    instance: dg.DagsterInstance,
    configs: Configs,
    topic: Topic,
    spark: SparkServer,
    master_url: str,
) -> SparkServer:
    """The Connect server every run uses is SIGKILLed while live records arrive, and
    started again on its port 10 s later: each realtime run goes on in a new session on
    it (no run fails), from the sink's progress, and the results are exact. Returns the
    new server.

    region_minutes has a watermark lag threshold: where the server takes longer to come
    back than the threshold and the grace period (150 s on a slow machine), its sensor
    rightly takes it back into backlog, and its realtime run ends without failing."""
    producer = LiveProducer(topic.path, per_second=1_000)
    producer.start()
    with ExitStack() as on_failure:
        try:
            before = {name: committed(configs, name) for name in configs}
            running = {name: realtime_run_of(instance, name) for name in configs}
            changes = {name: len(phase_history(configs, name)) for name in configs}
            servers.stop(spark, signal.SIGKILL)
            killed_at = time.monotonic()
            time.sleep(10)
            spark = servers.start_connect_server(
                spark.port, spark.log.parent, master=master_url, conf=CLUSTER_CONF
            )
            # The caller stops the server it knows of: this one, only once returned.
            on_failure.callback(servers.stop, spark)
            servers.wait_until_listening(spark)
            # On a busy machine (the other test worker's session beside this one) the new
            # queries may wait minutes for Spark's Python workers to start in time.
            for name in configs:
                wait_until(
                    lambda n=name: committed(configs, n) > before[n],  # type: ignore[misc]
                    600,
                    f"{name} to commit again after the server came back",
                )
            took = time.monotonic() - killed_at
            print(f"\nboth pipelines committed again {took:.0f} s after the kill")
            for name, run_id in running.items():
                since = phase_history(configs, name)[changes[name] :]
                if since and name == "region_minutes":
                    way_back = since[0]
                    print(f"{name} went back into backlog while Spark was away: {way_back[3]}")
                    assert way_back[1] == "backlog" and "above the threshold" in way_back[3]
                    # The run ends itself once it sees its generation replaced (success), or
                    # the sensor's cancel ends it; it does not fail.
                    wait_until(
                        lambda r=run_id: instance.get_run_by_id(r).is_finished,  # type: ignore[misc, union-attr]
                        120,
                        f"{name}'s realtime run to end after the way back",
                    )
                    ended = instance.get_run_by_id(run_id)
                    assert ended is not None and ended.status != dg.DagsterRunStatus.FAILURE
                    continue
                assert not since, since
                assert realtime_run_of(instance, name) == run_id
                said = [e.user_message for e in instance.all_logs(run_id)]
                went_on = "realtime: the Spark Connect server started again under this run"
                assert any(went_on in m for m in said)
        finally:
            producer.stop()
        caught_up_and_exact(configs, topic)
        on_failure.pop_all()
    return spark


def realtime_run_of(instance: dg.DagsterInstance, pipeline: str) -> str:
    """The id of the pipeline's one realtime run under way."""
    [run] = runs_of_phase(instance, pipeline, "realtime", [dg.DagsterRunStatus.STARTED])
    return run.run_id


def caught_up_and_exact(configs: Configs, topic: Topic) -> None:
    """Both pipelines reach the log's end, and their results equal the oracle."""
    for name in configs:
        wait_until(
            lambda n=name: sink_state(configs, n)[1] == topic.latest_offsets(),  # type: ignore[misc]
            300,
            f"{name} to catch up",
        )
    assert_customer_totals(configs["customer_totals"], topic.path)
    assert_region_minutes(configs["region_minutes"], topic.path)


def cancelled_realtime_run_stays_cancelled(
    instance: dg.DagsterInstance, client: DagsterGraphQLClient
) -> None:
    runs = len(runs_of(instance, "customer_totals_realtime_job"))
    run_id = runs_of(instance, "customer_totals_realtime_job")[0].run_id
    client.terminate_run(run_id)
    wait_until(
        lambda: (
            instance.get_run_by_id(run_id).status  # type: ignore[union-attr]
            == dg.DagsterRunStatus.CANCELED
        ),
        120,
        "the cancellation",
    )
    # It reads as cancelled: one line saying so, no interrupt's stack trace from Spark.
    said = [e.user_message for e in instance.all_logs(run_id)]
    assert any("cancelled: the realtime run stopped" in m for m in said), said
    for error in step_errors(instance, run_id):
        assert error is not None and "KeyboardInterrupt" not in error.to_string()
        assert error.message.strip().endswith("the next run goes on from there")
    time.sleep(15)  # three sensor ticks: a cancelled realtime run stays cancelled
    assert len(runs_of(instance, "customer_totals_realtime_job")) == runs


def step_errors(instance: dg.DagsterInstance, run_id: str) -> list[Any]:
    """The error of each step failure of the run (with its stack), or None where it has none."""
    return [
        failure.dagster_event.step_failure_data.error  # type: ignore[union-attr]
        for failure in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    ]


def _by_sensor(run: dg.DagsterRun) -> bool:
    return "dagster/sensor_name" in run.tags


class LiveProducer(threading.Thread):
    """Appends live orders (event times of now) at about ``per_second`` until stopped."""

    def __init__(self, topic_path: Path, per_second: int) -> None:
        super().__init__(daemon=True)
        self.topic_path, self.per_second = topic_path, per_second
        self.stopping = threading.Event()

    def run(self) -> None:
        with Topic(self.topic_path) as topic:
            while not self.stopping.wait(0.5):
                append_orders(topic, self.per_second // 2, live=True)

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def committed(configs: Configs, pipeline: str) -> int:
    """Records the pipeline has committed, over every bucket."""
    return sum(sink_state(configs, pipeline)[1].values())


def phase_history(configs: Configs, pipeline: str) -> list[tuple[int, str, float | None, str]]:
    with open_sink(configs[pipeline]) as sink:
        return [(c.generation, c.phase, c.lag_s, c.cause) for c in sink.phase_history()]


def stall_region_minutes_and_see_it_come_back(
    instance: dg.DagsterInstance,
    configs: Configs,
    topic: Topic,
    spark: SparkServer,
    sink_dsn: str,
    meanwhile: Callable[[], None],
) -> None:
    """region_minutes (lag threshold ``LAG_THRESHOLD_S``) goes back into backlog and returns.

    The process on the Connect server that commits its realtime query's micro-batches is
    stopped (between two commits) while records keep arriving: the run's heartbeat goes
    on, the watermark does not, and once the lag has been above the threshold for the
    grace period the sensor goes back into backlog. ``meanwhile`` runs while it stalls
    (at least the threshold), with live records arriving.
    """

    def realtime_run() -> dg.DagsterRun | None:
        started = [dg.DagsterRunStatus.STARTED]
        runs = runs_of_phase(instance, "region_minutes", "realtime", started)
        return runs[0] if runs else None

    producer = LiveProducer(topic.path, per_second=1_000)
    before = committed(configs, "region_minutes")
    producer.start()
    try:
        wait_until(
            lambda: (
                sink_state(configs, "region_minutes")[0] == "realtime"
                and realtime_run() is not None
                and committed(configs, "region_minutes") > before
            ),
            # Live records after an idle switch meet a watermark days old: if realtime's
            # first live batch is slow, the pipeline may go back and return once first.
            700,
            "region_minutes to commit live records in realtime",
        )
        run = realtime_run()
        assert run is not None
        seen = len(phase_history(configs, "region_minutes"))
        with stopped_commits(sink_dsn, "region_minutes", lambda: commit_workers(spark)):
            meanwhile()

            def way_back() -> int | None:
                """The index in the phase history of the first way back since the stall."""
                history = phase_history(configs, "region_minutes")
                return next(
                    (
                        i
                        for i in range(max(seen, 1), len(history))
                        if history[i - 1][1] == "realtime"
                        and history[i][1] == "backlog"
                        and history[i][2] is not None
                    ),
                    None,
                )

            wait_until(lambda: way_back() is not None, 300, "the way back into backlog")
        # On a slow machine the way back and the return may both be over by now (the
        # stall lasts as long as ``meanwhile``).
        back = way_back()
        assert back is not None
        wait_until(
            lambda: any(
                p == "realtime"
                for _, p, _, _ in phase_history(configs, "region_minutes")[back + 1 :]
            ),
            400,
            "the switch back to realtime",
        )
        wait_until(lambda: realtime_run() is not None, 300, "the next realtime run")
    finally:
        producer.stop()
    wait_until(
        lambda: sink_state(configs, "region_minutes")[1] == topic.latest_offsets(),
        300,
        "realtime to catch up",
    )
    history = phase_history(configs, "region_minutes")
    print("\nregion_minutes phase history:")
    for generation, phase, lag, cause in history:
        print(f"  g{generation} {phase:8} lag={lag} {cause}")
    back = next(
        b
        for a, b in itertools.pairwise(history[seen - 1 :])
        if a[1] == "realtime" and b[1] == "backlog"
    )
    assert back[2] > LAG_THRESHOLD_S and f"above the threshold {LAG_THRESHOLD_S} s" in back[3]
    # The stalled run ended by itself once it could see its generation was replaced.
    ended_as = instance.get_run_by_id(run.run_id).status  # type: ignore[union-attr]
    assert ended_as == dg.DagsterRunStatus.SUCCESS, [
        error.to_string() for error in step_errors(instance, run.run_id) if error is not None
    ]
    # The realtime asset's overview shows its newest materialization's metadata: the
    # stalled run's last one says the pipeline went back, the next run's say realtime.
    ended = materializations(instance, "region_minutes_realtime", run.run_id)[0]
    assert ended["phase"].value == "backlog" and ended["generation"].value == back[0]
    wait_until(
        lambda: (
            materializations(instance, "region_minutes_realtime")[0]["phase"].value == "realtime"
        ),
        120,
        "the next realtime run's status on the realtime asset",
    )
    observed = observations(instance, "region_minutes_backlog", "is_backlog")
    assert any(m["generation"].value == back[0] and "watermark_lag_s" in m for m in observed)
    # While the stalled run went on, the sensor said realtime did not keep up: a warning
    # on the keeps_up check, before the way back, saying what to do. (During a backlog
    # the check warns too, "not streaming yet", with the backlog's state, which may name
    # the watermark lag that caused the way back.)
    warnings = [
        e
        for e in keeps_up_evaluations(instance, "region_minutes_realtime")
        if not e.passed
        and "watermark lag" in (e.description or "")
        and not (e.description or "").startswith("not streaming yet")
    ]
    assert warnings and "more resources" in (warnings[0].description or "")
    assert_region_minutes(configs["region_minutes"], topic.path)


def the_ui_shows_the_way_back_and_the_return(
    instance: dg.DagsterInstance, url: str, configs: Configs, user_data: Path
) -> None:
    """After region_minutes went back into backlog and returned, in headless Chromium: the
    way back and its cause among the backlog asset's events, the way backs counted in the
    realtime asset's keeps_up check, the streaming run in the Runs list with the
    pipeline's generation and phase as tags, and, on the lineage graph, the
    backlog's check evaluated again and the realtime's passed (a warning if the pipeline
    went back twice within the flapping window, which a slow machine may see: both are
    the product's verdict)."""
    history = phase_history(configs, "region_minutes")
    backs = [h for h in history if h[1] == "backlog" and "back into backlog" in h[3]]
    assert backs, history
    number = backs[-1][0]
    # Dagster's Events list shows each event's time; the one picked (``time``, in ms;
    # ``asOf`` lists the events up to it) shows its description and metadata beside it.
    key = dg.AssetKey("region_minutes_backlog")
    way_back = next(
        r
        for r in instance.fetch_observations(key, limit=1000).records
        if r.asset_observation is not None
        and (r.asset_observation.description or "").startswith("backlog since")
        and "back into backlog" in (r.asset_observation.description or "")
    )
    at = int(way_back.timestamp * 1000) + 1
    with chromium(user_data) as browser:
        page_showing(
            browser,
            f"{url}/assets/region_minutes_backlog?view=events&asOf={at}&time={at}",
            ["backlog since", "above the threshold", "back into backlog", "phase_history"],
        )
        page_showing(
            browser,
            f"{url}/assets/region_minutes_realtime?view=checks",
            ["keeps_up", "way(s) back into backlog in the last"],
        )
        # The run now streaming, from the way back's generation or a later one, is named
        # for what it does and its tags are the pipeline's now.
        with open_sink(configs["region_minutes"]) as sink:
            generation, changes = sink.current_generation(), sink.phase_history()
        assert generation is not None and generation.number >= number
        started = [dg.DagsterRunStatus.STARTED]
        run = runs_of_phase(instance, "region_minutes", "realtime", started)[0]
        tags = [f"{GENERATION_TAG}: {generation.number}", "backlog_dagster/phase: realtime"]
        # (A run's own page shows its tags only behind "View tags and config".)
        page_showing(browser, f"{url}/runs", [run.run_id[:8], run.job_name, *tags])
        lineage = f"{url}/locations/example/asset-groups/region_minutes/lineage"
        # The product's own verdict: keeps_up warns while the pipeline is flapping.
        passed = 1 if flapping(changes, time.time()) else 2
        shown = {"text": ""}

        def checks_evaluated() -> bool:
            shown["text"] = page_showing(browser, lineage, ["region_minutes_realtime", "/ 1"])
            return shown["text"].count("1 / 1 Passed") == passed

        try:
            wait_until(checks_evaluated, 180, "the lineage graph to show both checks again")
        except AssertionError as error:
            raise AssertionError(f"{error}; the lineage graph showed:\n{shown['text']}") from None


def keeps_up_evaluations(instance: dg.DagsterInstance, asset: str) -> list[Any]:
    """The keeps_up check's evaluations of ``asset``, newest first."""
    key = dg.AssetCheckKey(dg.AssetKey(asset), "keeps_up")
    # Every report interval from the first tick: a long test has hundreds.
    records = instance.event_log_storage.get_asset_check_execution_history(key, limit=1000)
    evaluations = [
        r.event.dagster_event.event_specific_data
        for r in records
        if r.event is not None and r.event.dagster_event is not None
    ]
    return [e for e in evaluations if isinstance(e, dg.AssetCheckEvaluation)]
