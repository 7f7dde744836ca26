"""The example's own PySpark, named by ``region_daily``'s ``transform.function``."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: The sales tax the example adds to each order's amount.
TAX_RATE = 0.2


def with_tax(records: DataFrame) -> DataFrame:
    """Each order with its amount including tax: record by record, in both phases."""
    return records.withColumn("amount_with_tax", F.col("amount") * (1 + TAX_RATE))
