"""Functions a user might name in ``transform.function``, some of them wrong on purpose."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: Orders at or above this amount are "large"; below it the band is left null for the
#: orders of region-00 (so those records lack a key and go to the dead letters).
LARGE = 200.0


def banded(records: DataFrame) -> DataFrame:
    """Enrich each record: its amount with tax, and a band (null for small region-00 orders)."""
    band = (
        F.when(F.col("amount") >= LARGE, F.lit("large"))
        .when(F.col("region") != "region-00", F.lit("small"))
        .otherwise(F.lit(None).cast("string"))
    )
    return records.withColumn("with_tax", F.col("amount") * 1.2).withColumn("band", band)


def totals(records: DataFrame) -> DataFrame:
    return records.groupBy("customer_id").agg(F.sum("amount").alias("amount"))


def without_offsets(records: DataFrame) -> DataFrame:
    return records.drop("_offset")


def sorted_records(records: DataFrame) -> DataFrame:
    return records.orderBy("amount")


def not_a_dataframe(records: DataFrame) -> int:
    return 1


def misspelt(records: DataFrame) -> DataFrame:
    return records.withColumn("x", F.col("amout") * 2)


NOT_CALLABLE = 3
