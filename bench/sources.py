"""The backlog from a Kafka topic against the same records from the embedded log, and
against what the Kafka client alone reads from the same broker.

    .venv/bin/python bench/sources.py [--records 4000000] [--repeat 3]

The reference workload (8 buckets) goes into a topic of the embedded log (typed Arrow
records), then the same records into a Kafka topic on librdkafka's mock cluster (one
broker, its own process, on loopback) as zstd-compressed JSON values, spread evenly over
``partitions`` partitions (the mock keeps 5 MB a partition). In one run, alternating,
``repeat`` times each, in one warm Spark session (``local[*]``):

- the example's customer_totals backlog (``checkpoint_interval`` 0) over the log and
  over Kafka, each into a fresh SQLite sink, and the core-seconds each kind of process
  spent during the Kafka one (Spark's Python workers, its JVM, the driver's Python);
- our Kafka reader alone in a Spark job that drops what it reads (Spark's ``noop``
  format), with the values parsed against ``source.record_schema`` and as
  ``value_format: raw``;
- the ceiling (``bench/bare_kafka.py``): a bare confluent-kafka consumer per core over
  the same partitions and offsets, no Spark, keeping a count; then the same parsing each
  batch's values into Arrow.

Writes ``bench/results/<date>-sources.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bare_kafka
import psutil
from cases import ours
from report import backlog_cases, case_rows, machine_line, publish
from run import _example, _fresh_sink, _topic, machine

from backlog_dagster.kafka.mock_broker import held_everything, mock_broker
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.tools.kafka_workload import ORDERS_RECORD_SCHEMA, KafkaOrders

ROOT = Path(__file__).resolve().parent.parent
#: Records sent to one partition before the next: the mock cluster keeps 5 MB a
#: partition, so the records are spread evenly rather than keyed (one customer alone
#: has 8 % of the orders).
CHUNK = 10_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=4_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=64)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-sources-"))
    try:
        results = measure(scratch, args.records, args.repeat, args.partitions)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = publish("sources", results, "sources.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def measure(scratch: Path, records: int, repeat: int, partitions: int) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    log_topic = _topic(scratch / "example" / "orders", records)
    log_config = _example(scratch)
    with mock_broker(1) as broker:
        broker.create_topic("orders", partitions)
        load_s = _load(log_topic, KafkaOrders(broker.bootstrap, "orders"), partitions)
        held_everything(broker.bootstrap, "orders")
        print(f"loaded {records:,} records into Kafka in {load_s:.1f} s")
        kafka_config = _on_kafka(log_config, broker.bootstrap)
        spark = open_session("local[*]", app_name="bench-sources")
        spark.sparkContext.setLogLevel("ERROR")
        cases = _cases(spark, scratch, log_config, kafka_config, broker.bootstrap)
        for case in cases.values():  # warm: Spark's JIT, the Python workers, the broker
            case()
        runs: dict[str, list[float]] = {name: [] for name in cases}
        spent: list[dict[str, float]] = []
        for _ in range(repeat):
            for name, case in cases.items():
                before = _core_seconds()
                seconds = case()
                if name == "kafka_backlog":
                    spent.append(_spent(before, _core_seconds()))
                runs[name].append(round(seconds, 2))
                print(f"{name}: {records:,} records in {seconds:.2f} s")
        spark.stop()
    log_topic.close()
    found = backlog_cases(runs, records)
    ceiling = found["bare_client"]["median_s"]
    return {
        "records": records,
        "partitions": partitions,
        "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "kafka_load_records_per_second": round(records / load_s),
        "bare_client_processes": os.cpu_count(),
        "bare_client_settings": bare_kafka.SETTINGS,
        "cases": found,
        "of_the_bare_client": {
            name: round(ceiling / case["median_s"], 3) for name, case in found.items()
        },
        "kafka_over_log": round(
            found["log_backlog"]["median_s"] / found["kafka_backlog"]["median_s"], 3
        ),
        "kafka_backlog_core_seconds": {
            kind: round(statistics.median(s[kind] for s in spent), 2) for kind in spent[0]
        },
    }


def _cases(
    spark: Any, scratch: Path, log: PipelineConfig, kafka: PipelineConfig, bootstrap: str
) -> dict[str, Callable[[], float]]:
    """Each case: run it once, return its seconds."""
    from backlog_dagster.kafka.topic import KafkaSettings, KafkaTopic
    from backlog_dagster.source.schema import parse_ddl

    parsed = KafkaTopic(KafkaSettings(bootstrap, "orders"))
    raw = KafkaTopic(KafkaSettings(bootstrap, "orders", value_format="raw"))
    bounds = parsed.bounds()
    start = {p: b.earliest for p, b in bounds.items()}
    end = {p: b.latest for p, b in bounds.items()}
    ranges = {p: (start[p], end[p]) for p in bounds}
    schema = f"{ORDERS_RECORD_SCHEMA}, _corrupt_record STRING"
    count = iter(range(1_000_000))

    def backlog(config: PipelineConfig) -> Callable[[], float]:
        return lambda: ours(spark, _fresh_sink(config, scratch, f"run-{next(count)}"), 0)["seconds"]

    def dropped(frame: Callable[[], Any]) -> Callable[[], float]:
        def run() -> float:
            began = time.perf_counter()
            frame().write.format("noop").mode("overwrite").save()
            return time.perf_counter() - began

        return run

    def bare(parse: bool) -> Callable[[], float]:
        arrow = parse_ddl(ORDERS_RECORD_SCHEMA) if parse else None
        return lambda: bare_kafka.ceiling(bootstrap, "orders", ranges, arrow)["seconds"]

    return {
        "log_backlog": backlog(log),
        "kafka_backlog": backlog(kafka),
        "kafka_read_parsed": dropped(lambda: parsed.read_batch(spark, schema, start, end)),
        "kafka_read_raw": dropped(lambda: raw.read_batch(spark, None, start, end)),
        "bare_client": bare(False),
        "bare_client_parsed": bare(True),
    }


def _load(log_topic: Any, orders: KafkaOrders, partitions: int) -> float:
    """The log's records into Kafka, a chunk to each partition in turn; seconds taken."""
    began = time.perf_counter()
    turn = 0
    for bucket, bounds in log_topic.bounds().items():
        for batch in log_topic.read(bucket, bounds.earliest, bounds.latest):
            for start in range(0, batch.num_rows, CHUNK):
                orders.append(turn % partitions, _as_table(batch.slice(start, CHUNK)))
                turn += 1
    return time.perf_counter() - began


