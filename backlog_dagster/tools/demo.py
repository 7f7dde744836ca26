"""``backlog-dagster demo``: the main job, the whole lifecycle through Dagster's daemon.

Loads a backlog of the reference ``orders`` workload into the embedded log, starts a
live producer, starts ``dagster dev`` on the example project (whose switch sensors are
on by default), and prints a timeline read from Dagster's instance and the pipelines'
sink: the markers, each bucket's finish as the sensor reported it, the switch, the
realtime runs, then realtime lag for a while. Then it cancels the realtime runs the way
the UI does, stops everything, and prints the results' top rows and the switch gap.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from dateutil.parser import isoparse
from rich.console import Console
from rich.table import Table

from backlog_dagster import extras
from backlog_dagster.log.topic import Topic, create_topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.pipeline.paths import with_paths_under
from backlog_dagster.pipeline.results import WINDOW_END, WINDOW_START
from backlog_dagster.sink import open_sink
from backlog_dagster.tools.dev_server import (
    POSTGRES_INSTANCE,
    all_of,
    copy_project,
    dagster_dev,
    on_kafka,
    on_postgres,
    on_spark,
    postgres_url,
)
from backlog_dagster.tools.produce import progress_bar
from backlog_dagster.tools.workload import (
    ORDERS_SCHEMA,
    ORDERS_TIMESTAMP,
    produce_backlog,
    produce_live,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance

console = Console(soft_wrap=True)
PIPELINES = ("customer_totals", "region_minutes", "region_daily")
EXAMPLE_DEFS = Path("definitions") / "defs"
#: The database ``--postgres`` (re)creates for the demo, and the variable its sinks read.
DEMO_DATABASE, DEMO_DSN_ENV = "backlog_dagster_demo", "BACKLOG_DAGSTER_DEMO_DSN"
#: The variable the demo's pipelines read their Spark's URL from, with ``--spark``.
DEMO_SPARK_ENV = "BACKLOG_DAGSTER_DEMO_SPARK"
#: The variable the demo's pipelines read their Kafka brokers from, with ``--kafka``.
DEMO_KAFKA_ENV = "BACKLOG_DAGSTER_DEMO_KAFKA"
#: A change to each pipeline of a copied example (``dev_server.copy_project``).
Edit = Callable[[dict[str, Any]], bool]


@click.command("demo")
@click.option(
    "--records",
    type=click.IntRange(min=1),
    default=2_000_000,
    show_default=True,
    help="Backlog records to load (the reference is 20,000,000).",
)
@click.option("--buckets", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--live-rate",
    type=click.FloatRange(min=0),
    default=5_000,
    show_default=True,
    help="Live records/s appended while the pipelines run.",
)
@click.option(
    "--realtime-seconds",
    type=click.FloatRange(min=1),
    default=60,
    show_default=True,
    help="How long to watch the realtime phase before stopping.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path(".data/demo"),
    show_default=True,
    help="Where the demo keeps its log, results and Dagster home.",
)
@click.option(
    "--postgres",
    "postgres",
    is_flag=False,
    flag_value="host=127.0.0.1 port=5432 user=postgres dbname=postgres",
    default=None,
    metavar="[CONNINFO]",
    help="Keep the results and Dagster's own storage in PostgreSQL: the demo (re)creates "
    f"the database {DEMO_DATABASE} on the server CONNINFO names (default: the local one, "
    "as user postgres).",
)
@click.option(
    "--spark",
    type=click.Choice(["connect", "cluster"]),
    default=None,
    help="Run every pipeline's runs on one long-lived Spark the demo starts: a Spark "
    "Connect server (runs start no JVM of their own), or a standalone cluster of two "
    "workers (each run's executors on the workers). Default: a local Spark per run.",
)
@click.option(
    "--kafka",
    is_flag=True,
    help="Both pipelines read a Kafka topic on librdkafka's mock cluster the demo starts "
    "on loopback, which holds the log's records, copied as they are appended.",
)
def demo(
    records: int,
    buckets: int,
    live_rate: float,
    realtime_seconds: float,
    data_dir: Path,
    postgres: str | None,
    spark: str | None,
    kafka: bool,
) -> None:
    """Backlog → switch → realtime, through Dagster's daemon and sensors."""
    if not Path("workspace.yaml").exists():
        raise click.ClickException("run the demo from the project's root (workspace.yaml)")
    if data_dir.exists():
        shutil.rmtree(data_dir)
    data_dir = data_dir.resolve()
    topic_dir = data_dir / "example" / "orders"
    next_id = _load_backlog(topic_dir, records, buckets)
    stop_producer = threading.Event()
    producer = threading.Thread(
        target=_produce, daemon=True, args=(topic_dir, live_rate, next_id, stop_producer)
    )
    producer.start()

    project, home = Path.cwd(), data_dir / "dagster_home"
    started = time.monotonic()
    try:
        with contextlib.ExitStack() as stack:
            edits = []
            if postgres is not None:
                edits.append(_on_postgres(postgres, home))
            if spark is not None:
                edits.append(stack.enter_context(_shared_spark(spark, data_dir / "spark")))
            if kafka:
                edits.append(stack.enter_context(_on_kafka(topic_dir, buckets)))
            if edits:
                project = data_dir / "project"
                copy_project(Path.cwd(), project, all_of(*edits))
            pipelines = {
                name: with_paths_under(
                    load_pipeline(project / EXAMPLE_DEFS / name / "defs.yaml"), data_dir
                )
                for name in PIPELINES
            }
            server = stack.enter_context(dagster_dev(project, home, data_dir))
            console.print(
                f"[dim]{time.monotonic() - started:6.1f}s[/] dagster dev up on {server.url} "
                f"(log: {server.log})"
            )
            timeline = Timeline(pipelines, data_dir, home, server.port, started)
            lags = timeline.run(realtime_seconds)
    finally:
        stop_producer.set()
        producer.join(30)
    _summary(pipelines, lags)


