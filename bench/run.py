"""Backlog catch-up against plain streaming and pure batch; realtime latency; the example as
users run it.

    .venv/bin/python bench/run.py [--size small|default|reference]

On the reference ``orders`` workload (8 buckets, event times over five days), same log,
same transform (``customer_totals``), same sink kind (SQLite), same machine, one run:

1. catch-up of ``compare`` records: ours (the example pipeline's backlog phase, with
   ``checkpoint_interval`` 0 and 2 s), a plain Structured Streaming query from the
   earliest offsets (settings in ``bench/cases.py``), one pure Spark batch job;
2. ours at 1x, 4x and 16x a base size, each size in a fresh process, with the Spark
   driver's peak memory;
3. realtime latency: records appended at the live rate, append → result visible in the
   sink, per record, at two micro-batch intervals;
4. the example project as users run it (``bench/e2e.py``'s runs, its cases in
   ``AS_USERS_RUN_IT``): every pipeline under ``dagster dev`` (sensor, daemon, real runs),
   a backlog and a live producer; time to each switch and to fresh, backlog records/s,
   the switch gap, realtime p99 and peak memory, beside the same backlogs in one warm
   process, so what running through Dagster costs shows.

Figures under a minute are medians of ``repeat`` runs. Writes
``bench/results/<date>-<size>.json`` and ``.png``, and the table in ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import page
from cases import (
    MicroBatchBreakdown,
    ProgressPoller,
    ours,
    plain_streaming,
    pure_batch,
    record_latencies,
    wait_until,
)
from report import write_plot

from backlog_dagster.log import Topic, create_topic
from backlog_dagster.pipeline.config import PipelineConfig, SourceConfig, WindowConfig
from backlog_dagster.pipeline.load import load_pipeline
from backlog_dagster.pipeline.paths import with_paths_under
from backlog_dagster.sink import open_sink
from backlog_dagster.tools.dev_server import process_kind, processes_under
from backlog_dagster.tools.workload import (
    ORDERS_SCHEMA,
    ORDERS_TIMESTAMP,
    produce_backlog,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from backlog_dagster.kafka.mock_broker import MockBroker
    from backlog_dagster.source import Source

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
EXAMPLE_DEFS = ROOT / "definitions" / "defs"
#: The example project's pipelines (region_daily's transform is the project's own code).
EXAMPLES = ("customer_totals", "region_minutes", "region_daily")
BUCKETS = 8


@dataclass(frozen=True)
class Preset:
    compare: int
    base: int
    multiples: tuple[int, ...]
    live_rate: int
    latency_seconds: float
    latency_intervals: tuple[float, ...]
    #: The example under ``dagster dev`` (part 4): its backlog, and runs per case.
    e2e_records: int
    e2e_repeat: int
    repeat: int = 3
    positive_interval: float = 2.0


PRESETS = {
    "small": Preset(
        compare=1_000_000,
        base=250_000,
        multiples=(1, 4, 16),
        live_rate=20_000,
        latency_seconds=20,
        latency_intervals=(0.5,),
        e2e_records=2_000_000,
        e2e_repeat=1,
    ),
    "default": Preset(
        compare=4_000_000,
        base=1_000_000,
        multiples=(1, 4, 16),
        live_rate=20_000,
        latency_seconds=45,
        latency_intervals=(0.5, 2.0),
        e2e_records=20_000_000,
        e2e_repeat=3,
    ),
    "reference": Preset(
        compare=20_000_000,
        base=1_250_000,
        multiples=(1, 4, 16),
        live_rate=20_000,
        latency_seconds=120,
        latency_intervals=(0.5, 2.0),
        e2e_records=20_000_000,
        e2e_repeat=3,
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(PRESETS), default="default")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--scaling-child", nargs=3, metavar=("TOPIC", "SINK_DIR", "REPEAT"))
    args = parser.parse_args()
    if args.scaling_child:
        topic, sinks, repeat = args.scaling_child
        print(json.dumps(_scaling_child(Path(topic), Path(sinks), int(repeat), args.master)))
        return

    preset = PRESETS[args.size]
    scratch = Path(tempfile.mkdtemp(prefix="bench-run-"))
    started = time.perf_counter()
    try:
        figures: dict[str, Any] = {
            "preset": args.size,
            "settings": asdict(preset),
            "machine": machine(),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        figures["catch_up"] = catch_up(scratch, preset, args.master)
        figures["scaling"] = scaling(scratch, preset, args.master)
        figures["realtime_latency"] = latency(scratch, preset, args.master)
        figures["as_users_run_it"] = as_users_run_it(preset)
        figures["bench_seconds"] = round(time.perf_counter() - started, 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}-{args.size}"
    stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
    write_plot(figures, stem.with_suffix(".png"))
    page.write()
    print(f"wrote {stem}.json, {stem}.png and BENCHMARKS.md in {figures['bench_seconds']:.0f} s")


# -- 1. catch-up -------------------------------------------------------------------------


def catch_up(scratch: Path, preset: Preset, master: str) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    topic = _topic(scratch / "compare" / "example" / "orders", preset.compare)
    spark = open_session(master, app_name="bench-catch-up")
    spark.sparkContext.setLogLevel("ERROR")
    config = _example(scratch / "compare")
    ours(spark, _fresh_sink(config, scratch, "warm-up"), 0)  # Python workers up, for everyone
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(preset.repeat):
        for interval in (0.0, preset.positive_interval):
            name = f"ours_interval_{interval:g}s"
            runs.setdefault(name, []).append(
                ours(spark, _fresh_sink(config, scratch, f"{name}-{rep}"), interval)
            )
            _say(name, runs[name][-1])
        runs.setdefault("pure_batch", []).append(
            pure_batch(spark, topic, scratch / f"batch-{rep}.sqlite")
        )
        _say("pure_batch", runs["pure_batch"][-1])
        runs.setdefault("plain_streaming", []).append(
            plain_streaming(
                spark, topic, scratch / f"plain-{rep}.sqlite", scratch / f"plain-checkpoint-{rep}"
            )
        )
        _say("plain_streaming", runs["plain_streaming"][-1])
    spark.stop()
    topic.close()
    summary = {name: _median_rate(results) for name, results in runs.items()}
    best_ours = summary["ours_interval_0s"]["records_per_second"]
    summary["ratios"] = {
        "ours_over_plain_streaming": best_ours / summary["plain_streaming"]["records_per_second"],
        "ours_over_pure_batch": best_ours / summary["pure_batch"]["records_per_second"],
        "ours_interval_over_plain_streaming": summary[
            f"ours_interval_{preset.positive_interval:g}s"
        ]["records_per_second"]
        / summary["plain_streaming"]["records_per_second"],
    }
    summary["records"] = preset.compare
    return summary


# -- 2. scaling ----------------------------------------------------------------------------


def scaling(scratch: Path, preset: Preset, master: str) -> list[dict[str, Any]]:
    rows = []
    for multiple in preset.multiples:
        records = preset.base * multiple
        folder = scratch / f"scale-{multiple}"
        _topic(folder / "orders", records).close()
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--master",
                master,
                "--scaling-child",
                str(folder / "orders"),
                str(folder),
                str(preset.repeat),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
        result["records"] = records
        result["multiple"] = multiple
        result["median_seconds"] = statistics.median(result["seconds"])
        result["records_per_second"] = records / result["median_seconds"]
        rows.append(result)
        print(
            f"scaling {multiple:>2}x ({records:,}): {result['median_seconds']:.2f} s, "
            f"driver peak {result['driver_peak_rss_mib']:,.0f} MiB"
        )
        shutil.rmtree(folder, ignore_errors=True)
    return rows


def _scaling_child(topic: Path, folder: Path, repeat: int, master: str) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    spark = open_session(master, app_name="bench-scaling")
    spark.sparkContext.setLogLevel("ERROR")
    config = _example(folder)
    ours(spark, _fresh_sink(config, folder, "warm-up", topic), 0)
    seconds = [
        ours(spark, _fresh_sink(config, folder, f"run-{rep}", topic), 0)["seconds"]
        for rep in range(repeat)
    ]
    jvm = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()  # type: ignore[union-attr]
    return {"seconds": seconds, "driver_peak_rss_mib": _peak_rss_mib(int(jvm))}


# -- 3. realtime latency -------------------------------------------------------------------


def latency(scratch: Path, preset: Preset, master: str) -> list[dict[str, Any]]:
    from backlog_dagster.implementations import open_session

    spark = open_session(master, app_name="bench-latency")
    spark.sparkContext.setLogLevel("ERROR")
    rows = [_latency_at(spark, scratch, preset, interval) for interval in preset.latency_intervals]
    spark.stop()
    return rows


def _latency_at(
    spark: SparkSession,
    scratch: Path,
    preset: Preset,
    interval: float,
    realtime_settings: dict[str, Any] | None = None,
    name: str = "",
    pipelines: tuple[str, ...] = ("customer_totals",),
    window: dict[str, Any] | None = None,
    kafka: MockBroker | None = None,
) -> dict[str, Any]:
    """Append → visible per record at ``interval`` s micro-batches (and any other
    ``realtime`` settings) of example ``pipelines`` (their realtime queries side by side
    in the one session, over one log and sink; ``window``: another ``transform.window``
    for each), with where each micro-batch spent its time and the CPU this process and
    its children (Spark's JVM and Python workers) took while records were appended.

    With ``kafka``, the records are produced to a topic of that broker (JSON values, as
    ``backlog-dagster kafka produce`` makes them) and the pipelines read it: a record is
    appended when its Kafka timestamp says (the producer stamps the time it produced
    it, to the millisecond)."""
    import psutil

    from backlog_dagster.phases.backlog import run_backlog
    from backlog_dagster.phases.realtime import RealtimeRun, run_realtime

    folder = scratch / (name or f"latency-{interval:g}")
    if kafka is None:
        log = _topic(folder / "example" / "orders", 100_000)
        topic: Source = log
        produce = ["log", "produce", str(log.path)]
    else:
        topic = _kafka_topic(kafka, f"orders-{name or interval}", 100_000)
        produce = ["kafka", "produce", "--bootstrap-servers", kafka.bootstrap]
        produce += ["--topic", topic.name]
    settings = {"checkpoint_interval": interval, **(realtime_settings or {})}
    configs = []
    for pipeline in pipelines:
        config = _example(folder, pipeline)
        update: dict[str, Any] = {"realtime": config.realtime.model_copy(update=settings)}
        if kafka is not None:
            update["source"] = _on_kafka(config, kafka.bootstrap, topic.name)
        if window is not None:
            update["transform"] = config.transform.model_copy(
                update={"window": WindowConfig.model_validate(window)}
            )
        configs.append(config.model_copy(update=update))
    breakdown = MicroBatchBreakdown()
    breakdown.listen(spark)
    for config in configs:
        with open_sink(config) as sink:
            run_backlog(spark, config, sink, log=lambda _: None)
    stop = threading.Event()
    errors: list[BaseException] = []

    def realtime(config: PipelineConfig) -> None:
        try:
            with open_sink(config) as sink, open_sink(config) as status_sink:
                run_realtime(
                    spark,
                    config,
                    sink,
                    status_sink,
                    RealtimeRun(
                        checkpoint_dir=folder / f"checkpoint-{config.name}",
                        should_stop=stop.is_set,
                        log=lambda _: None,
                    ),
                )
        except BaseException as error:
            errors.append(error)

    runners = [threading.Thread(target=realtime, args=(c,), daemon=True) for c in configs]
    for runner in runners:
        runner.start()
    time.sleep(15)  # the queries' first (empty) batches; Python workers are warm already
    pollers = [ProgressPoller(Path(c.sink.path), c.name) for c in configs]
    for poller in pollers:
        poller.start()
    start = topic.latest_offsets()
    cpu_before, began = _tree_cpu_s(psutil.Process()), time.monotonic()
    subprocess.run(
        [
            str(Path(sys.executable).with_name("backlog-dagster")),
            *produce,
            "--records",
            "0",
            "--live-rate",
            str(preset.live_rate),
            "--live-seconds",
            str(preset.latency_seconds),
            "--seed",
            "7",
        ],
        check=True,
        capture_output=True,
    )
    cpu_cores = (_tree_cpu_s(psutil.Process()) - cpu_before) / (time.monotonic() - began)
    end = topic.latest_offsets()
    for config in configs:
        wait_until(_caught_up(config, end), 300, f"{config.name}'s realtime to take the records")
    time.sleep(0.5)
    breakdown.collect(spark)
    for poller in pollers:
        poller.stop()
    stop.set()
    for runner in runners:
        runner.join(120)
    breakdown.stop(spark)
    with topic:
        if errors:
            raise errors[0]
        each = {
            c.name: record_latencies(topic, p, start, end)
            for c, p in zip(configs, pollers, strict=True)
        }
    seconds = np.concatenate(list(each.values()))
    produced = sum(end[b] - start[b] for b in end)
    counts, edges = np.histogram(seconds, bins=40)
    row = {
        "checkpoint_interval_s": interval,
        "pipelines": list(pipelines),
        "live_rate_asked": preset.live_rate,
        "live_rate_reached": produced / preset.latency_seconds,
        "records": len(seconds),
        "p50_s": float(np.percentile(seconds, 50)),
        "p95_s": float(np.percentile(seconds, 95)),
        "p99_s": float(np.percentile(seconds, 99)),
        "max_s": float(seconds.max()),
        "p99_s_by_pipeline": {p: float(np.percentile(s, 99)) for p, s in each.items()},
        "cpu_cores_while_appending": cpu_cores,
        "histogram_s": edges.tolist(),
        "histogram_counts": counts.tolist(),
        "breakdown": breakdown.summary(),
    }
    print(
        f"latency of {', '.join(pipelines)} at {interval:g} s batches, "
        f"{row['live_rate_reached']:,.0f} records/s: p50 {row['p50_s']:.3f} s, "
        f"p95 {row['p95_s']:.3f} s, p99 {row['p99_s']:.3f} s, {cpu_cores:.2f} cores",
        flush=True,
    )
    return row


def _tree_cpu_s(process: Any) -> float:
    """CPU seconds of ``process`` and its living descendants so far."""
    import psutil

    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _caught_up(config: PipelineConfig, end: dict[int, int]) -> Any:
    def check() -> bool:
        with open_sink(config) as sink:
            generation = sink.current_generation()
        assert generation is not None
        return all(generation.buckets[b].reached >= offset for b, offset in end.items())

    return check


# -- 4. the example as users run it ------------------------------------------------------


#: The example as ``make demo`` runs it (a Spark per run) and as ``make demo ARGS="--spark
#: connect"`` does (one shared Spark Connect server), by ``bench/e2e.py``'s case names.
AS_USERS_RUN_IT = ("as_shipped", "shared_spark")


def as_users_run_it(preset: Preset) -> dict[str, Any]:
    """``bench/e2e.py``'s runs of the example under ``dagster dev`` for the cases in
    ``AS_USERS_RUN_IT``, alternating, with its in-process backlogs over the same records."""
    import e2e

    cases = [arg for case in AS_USERS_RUN_IT for arg in ("--case", case)]
    args = e2e.parse(
        [
            "--records",
            str(preset.e2e_records),
            "--live-rate",
            str(preset.live_rate),
            "--repeat",
            str(preset.e2e_repeat),
            *cases,
        ]
    )
    results, _, kept = e2e.measure(args)
    kept.unlink(missing_ok=True)
    return results


class MemorySampler(threading.Thread):
    """Peak resident memory (MiB) of every process under ``dagster dev``, by kind."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.root: int | None = None
        #: Processes outside ``dagster dev`` that count too (a Spark server the runs use).
        self.extra: list[int] = []
        self.peaks: dict[str, float] = {}
        self.stopping = threading.Event()

    def watch(self, pid: int) -> None:
        self.root = pid
        self.start()

    def run(self) -> None:
        while not self.stopping.wait(1.0):
            assert self.root is not None
            totals: dict[str, float] = {}
            for pid in processes_under(self.root) | {self.root}.union(
                *({extra} | processes_under(extra) for extra in self.extra)
            ):
                kind = process_kind(pid)
                if kind == "gone":
                    continue
                rss = _rss_mib(pid)
                self.peaks[kind] = max(self.peaks.get(kind, 0.0), rss)
                totals[kind] = totals.get(kind, 0.0) + rss
            total = sum(totals.values())
            self.peaks["sum_of_all"] = max(self.peaks.get("sum_of_all", 0), total)

    def stop(self) -> dict[str, float]:
        self.stopping.set()
        if self.is_alive():
            self.join(5)
        return {k: round(v, 1) for k, v in self.peaks.items()}


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- helpers -------------------------------------------------------------------------------


def _topic(path: Path, records: int) -> Topic:
    topic = create_topic(path, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=BUCKETS)
    produce_backlog(topic, records, days=5)
    return topic


def _kafka_topic(kafka: MockBroker, name: str, records: int) -> Source:
    """A new Kafka topic of ``BUCKETS`` partitions holding a backlog of ``records`` orders,
    open as a source."""
    from backlog_dagster.kafka.topic import KafkaSettings, KafkaTopic
    from backlog_dagster.tools.kafka_workload import KafkaOrders

    kafka.create_topic(name, BUCKETS)
    produce_backlog(KafkaOrders(kafka.bootstrap, name), records, days=5)
    return KafkaTopic(KafkaSettings(kafka.bootstrap, name))


def _on_kafka(config: PipelineConfig, bootstrap: str, topic: str) -> SourceConfig:
    """``config``'s source, reading the orders from Kafka ``topic`` instead of the log."""
    from backlog_dagster.tools.kafka_workload import ORDERS_RECORD_SCHEMA

    return SourceConfig.model_validate(
        {
            **config.source.model_dump(exclude={"path", "kind", "kafka", "record_schema"}),
            "kind": "kafka",
            "kafka": {"bootstrap_servers": bootstrap, "topic": topic},
            "record_schema": ORDERS_RECORD_SCHEMA,
        }
    )


def _example(data: Path, pipeline: str = "customer_totals") -> PipelineConfig:
    """One of the example project's pipelines (customer_totals unless named), its paths
    under ``data``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # region_daily's function is the project's
    return with_paths_under(load_pipeline(EXAMPLE_DEFS / pipeline / "defs.yaml"), data)


def _fresh_sink(
    config: PipelineConfig, scratch: Path, name: str, topic: Path | None = None
) -> PipelineConfig:
    source = (
        config.source if topic is None else config.source.model_copy(update={"path": str(topic)})
    )
    sink = config.sink.model_copy(update={"path": str(scratch / f"{name}.sqlite")})
    return config.model_copy(update={"source": source, "sink": sink})


def _median_rate(results: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = [r["seconds"] for r in results]
    median = statistics.median(seconds)
    extra = {k: v for k, v in results[0].items() if k not in ("seconds", "records", "chunks")}
    return {
        "seconds": seconds,
        "median_seconds": median,
        "records_per_second": results[0]["records"] / median,
        **extra,
    }


def _say(name: str, result: dict[str, Any]) -> None:
    print(
        f"{name}: {result['records']:,} records in {result['seconds']:.2f} s "
        f"({result['records'] / result['seconds']:,.0f}/s)",
        flush=True,
    )


def machine() -> dict[str, Any]:
    memory = next(
        int(line.split()[1]) // 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    import dagster
    import pyspark

    return {
        "cpus": os.cpu_count(),
        "memory_mib": memory,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "dagster": dagster.__version__,
        "java": java.splitlines()[0] if java else "unknown",
    }


if __name__ == "__main__":
    main()