def _core_seconds() -> dict[str, float]:
    """CPU seconds so far of this process (the driver's Python) and its children, by
    kind: Spark's JVM, its Python workers, the mock broker."""
    me = psutil.Process()
    spent = {"driver_python": 0.0, "spark_jvm": 0.0, "python_workers": 0.0, "broker": 0.0}
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
            name, command = process.name(), " ".join(process.cmdline())
        except psutil.Error:
            continue
        if process.pid == me.pid:
            kind = "driver_python"
        elif name == "java":
            kind = "spark_jvm"
        elif "mock_broker" in command:
            kind = "broker"
        else:
            kind = "python_workers"
        spent[kind] += times.user + times.system
    return spent


def _spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Core-seconds between two readings (a process that ended between them is lost)."""
    return {kind: max(0.0, after[kind] - before[kind]) for kind in after}


def _as_table(batch: Any) -> Any:
    import pyarrow as pa

    return pa.Table.from_batches([batch])


def _on_kafka(config: PipelineConfig, bootstrap: str) -> PipelineConfig:
    source = config.source.model_dump(mode="json", exclude={"path"}) | {
        "kind": "kafka",
        "kafka": {"bootstrap_servers": bootstrap, "topic": "orders"},
        "record_schema": ORDERS_RECORD_SCHEMA,
    }
    return PipelineConfig.model_validate(
        config.model_dump(mode="json", by_alias=True) | {"source": source}
    )


#: Each case as the page names it.
LABELS = {
    "bare_client": "bare confluent-kafka consumer, one a core (the ceiling)",
    "bare_client_parsed": "the same, each batch's values parsed into Arrow",
    "kafka_read_raw": "our Kafka reader in Spark, `value_format: raw`, nothing kept",
    "kafka_read_parsed": "our Kafka reader in Spark, JSON parsed, nothing kept",
    "kafka_backlog": "the backlog from Kafka (JSON), customer_totals into SQLite",
    "log_backlog": "the backlog from the embedded log (Arrow), the same",
}


def _markdown(results: dict[str, Any]) -> str:
    cases, ratios = results["cases"], results["of_the_bare_client"]
    rows = case_rows([(LABELS[name], cases[name]) for name in LABELS])
    ratio_rows = "\n".join(f"| {LABELS[name]} | {ratios[name]:.2f} |" for name in LABELS)
    spent = results["kafka_backlog_core_seconds"]
    settings = ", ".join(f"`{k}={v}`" for k, v in results["bare_client_settings"].items())
    million = results["records"] / 1e6
    spent_rows = "\n".join(
        f"| {kind.replace('_', ' ')} | {seconds:.2f} | {seconds / million:.2f} |"
        for kind, seconds in spent.items()
    )
    return f"""## Kafka against its own client, and against the embedded log (`bench/sources.py`)

Reproduce: `.venv/bin/python bench/sources.py --records {results["records"]}`. Latest
run: {results["date"][:10]}, {machine_line(results["machine"])}. The same
{results["records"]:,} reference records in the embedded log (8 buckets, typed Arrow
records) and in a Kafka topic on librdkafka's mock cluster (one broker, its own process,
loopback; {results["partitions"]} partitions, as the mock keeps 5 MB a partition;
zstd-compressed JSON values), every case over the same broker, records and offsets in
one run, alternating, {results["repeat"]} times each after a warm-up, in one warm Spark
session (`local[*]`). The bare client runs {results["bare_client_processes"]} processes
with {settings} (`bench/bare_kafka.py`).

| case | samples (s) | median (s) | records/s |
| --- | --- | --- | --- |
{rows}

Each case as a share of the bare client's rate (same run):

| case | of the bare client |
| --- | ---: |
{ratio_rows}

Where the Kafka backlog's time goes: core-seconds spent during it (medians), by process.
On {results["machine"]["cpus"]} cores every process competes for the same CPUs, so the
backlog's rate is bounded by the sum, not by the slowest part.

| process | core-seconds | per million records |
| --- | ---: | ---: |
{spent_rows}

Kafka over the log: **{results["kafka_over_log"]:.2f} times** the log's rate. Loading
the records into the mock broker (confluent-kafka producer, idempotent, zstd) ran at
{results["kafka_load_records_per_second"]:,} records/s.
"""


if __name__ == "__main__":
    main()
