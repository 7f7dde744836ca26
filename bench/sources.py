"""The backlog from a Kafka topic against the same records from the embedded log.

    .venv/bin/python bench/sources.py [--records 4000000] [--repeat 3]

The reference workload (8 buckets) goes into a topic of the embedded log (typed Arrow
records), then the same records into a Kafka topic on librdkafka's mock cluster (one
broker, its own process, on loopback) as zstd-compressed JSON values, spread evenly over
``partitions`` partitions (the mock keeps 5 MB a partition).
The example's customer_totals backlog (``checkpoint_interval`` 0) then runs over each,
in one warm Spark session (``local[*]``), alternating, ``repeat`` times, each into a
fresh SQLite sink. What differs is the source: reading the log's files against fetching
from a broker over TCP and parsing JSON (``source.record_schema``) in the Python reader.

Writes ``bench/results/<date>-sources.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
        orders = KafkaOrders(broker.bootstrap, "orders")
        began = time.perf_counter()
        turn = 0
        for bucket, bounds in log_topic.bounds().items():
            for batch in log_topic.read(bucket, bounds.earliest, bounds.latest):
                for start in range(0, batch.num_rows, CHUNK):
                    orders.append(turn % partitions, _as_table(batch.slice(start, CHUNK)))
                    turn += 1
        load_s = time.perf_counter() - began
        held_everything(broker.bootstrap, "orders")
        print(f"loaded {records:,} records into Kafka in {load_s:.1f} s")
        kafka_config = _on_kafka(log_config, broker.bootstrap)
        spark = open_session("local[*]", app_name="bench-sources")
        spark.sparkContext.setLogLevel("ERROR")
        ours(spark, _fresh_sink(log_config, scratch, "warm-log"), 0)
        ours(spark, _fresh_sink(kafka_config, scratch, "warm-kafka"), 0)
        runs: dict[str, list[float]] = {"log": [], "kafka": []}
        for rep in range(repeat):
            for name, config in (("log", log_config), ("kafka", kafka_config)):
                run = ours(spark, _fresh_sink(config, scratch, f"{name}-{rep}"), 0)
                assert run["records"] == records, run
                runs[name].append(round(run["seconds"], 2))
                print(f"{name}: {records:,} records in {run['seconds']:.2f} s")
        spark.stop()
    log_topic.close()
    cases = backlog_cases(runs, records)
    return {
        "records": records,
        "partitions": partitions,
        "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "kafka_load_records_per_second": round(records / load_s),
        "backlog": cases,
        "kafka_over_log": round(cases["log"]["median_s"] / cases["kafka"]["median_s"], 3),
    }


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


def _markdown(results: dict[str, Any]) -> str:
    backlog = results["backlog"]
    rows = case_rows([("embedded log (Arrow)", backlog["log"]), ("Kafka (JSON)", backlog["kafka"])])
    return f"""## The backlog by source

`bench/sources.py`, {results["date"][:10]}: the example's customer_totals backlog over the
same {results["records"]:,} reference records, from the embedded log (8 buckets, typed
Arrow records) and from a Kafka topic on librdkafka's mock cluster (one broker, its own
process, loopback; {results["partitions"]} partitions, as the mock keeps 5 MB a
partition; zstd-compressed JSON values parsed against `source.record_schema`), in one
warm Spark session, alternating, {results["repeat"]} times each.
{machine_line(results["machine"])}

| source | samples (s) | median (s) | records/s |
| --- | --- | --- | --- |
{rows}

Kafka over the log: **{results["kafka_over_log"]:.2f} times** the log's rate. The
difference is the Python reader's work per record: librdkafka hands over one Python
object per message, and JSON is parsed where the log's records are already typed
columns. Loading the records into the mock broker (confluent-kafka producer,
idempotent, zstd) ran at {results["kafka_load_records_per_second"]:,} records/s.
"""


if __name__ == "__main__":
    main()
