"""``backlog-dagster demo``: the main job on the embedded defaults.

Creates an ``orders`` topic of the reference workload, then reads it back through the
``bucketlog`` Spark source in batch and in streaming (``availableNow`` with a read
limit, then a restart from the checkpoint after more records arrive), checking that
every record comes back exactly once, and prints counts and rates.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.table import Table

from backlog_dagster.log.cli import progress_bar
from backlog_dagster.log.topic import create_topic
from backlog_dagster.log.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

console = Console()


@click.command("demo")
@click.option(
    "--records",
    type=click.IntRange(min=1),
    default=2_000_000,
    show_default=True,
    help="Backlog records to load.",
)
@click.option("--buckets", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=Path(".data/demo"),
    show_default=True,
    help="Where the demo keeps its topic and checkpoints.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
def demo(records: int, buckets: int, data_dir: Path, master: str) -> None:
    """Load a backlog into the embedded log and read it back through Spark."""
    if data_dir.exists():
        shutil.rmtree(data_dir)
    topic_dir = data_dir / "orders"
    figures: list[tuple[str, int, float]] = []

    with create_topic(
        topic_dir, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=buckets
    ) as topic:
        started = time.monotonic()
        with progress_bar() as bar:
            task = bar.add_task("load backlog", total=records, rate="")
            next_id = produce_backlog(
                topic,
                records,
                days=5,
                on_progress=lambda done: bar.update(task, completed=done, rate=""),
            )
        figures.append(("append to the log", records, time.monotonic() - started))

        console.print(f"starting Spark ({master}) …")
        started = time.monotonic()
        from backlog_dagster.spark.session import get_session

        spark = get_session(master, app_name="backlog-dagster-demo")
        spark.sparkContext.setLogLevel("ERROR")
        console.print(f"Spark ready in {time.monotonic() - started:.1f} s")

        from pyspark.sql import functions as F

        reader = spark.read.format("bucketlog").option("path", str(topic_dir))
        started = time.monotonic()
        per_bucket = {
            row["_bucket"]: row["n"]
            for row in reader.load().groupBy("_bucket").agg(F.count("*").alias("n")).collect()
        }
        figures.append(
            (
                "Spark batch read (first job, workers start)",
                sum(per_bucket.values()),
                time.monotonic() - started,
            )
        )
        expected = {b: v.records for b, v in topic.bounds().items()}
        _check("batch: per-bucket counts equal the log's", per_bucket == expected)

        started = time.monotonic()
        totals = (
            reader.load()
            .groupBy("customer_id")
            .agg(F.sum("amount"), F.count("*"), F.max("amount"))
            .count()
        )
        figures.append(("batch customer_totals", records, time.monotonic() - started))
        console.print(f"customer_totals: {totals:,} customers")

        checkpoint = str(data_dir / "checkpoints" / "stream")
        limit = max(1, records // 8)
        seen: list[tuple[int, int, int]] = []
        started = time.monotonic()
        _stream_once(spark, topic_dir, checkpoint, limit, seen)
        first_run = list(seen)
        figures.append(
            ("streaming availableNow", sum(n for _, n, _ in first_run), time.monotonic() - started)
        )
        _check(
            f"streaming: {len(first_run)} micro-batches, none over the limit of {limit:,}",
            all(n <= limit for _, n, _ in first_run),
        )

        more = 10_000
        produce_backlog(topic, more, days=0.01, seed=9, first_order_id=next_id)
        _stream_once(spark, topic_dir, checkpoint, limit, seen)
        restarted = seen[len(first_run) :]
        read_total = sum(n for _, n, _ in seen)
        distinct_total = sum(d for _, _, d in seen)
        _check(
            f"streaming restart from checkpoint read exactly the {more:,} new records",
            sum(n for _, n, _ in restarted) == more,
        )
        _check(
            "streaming: every record exactly once (no gap, no duplicate)",
            read_total == records + more == distinct_total,
        )
        spark.stop()

    table = Table(title="backlog-dagster demo")
    for column in ("step", "records", "seconds", "records/s"):
        table.add_column(column, justify="right" if column != "step" else "left")
    for step, count, seconds in figures:
        table.add_row(step, f"{count:,}", f"{seconds:.1f}", f"{count / seconds:,.0f}")
    console.print(table)


def _stream_once(
    spark: SparkSession,
    topic_dir: Path,
    checkpoint: str,
    limit: int,
    seen: list[tuple[int, int, int]],
) -> None:
    from pyspark.sql import functions as F

    def record(batch: DataFrame, batch_id: int) -> None:
        counts = F.count("*").alias("n"), F.count_distinct("order_id").alias("d")
        row = batch.agg(*counts).collect()[0]
        seen.append((batch_id, row["n"], row["d"]))

    query = (
        spark.readStream.format("bucketlog")
        .option("path", str(topic_dir))
        .option("maxRecordsPerTrigger", limit)
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def _check(what: str, ok: bool) -> None:
    console.print(f"[{'green' if ok else 'red'}]{'ok' if ok else 'FAILED'}[/] {what}")
    if not ok:
        raise SystemExit(1)
