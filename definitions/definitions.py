"""The example project: the reference ``orders`` log and three pipelines over it.

``dagster dev -w workspace.yaml`` shows:

- ``orders_log``: loads the reference backlog into the embedded log (if the topic is
  empty) and reports its buckets;
- ``orders_per_bucket``: reads the topic back through the ``bucketlog`` Spark source and
  checks every bucket's count against the log;
- the pipelines declared in ``defs/`` (``customer_totals``, ``region_minutes`` and
  ``region_daily``, which uses ``transforms.py``), each a
  ``backlog_dagster.BacklogPipeline`` component in its own ``defs.yaml``.
"""

import time
from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from backlog_dagster.implementations import session_of
from backlog_dagster.log import Topic, create_topic
from backlog_dagster.pipeline.paths import data_root
from backlog_dagster.spark.resource import spark_resource
from backlog_dagster.tools.workload import ORDERS_SCHEMA, ORDERS_TIMESTAMP, produce_backlog

#: Where the example keeps its data: ``.data/example`` in the project, unless set.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
TOPIC_DIR = data_root(PROJECT_ROOT) / "example" / "orders"


class OrdersLogConfig(dg.Config):
    records: int = 1_000_000
    """Backlog records to load when the topic is empty."""
    days: float = 5.0
    """The backlog's event times span this many days up to now."""
    buckets: int = 8


def bucket_table(topic: Topic) -> dg.TableMetadataValue:
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "bucket": info.bucket,
                    "earliest": info.bounds.earliest,
                    "latest": info.bounds.latest,
                    "size_bytes": info.size_bytes,
                }
            )
            for info in topic.describe()
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn(name, "int")
                for name in ("bucket", "earliest", "latest", "size_bytes")
            ]
        ),
    )


@dg.asset(description="The reference orders workload in the embedded bucketed log.")
def orders_log(context: dg.AssetExecutionContext, config: OrdersLogConfig) -> dg.MaterializeResult:
    if not (TOPIC_DIR / "topic.sqlite").exists():
        create_topic(
            TOPIC_DIR, ORDERS_SCHEMA, timestamp_column=ORDERS_TIMESTAMP, buckets=config.buckets
        ).close()
    with Topic(TOPIC_DIR) as topic:
        held = sum(b.records for b in topic.bounds().values())
        if held == 0:
            started = time.monotonic()
            produce_backlog(
                topic,
                config.records,
                config.days,
                on_progress=lambda done: context.log.info(
                    f"loaded {done:,} of {config.records:,} records"
                ),
            )
            context.log.info(f"loaded in {time.monotonic() - started:.1f} s")
        return dg.MaterializeResult(
            metadata={
                "path": str(TOPIC_DIR),
                "records": sum(b.records for b in topic.bounds().values()),
                "buckets": bucket_table(topic),
            }
        )


@dg.asset(deps=[orders_log], description="Records per bucket, read back through Spark.")
def orders_per_bucket(pyspark: LazyPySparkResource) -> dg.MaterializeResult:
    spark = session_of(pyspark)
    started = time.monotonic()
    rows = (
        spark.read.format("bucketlog")
        .option("path", str(TOPIC_DIR))
        .load()
        .groupBy("_bucket")
        .count()
        .collect()
    )
    seconds = time.monotonic() - started
    counts = {row["_bucket"]: row["count"] for row in rows}
    with Topic(TOPIC_DIR) as topic:
        expected = {b: v.records for b, v in topic.bounds().items() if v.records}
    if counts != expected:
        raise dg.Failure(f"Spark read {counts}, the log holds {expected}")
    total = sum(counts.values())
    return dg.MaterializeResult(
        metadata={"records": total, "seconds": seconds, "records_per_second": total / seconds}
    )


defs = dg.Definitions.merge(
    dg.Definitions(assets=[orders_log, orders_per_bucket], resources={"pyspark": spark_resource()}),
    dg.load_from_defs_folder(path_within_project=PROJECT_ROOT / "definitions"),
)