def _load_backlog(topic_dir: Path, records: int, buckets: int) -> int:
    """The reference backlog in a new topic, with a progress bar; the next order id."""
    with (
        create_topic(
            topic_dir, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=buckets
        ) as topic,
        progress_bar() as bar,
    ):
        task = bar.add_task("load backlog", total=records, rate="")
        return produce_backlog(
            topic, records, days=5, on_progress=lambda done: bar.update(task, completed=done)
        )


def _on_postgres(conninfo: str, home: Path) -> Edit:
    """An edit of the example whose sinks are PostgreSQL ones (schema ``example``) in a
    new database on the server ``conninfo`` names, and a Dagster home whose instance
    keeps its storage there too. The connection strings go to the environment only."""
    said = extras.problem("postgres")
    if said is not None:
        raise click.ClickException(f"--postgres: {said}")
    import psycopg

    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {DEMO_DATABASE} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {DEMO_DATABASE}")
    except psycopg.Error as error:
        raise click.ClickException(
            f"--postgres: cannot create the database {DEMO_DATABASE} ({type(error).__name__}); "
            "check that the server runs and that the connection string names a user who "
            "may create databases"
        ) from None
    demo_database = psycopg.conninfo.make_conninfo(conninfo, dbname=DEMO_DATABASE)
    os.environ[DEMO_DSN_ENV] = demo_database
    os.environ["DAGSTER_POSTGRES_URL"] = postgres_url(demo_database)
    home.mkdir(parents=True)
    shutil.copy(POSTGRES_INSTANCE, home / "dagster.yaml")
    console.print(
        f"results and Dagster's storage in PostgreSQL database {DEMO_DATABASE} "
        f"(results in schema example; read them with psql -d {DEMO_DATABASE})"
    )
    return on_postgres("example", DEMO_DSN_ENV)


@contextmanager
def _shared_spark(kind: str, folder: Path) -> Iterator[Edit]:
    """A Spark Connect server or a standalone cluster for the demo's runs, and the edit
    that points the example's pipelines at it (through ``DEMO_SPARK_ENV``)."""
    from backlog_dagster.spark import servers
    from backlog_dagster.tools.sample_run import DEFAULT_WARM_UP_S, warming

    begun = time.monotonic()
    if kind == "connect":
        with servers.connect_server(
            folder, warm_up=warming(folder, DEFAULT_WARM_UP_S, console.print)
        ) as server:
            os.environ[DEMO_SPARK_ENV] = server.url
            console.print(
                f"Spark Connect server up on {server.url} in {time.monotonic() - begun:.1f} s "
                f"(log: {server.log}); every run attaches to it"
            )
            yield on_spark(DEMO_SPARK_ENV)
        return
    with servers.standalone_cluster(folder) as (master, workers):
        os.environ[DEMO_SPARK_ENV] = master.url
        console.print(
            f"standalone cluster up on {master.url} with {len(workers)} workers in "
            f"{time.monotonic() - begun:.1f} s (logs in {folder}); each run's executors run there"
        )
        yield on_spark(DEMO_SPARK_ENV)


