"""The bucketlog Spark source, on a real local SparkSession."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.readwriter import DataFrameReader

from backlog_dagster.log import create_topic
from backlog_dagster.source import Payload
from backlog_dagster.source.schema import parse_ddl
from backlog_dagster.source.spark import share_read_limit
from backlog_dagster.spark import home
from backlog_dagster.tools.workload import ORDERS_DDL
from tests.conftest import MakeTopic, all_records, append_orders


def reader_of(spark: SparkSession, path: Path) -> DataFrameReader:
    return spark.read.format("bucketlog").option("path", str(path))


def read(spark: SparkSession, path: Path, **options: object) -> DataFrame:
    reader = reader_of(spark, path)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def order_ids(df: DataFrame) -> list[int]:
    return sorted(row["order_id"] for row in df.select("order_id").collect())


def test_batch_reads_every_record_once_in_the_declared_schema(
    spark: SparkSession, make_topic: MakeTopic
) -> None:
    topic = make_topic(records=20_000, buckets=4)
    df = read(spark, topic.path)
    assert df.columns == [
        "order_id",
        "customer_id",
        "region",
        "amount",
        "event_time",
        "_bucket",
        "_offset",
    ]
    assert order_ids(df) == list(range(20_000))
    oracle = all_records(topic)
    got = df.groupBy("_bucket").agg(F.count("*").alias("n"), F.max("_offset").alias("top"))
    for row in got.collect():
        assert row["n"] == topic.bucket(row["_bucket"]).bounds().latest == row["top"] + 1
    first = df.orderBy("order_id").first()
    assert first is not None
    expected = oracle.filter(pa.compute.equal(oracle["order_id"], 0)).to_pylist()[0]
    assert first["customer_id"] == expected["customer_id"]
    assert first["event_time"].timestamp() == expected["event_time"].timestamp()


def test_batch_reads_exactly_the_requested_ranges_split_into_partitions(
    spark: SparkSession, make_topic: MakeTopic
) -> None:
    topic = make_topic(records=20_000, buckets=4)
    starts = {"0": 10, "2": 500}
    ends = {"0": 1000, "1": 7}
    df = read(
        spark,
        topic.path,
        startingOffsets=json.dumps(starts),
        endingOffsets=json.dumps(ends),
        maxRecordsPerPartition=100,
    )
    latest = topic.latest_offsets()
    expected = []
    for bucket in topic.buckets():
        low = starts.get(str(bucket), 0)
        high = ends.get(str(bucket), latest[bucket])
        expected += [(bucket, offset) for offset in range(low, high)]
    got = sorted((r["_bucket"], r["_offset"]) for r in df.select("_bucket", "_offset").collect())
    assert got == expected
    assert df.rdd.getNumPartitions() >= len(expected) // 100


def test_the_projects_reads_take_as_many_tasks_as_spark_has_cores(
    spark: SparkSession, make_topic: MakeTopic
) -> None:
    """More read tasks than cores only multiply the partial rows the shuffle merges."""
    topic = make_topic(records=300_000, buckets=1)
    start = dict.fromkeys(topic.buckets(), 0)
    end = topic.latest_offsets()
    assert read(spark, topic.path).rdd.getNumPartitions() == 3  # 100,000 records a task
    ours = topic.read_batch(spark, None, start, end)
    assert ours.rdd.getNumPartitions() == spark.sparkContext.defaultParallelism == 2
    assert ours.count() == 300_000
    # A one-chunk backlog asks for more, to show its progress in finished tasks.
    assert topic.read_batch(spark, None, start, end, tasks=3).rdd.getNumPartitions() == 3
    assert read(spark, topic.path, minPartitions=5).rdd.getNumPartitions() == 3


def test_batch_select_of_declared_columns_and_bad_declarations(
    spark: SparkSession, make_topic: MakeTopic
) -> None:
    topic = make_topic(records=1000, buckets=2)
    df = (
        spark.read.format("bucketlog")
        .schema("_offset BIGINT, amount DOUBLE, _bucket INT")
        .option("path", str(topic.path))
        .load()
    )
    assert df.count() == 1000 and df.columns == ["_offset", "amount", "_bucket"]
    with pytest.raises(PySparkException, match="column 'price' is not in topic orders"):
        spark.read.format("bucketlog").schema("price DOUBLE").option(
            "path", str(topic.path)
        ).load().collect()
    with pytest.raises(
        PySparkException, match="column 'amount' is double in topic orders, declared as string"
    ):
        spark.read.format("bucketlog").schema("amount STRING").option(
            "path", str(topic.path)
        ).load().collect()
    with pytest.raises(PySparkException, match="option maxRecordsPerTrigger must be a positive"):
        spark.readStream.format("bucketlog").option("path", str(topic.path)).option(
            "maxRecordsPerTrigger", "-3"
        ).load().writeStream.format("noop").start().awaitTermination(30)


def test_reading_below_the_earliest_offset_is_a_clear_error(
    spark: SparkSession, make_topic: MakeTopic
) -> None:
    topic = make_topic(records=4000, buckets=1)
    topic.bucket(0).truncate_before(1500)
    assert order_ids(read(spark, topic.path)) == list(range(1500, 4000))
    with pytest.raises(
        PySparkException,
        match=r"bucket 0: offset 10 is below the earliest "
        r"offset 1500",
    ):
        read(spark, topic.path, startingOffsets='{"0": 10}').collect()


def run_available_now(
    spark: SparkSession, path: Path, checkpoint: Path, **options: object
) -> list[tuple[int, list[int]]]:
    """Run an availableNow query; return each micro-batch's id and its order ids."""
    batches: list[tuple[int, list[int]]] = []

    def collect(batch: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, [r["order_id"] for r in batch.select("order_id").collect()]))

    stream = spark.readStream.format("bucketlog").option("path", str(path))
    for key, value in options.items():
        stream = stream.option(key, str(value))
    query = (
        stream.load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(180)
    assert query.exception() is None
    return batches


def test_streaming_honours_the_read_limit_and_restarts_from_its_checkpoint(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=10_000, buckets=4)
    checkpoint = tmp_path / "checkpoint"
    first = run_available_now(spark, topic.path, checkpoint, maxRecordsPerTrigger=3000)
    assert [len(ids) for _, ids in first] == [3000, 3000, 3000, 1000]
    append_orders(topic, 2500)
    second = run_available_now(spark, topic.path, checkpoint, maxRecordsPerTrigger=3000)
    assert second[0][0] == first[-1][0] + 1
    every = sorted(i for _, ids in first + second for i in ids)
    assert every == list(range(12_500))


def test_streaming_discovers_buckets_added_while_it_runs(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=3000, buckets=2)
    query = (
        spark.readStream.format("bucketlog")
        .option("path", str(topic.path))
        .load()
        .writeStream.format("memory")
        .queryName("discovery")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        topic.add_buckets(2)
        append_orders(topic, 4000)
        deadline = time.monotonic() + 60
        while spark.table("discovery").count() < 7000 and time.monotonic() < deadline:
            time.sleep(0.5)
        query.processAllAvailable()
        rows = spark.table("discovery").select("order_id", "_bucket").collect()
    finally:
        query.stop()
    assert sorted(r["order_id"] for r in rows) == list(range(7000))
    assert {r["_bucket"] for r in rows} == {0, 1, 2, 3}
    assert set(json.loads(query.lastProgress["sources"][0]["endOffset"])) == {"0", "1", "2", "3"}


def test_json_payload_reports_malformed_records_instead_of_crashing(
    spark: SparkSession, tmp_path: Path
) -> None:
    topic = create_topic(
        tmp_path / "events",
        parse_ddl("ts TIMESTAMP"),
        timestamp_column="ts",
        buckets=1,
        payload=Payload.JSON,
    )
    values = [json.dumps({"id": i, "amount": i * 1.5, "name": f"n{i}"}) for i in range(1000)]
    values[10] = '{"id": 10, "amount": '  # truncated
    values[500] = '{"id": "five hundred"}'  # wrong type
    values[501] = '{\n "id": 501\n}'  # valid, across lines
    values[999] = "[1, 2]"  # not an object
    topic.append(
        0,
        pa.table(
            {
                "ts": pa.array([0] * 1000, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                "value": values,
            }
        ),
    )
    schema = (
        "id BIGINT, amount DOUBLE, name STRING, _corrupt_record STRING, _error STRING, "
        "_offset BIGINT"
    )
    df = spark.read.format("bucketlog").schema(schema).option("path", str(topic.path)).load()
    rows = {r["_offset"]: r for r in df.collect()}
    assert len(rows) == 1000
    bad = sorted(o for o, r in rows.items() if r["_corrupt_record"] is not None)
    assert bad == [10, 500, 999]
    assert rows[500]["_corrupt_record"] == '{"id": "five hundred"}'
    assert rows[500]["id"] is None and rows[500]["_error"]
    assert rows[501]["id"] == 501 and rows[501]["_corrupt_record"] is None
    assert rows[998]["amount"] == 998 * 1.5 and rows[998]["name"] == "n998"

    with pytest.raises(PySparkException, match="bucket 0 offset 10: "):
        spark.read.format("bucketlog").schema("id BIGINT").option("mode", "FAILFAST").option(
            "path", str(topic.path)
        ).load().collect()
    with pytest.raises(PySparkException, match="declare a _corrupt_record STRING column"):
        spark.read.format("bucketlog").schema("id BIGINT").option(
            "path", str(topic.path)
        ).load().collect()


def test_ddl_parser_agrees_with_spark(spark: SparkSession) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    ddl = ORDERS_DDL + ", price DECIMAL(12, 2), flag BOOLEAN, day DATE, n INT"
    spark_schema = (
        StructType.fromDDL(ddl)
        if hasattr(StructType, "fromDDL")
        else spark.createDataFrame([], ddl).schema
    )
    assert to_arrow_schema(spark_schema, timezone="UTC") == parse_ddl(ddl)


def test_read_limit_is_shared_evenly_and_fully_used() -> None:
    assert share_read_limit({"0": 100, "1": 100}, 50) == {"0": 25, "1": 25}
    assert share_read_limit({"0": 5, "1": 100, "2": 0}, 50) == {"0": 5, "1": 45, "2": 0}
    assert share_read_limit({"0": 3, "1": 3, "2": 3}, 4) == {"0": 2, "1": 1, "2": 1}
    assert share_read_limit({"0": 3, "1": 4}, 100) == {"0": 3, "1": 4}


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"maxRecordsPerTrigger": "0"}, "maxRecordsPerTrigger must be a positive whole number"),
        ({"maxRecordsPerTrigger": "1.5"}, "maxRecordsPerTrigger must be a positive whole number"),
    ],
)
def test_a_stream_option_that_is_not_a_positive_number_is_refused_by_name(
    make_topic: MakeTopic, options: dict[str, str], refusal: str
) -> None:
    from backlog_dagster.log.spark import BucketLogDataSource

    topic = make_topic(records=10, buckets=1)
    source = BucketLogDataSource({"path": str(topic.path), **options})
    with pytest.raises(ValueError, match=refusal):
        source.streamReader(source.schema())


def imported_pyspark(spark: SparkSession) -> str:
    """Where the Python workers of ``spark`` import PySpark from."""
    from pyspark.sql import functions as F

    @F.udf("string", useArrow=False)
    def pyspark_file(_: int) -> str:
        import pyspark

        return str(pyspark.__file__)

    row = spark.range(1).select(pyspark_file("id").alias("file")).first()
    assert row is not None
    return str(row["file"])


def test_spark_s_python_workers_import_the_installed_pyspark(spark: SparkSession) -> None:
    """Not the zipped copy Spark puts first on their path, whose modules every process
    compiles again (``spark.home``)."""
    assert imported_pyspark(spark) == str(home.installed_home() / "__init__.py")
