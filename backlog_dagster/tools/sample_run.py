"""A small pipeline run end to end on a Spark: what warms a long-lived server up.

A Spark Connect server that ``backlog-dagster spark connect-server`` starts runs it
before it says it is up (``warm_up_server``): its JIT compiles the code that backlogs
and realtime micro-batches run while nothing waits on it. On a fresh server the C1 and
C2 compilers took 0.4 of a core a minute into the first pipelines' realtime. The example
under ``dagster dev`` on a shared server (``bench/e2e.py``, 2 cores, medians of three,
alternating): every pipeline within a second of its input 74.9 s after the start on a
warmed server, 99.9 s on one that was not, and the server took 1.35 to 1.42 cores for the
three realtime queries against 1.49 to 1.51.

A run is: a reference-workload log in ``folder``, each sample pipeline's backlog over
it, then their realtime queries side by side while records are appended at ``live_rate``
for ``realtime_s``. The pipelines cover both realtime paths: a sum per customer (no
windows) and sliding windows per region with every aggregation function.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backlog_dagster.pipeline.config import PipelineConfig
    from backlog_dagster.spark.servers import SparkServer

EVERY_FUNCTION = [
    {"name": "orders", "function": "count"},
    {"name": "amount", "function": "sum", "column": "amount"},
    {"name": "largest", "function": "max", "column": "amount"},
    {"name": "customers", "function": "count_distinct", "column": "customer_id"},
    {"name": "median", "function": "quantiles", "column": "amount", "quantiles": [0.5]},
]


def sample_pipelines(topic: Path, folder: Path) -> list[PipelineConfig]:
    """The sample pipelines over the log at ``topic``, their sink in ``folder``."""
    from backlog_dagster.pipeline.config import PipelineConfig

    transforms: dict[str, dict[str, Any]] = {
        "sample_totals": {
            "keys": ["customer_id"],
            "aggregations": [
                {"name": "orders", "function": "count"},
                {"name": "amount", "function": "sum", "column": "amount"},
            ],
        },
        "sample_windows": {
            "keys": ["region"],
            "window": {"size": "1h", "slide": "30m"},
            "aggregations": EVERY_FUNCTION,
        },
    }
    return [
        PipelineConfig.model_validate(
            {
                "name": name,
                "source": {"path": str(topic), "event_time": "event_time"},
                "transform": transform,
                "sink": {"path": str(folder / "results.sqlite"), "table": name},
                "backlog": {"checkpoint_interval": 0},
                "realtime": {"checkpoint_interval": 0.5},
            }
        )
        for name, transform in transforms.items()
    ]


def run_sample(
    spark: SparkSession,
    folder: Path,
    backlog_records: int,
    live_rate: int,
    realtime_s: float,
) -> int:
    """The sample pipelines' backlogs over ``backlog_records`` records, then their
    realtime queries side by side, each for ``realtime_s`` from its first micro-batch,
    while records are appended; the micro-batches they ran."""
    from backlog_dagster.log import create_topic
    from backlog_dagster.phases.backlog import run_backlog
    from backlog_dagster.sink import open_sink
    from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

    topic = create_topic(
        folder / "orders", ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=2
    )
    try:
        produce_backlog(topic, backlog_records, days=1)
        configs = sample_pipelines(topic.path, folder)
        for config in configs:
            with open_sink(config) as sink:
                run_backlog(spark, config, sink, log=lambda _: None)
        stop = threading.Event()
        appending = threading.Thread(
            target=_append_live, args=(topic.path, live_rate, backlog_records, stop)
        )
        appending.start()
        try:
            with ThreadPoolExecutor(len(configs)) as pool:
                queries = [pool.submit(_realtime, spark, c, folder, realtime_s) for c in configs]
                batches = sum(query.result() for query in queries)  # a failure is the run's
        finally:
            stop.set()
            appending.join()
        return batches
    finally:
        topic.close()


def _append_live(topic: Path, rate: int, first_order_id: int, stop: threading.Event) -> None:
    """Records at ``rate`` until ``stop``, through a topic handle of this thread's own
    (a handle's SQLite connections belong to the thread that opened them)."""
    from backlog_dagster.log import Topic
    from backlog_dagster.tools.workload import produce_live

    with Topic(topic) as handle:
        produce_live(handle, rate, first_order_id=first_order_id, should_stop=stop.is_set)


def _realtime(spark: SparkSession, config: PipelineConfig, folder: Path, seconds: float) -> int:
    """The pipeline's realtime query for ``seconds`` from its first micro-batch (a query
    takes seconds to start); its micro-batches."""
    from backlog_dagster.phases.realtime import RealtimeRun, RealtimeStatus, run_realtime
    from backlog_dagster.sink import open_sink

    first_batch: list[float] = []
    given_up = time.monotonic() + seconds + QUERY_START_PATIENCE_S

    def note(status: RealtimeStatus) -> None:
        if status.batches and not first_batch:
            first_batch.append(time.monotonic())

    def done() -> bool:
        now = time.monotonic()
        return now > given_up or (bool(first_batch) and now - first_batch[0] > seconds)

    with open_sink(config) as sink, open_sink(config) as status_sink:
        status = run_realtime(
            spark,
            config,
            sink,
            status_sink,
            RealtimeRun(
                checkpoint_dir=folder / f"checkpoint-{config.name}",
                should_stop=done,
                log=lambda _: None,
                on_status=note,
                status_every_s=0.5,
            ),
        )
    return status.batches


#: How long a sample query may take to run its first micro-batch (s) before the sample
#: gives up on it.
QUERY_START_PATIENCE_S = 120.0


#: Seconds of sample realtime a server started by ``backlog-dagster spark connect-server``
#: (and the demo's) runs before it says it is up.
DEFAULT_WARM_UP_S = 60.0
#: The live rate of a warm-up's realtime part (records/s): the reference workload's, so
#: its micro-batches are the size the real ones are. Its backlog holds as many records as
#: ``BACKLOG_PER_LIVE`` times its realtime part appends.
WARM_UP_LIVE_RATE = 20_000
BACKLOG_PER_LIVE = 2


def warm_up_server(url: str, folder: Path, seconds: float, log: Callable[[str], None]) -> None:
    """Warm the Spark Connect server at ``url`` with a sample run (its realtime part
    ``seconds`` long), its data in a scratch folder under ``folder`` (on the server's
    host, where its ``foreachBatch`` opens the sample's sink). A failed warm-up leaves
    the server as it is, and says why: the server still serves, unwarmed.

    The sample runs in a Python process of its own: a Spark Connect client marks its
    process as one (PySpark sets ``SPARK_CONNECT_MODE_ENABLED`` in its environment), and
    a local Spark started later from that process, or from any process it starts (the
    demo's ``dagster dev``), would then fail asking for a Connect URL.
    """
    started = time.monotonic()
    records = int(BACKLOG_PER_LIVE * WARM_UP_LIVE_RATE * seconds)
    log(f"warming the server up: a backlog of {records:,} records, then {seconds:g} s of realtime")
    scratch = Path(tempfile.mkdtemp(prefix="warm-up-", dir=folder))
    try:
        done = subprocess.run(
            [sys.executable, "-m", __name__, url, str(scratch), str(records), str(seconds)],
            capture_output=True,
            text=True,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    said = done.stdout.strip().splitlines()
    if done.returncode != 0 or not said or not said[-1].isdigit():
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        log(f"the warm-up failed ({error}); the server serves unwarmed")
        return
    log(f"server warmed up in {time.monotonic() - started:.0f} s ({said[-1]} micro-batches)")


def warming(
    folder: Path, seconds: float, log: Callable[[str], None]
) -> Callable[[SparkServer], None] | None:
    """What ``spark.servers.connect_server`` runs on a new server to warm it up for
    ``seconds`` (``warm_up_server``); None, for no warm-up, when ``seconds`` is 0."""
    if seconds <= 0:
        return None
    return lambda server: warm_up_server(server.url, folder, seconds, log)


def _warm_up(url: str, scratch: Path, records: int, seconds: float) -> None:
    """The warm-up's own process: the sample run on the server; prints its micro-batches."""
    from backlog_dagster.implementations import open_session

    spark = open_session(url, app_name="backlog-dagster-warm-up")
    try:
        print(run_sample(spark, scratch, records, WARM_UP_LIVE_RATE, seconds), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    _warm_up(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]))