@contextmanager
def _on_kafka(topic_dir: Path, buckets: int) -> Iterator[Edit]:
    """A mock Kafka cluster with an ``orders`` topic that follows the log's, and the edit
    that points the example's pipelines at it (through ``DEMO_KAFKA_ENV``)."""
    from backlog_dagster.kafka.mock_broker import held_everything, mock_broker
    from backlog_dagster.tools.mirror import mirrored

    with mock_broker(1) as broker:
        broker.create_topic("orders", buckets)
        os.environ[DEMO_KAFKA_ENV] = broker.bootstrap
        began = time.monotonic()
        with mirrored(topic_dir, broker.bootstrap, "orders"):
            try:
                held_everything(broker.bootstrap, "orders")
            except RuntimeError as error:
                raise click.ClickException(
                    f"--kafka: {error} (e.g. --records 500000 --buckets 16)"
                ) from None
            console.print(
                f"kafka (librdkafka's mock cluster) on {broker.bootstrap}: topic orders, "
                f"{buckets} partitions, the backlog copied in {time.monotonic() - began:.1f} s; "
                "both pipelines read it"
            )
            yield all_of(*(on_kafka(name, DEMO_KAFKA_ENV, "orders") for name in PIPELINES))


def _produce(topic_dir: Path, rate: float, first_id: int, stop: threading.Event) -> None:
    if rate > 0:
        with Topic(topic_dir) as topic:
            produce_live(topic, rate, first_order_id=first_id, should_stop=stop.is_set)


class Timeline:
    """Polls the instance and the sink once a second and prints what changed."""

    def __init__(
        self,
        pipelines: dict[str, PipelineConfig],
        data_dir: Path,
        home: Path,
        port: int,
        started: float,
    ) -> None:
        self.pipelines = pipelines
        self.data_dir, self.home, self.port, self.started = data_dir, home, port, started
        self.seen: set[str] = set()
        self.lags: dict[str, list[int]] = {p: [] for p in PIPELINES}

    def say(self, key: str, text: str) -> None:
        if key not in self.seen:
            self.seen.add(key)
            console.print(f"[dim]{time.monotonic() - self.started:6.1f}s[/] {text}")

    def run(self, realtime_seconds: float) -> dict[str, list[int]]:
        import dagster as dg
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=self.port)
        with dg.DagsterInstance.from_config(str(self.home)) as instance:
            realtime_since: float | None = None
            next_lag = 0.0
            while realtime_since is None or time.monotonic() - realtime_since < realtime_seconds:
                time.sleep(1)
                running = 0
                for name in PIPELINES:
                    running += self._poll(instance, name)
                if running == len(PIPELINES) and realtime_since is None:
                    realtime_since = time.monotonic()
                if realtime_since is not None and time.monotonic() >= next_lag:
                    self._lag_line()
                    next_lag = time.monotonic() + 5
                if time.monotonic() - self.started > 1800:
                    raise click.ClickException("no switch within 30 minutes; see dagster-dev.log")
            for run in instance.get_runs(
                filters=dg.RunsFilter(
                    statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.QUEUED]
                )
            ):
                client.terminate_run(run.run_id)
                self.say(f"cancel {run.run_id}", f"cancelling {run.job_name} as the UI does")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and instance.get_runs(
                filters=dg.RunsFilter(
                    statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
                )
            ):
                time.sleep(1)
            self.say("stopped", "realtime runs cancelled; stopping Dagster")
        return self.lags

    def _poll(self, instance: DagsterInstance, name: str) -> int:
        """Print news for one pipeline; return 1 while its realtime run is up."""
        import dagster as dg

        from backlog_dagster.components.observations import FINISH_EVENT, finished_buckets
        from backlog_dagster.components.switch import STARTED_AS_TAG, runs_of_phase

        with open_sink(self.pipelines[name]) as sink:
            generation = sink.current_generation()
            history = sink.phase_history()
            phase = sink.phase()
            # Watched from the first realtime commit on: a standby run is up long before
            # the switch, and a realtime run may take a while to commit after it.
            committed = bool(history) and history[-1].phase == "realtime"
            committed = committed and sink.switch_gap(history[-1].generation) is not None
        if generation is None:
            return 0
        marks = ", ".join(f"{b.bucket}:{b.marker:,}" for b in generation.buckets.values())
        self.say(f"{name} markers", f"{name}: boundary markers taken (bucket:offset) {marks}")
        for record in instance.fetch_observations(dg.AssetKey(f"{name}_backlog"), 100).records:
            event = record.asset_observation
            for _, bucket, marker in finished_buckets(event) if event is not None else []:
                self.say(
                    f"{name} finish {bucket}",
                    f"{name}: bucket {bucket} reached its marker {marker:,} "
                    f"(sensor: {FINISH_EVENT})",
                )
        for index, change in enumerate(history[1:], start=1):
            lag = "" if change.lag_s is None else f", watermark lag {change.lag_s:,.0f} s"
            self.say(
                f"{name} phase {index}",
                f"{name}: [bold]{change.phase}[/] (isBacklog={change.phase == 'backlog'}), "
                f"generation {change.generation}{lag}: {change.cause}",
            )
        runs = runs_of_phase(instance, name, "realtime")
        if runs and runs[0].status == dg.DagsterRunStatus.STARTED:
            run = runs[0]
            if run.tags.get(STARTED_AS_TAG) == "backlog":
                how = "the backlog run went on as the realtime run, with its Spark"
            else:
                how = f"started with {run.run_config.get('ops')}" + (
                    " (a standby, warming up for the backlog's end)" if phase == "backlog" else ""
                )
            self.say(
                f"{name} realtime {run.run_id}", f"{name}: realtime run {run.run_id[:8]} {how}"
            )
            return 1 if committed else 0
        return 0

    def _lag_line(self) -> None:
        with Topic(self.data_dir / "example" / "orders") as topic:
            latest = sum(topic.latest_offsets().values())
        parts = []
        for name, config in self.pipelines.items():
            with open_sink(config) as sink:
                generation = sink.current_generation()
            reached = (
                0 if generation is None else sum(b.reached for b in generation.buckets.values())
            )
            lag = latest - reached
            self.lags[name].append(lag)
            parts.append(f"{name} lag {lag:,} records")
        console.print(
            f"[dim]{time.monotonic() - self.started:6.1f}s[/] realtime: " + "; ".join(parts)
        )


def _summary(pipelines: dict[str, PipelineConfig], lags: dict[str, list[int]]) -> None:
    for name, config in pipelines.items():
        with open_sink(config) as sink:
            history = sink.phase_history()
            gaps = [sink.switch_gap(c.generation) for c in history if c.phase == "realtime"]
            results = sink.read_results()
        gap = next((g for g in gaps if g is not None), None)
        lag = lags.get(name) or [0]
        console.print(
            f"{name}: switch gap (last backlog commit → first realtime commit) "
            f"{'none' if gap is None else f'{gap:.1f} s'}; realtime lag median "
            f"{statistics.median(lag):,.0f} records, max {max(lag):,}"
        )
        order = TOP_ROWS[name]
        top = results.sort_by(order).slice(0, 5).to_pylist()
        table = Table(title=f"{name}: top rows")
        for column in results.column_names:
            table.add_column(column)
        for row in top:
            table.add_row(*(_cell(column, value) for column, value in row.items()))
        console.print(table)


def _cell(column: str, value: object) -> str:
    """A value as the results view shows it: window bounds as date-times (UTC)."""
    if column in (WINDOW_START, WINDOW_END) and isinstance(value, str):
        moment = isoparse(value)
        return moment.strftime("%Y-%m-%d %H:%M:%S")
    return f"{value:,.2f}" if isinstance(value, float) else str(value)


#: How the summary orders each pipeline's results.
TOP_ROWS = {
    "customer_totals": [("total_amount", "descending")],
    "region_minutes": [("window_start", "descending"), ("region", "ascending")],
    "region_daily": [("window_start", "descending"), ("region", "ascending")],
}
