"""The user's own PySpark (``transform.function``): checked when Dagster loads the file,
applied in both phases, its results exact across the switch."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession

from backlog_dagster.phases import user_function
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.transform import TransformError, check_against_source
from backlog_dagster.phases.user_function import (
    FunctionError,
    checked_output,
    describe_output,
    load_function,
)
from backlog_dagster.sink import open_sink
from backlog_dagster.tools.workload import ORDERS_DDL
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import assert_same, in_chunks, pipeline, records_up_to
from tests.test_backlog import wait_for
from tests.test_pipeline_config import dagster_validate, make_project
from tests.test_realtime import RealtimeThread, reached
from tests.user_functions import LARGE

BANDS = {
    "function": "tests.user_functions:banded",
    "filter": "with_tax > 1",
    "keys": ["band"],
    "aggregations": [
        {"name": "orders", "function": "count"},
        {"name": "taxed", "function": "sum", "column": "with_tax"},
    ],
}
INPUT = f"{ORDERS_DDL}, _bucket INT, _offset BIGINT"
KEEP = ("event_time", "_bucket", "_offset")


def bands_oracle(records: pd.DataFrame) -> pd.DataFrame:
    taxed = records.assign(with_tax=records["amount"] * 1.2)
    band = pd.Series("small", index=taxed.index).where(taxed["amount"] < LARGE, "large")
    band = band.where((taxed["amount"] >= LARGE) | (taxed["region"] != "region-00"))
    good = taxed.assign(band=band)
    good = good[good["band"].notna() & (good["with_tax"] > 1)]
    return (
        good.groupby("band").agg(orders=("amount", "size"), taxed=("with_tax", "sum")).reset_index()
    )


def test_the_function_is_named_as_module_and_name(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match=r"transform\.function"):
        pipeline(tmp_path, {**BANDS, "function": "tests.user_functions.banded"})
    with pytest.raises(FunctionError, match=r"cannot import tests\.nowhere: ModuleNotFoundError"):
        load_function("tests.nowhere:banded")
    with pytest.raises(FunctionError, match="has no 'bandd'"):
        load_function("tests.user_functions:bandd")
    with pytest.raises(FunctionError, match="NOT_CALLABLE is a int, not a function"):
        load_function("tests.user_functions:NOT_CALLABLE")


@pytest.mark.parametrize(
    ("name", "refusal"),
    [
        ("totals", "tests.user_functions:totals aggregates: a function here must work record"),
        ("sorted_records", "tests.user_functions:sorted_records sorts records"),
        ("without_offsets", "tests.user_functions:without_offsets drops _offset: keep the"),
        ("not_a_dataframe", "tests.user_functions:not_a_dataframe: returned a int"),
        ("misspelt", "tests.user_functions:misspelt: fails on the source's columns"),
    ],
)
def test_a_function_that_is_not_record_wise_is_refused(
    spark: SparkSession, name: str, refusal: str
) -> None:
    spec = f"tests.user_functions:{name}"
    with pytest.raises(FunctionError) as error:
        checked_output(spec, describe_output(spark, spec, INPUT), KEEP)
    assert str(error.value).startswith(refusal), error.value


def test_its_columns_come_from_a_local_spark_once_then_from_the_cache(
    make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # As in a run on a shared Spark: this process opened a Spark Connect session.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    monkeypatch.setenv("SPARK_REMOTE", "sc://127.0.0.1:1")
    topic = make_topic(records=10, buckets=1)
    check_against_source(pipeline(tmp_path, BANDS), topic)
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 1

    def no_spark(spec: str, ddl: str) -> None:
        raise AssertionError("computed again")

    monkeypatch.setattr(user_function, "_in_subprocess", no_spark)
    # A key the function does not return is named with the function.
    with pytest.raises(TransformError) as error:
        check_against_source(pipeline(tmp_path, {**BANDS, "keys": ["banded"]}), topic)
    assert str(error.value).startswith(
        "attributes.transform.keys.0: 'banded' is not a column of what "
        "tests.user_functions:banded returns nor one of transform.columns; its columns: "
        "order_id, customer_id, region, amount, event_time, _bucket, _offset, with_tax, band"
    )


def test_the_function_is_applied_in_backlog_and_realtime_and_results_are_exact(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=2)
    config = in_chunks(tmp_path, BANDS, "bands")
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
    everything = records_up_to(topic, topic.latest_offsets())
    assert_same(results, bands_oracle(everything), ["band"])
    small_r0 = (everything["region"] == "region-00") & (everything["amount"] < LARGE)
    with open_sink(config) as sink:
        letters = sink.read_dead_letters().to_pandas()
    # Records the function left without a key are dead letters, with their reason.
    assert len(letters) == small_r0.sum() > 0
    assert set(letters["reason"]) == {"key band is missing or null"}

    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    for _ in range(3):
        append_orders(topic, 3_000)
        time.sleep(0.5)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(results, bands_oracle(records_up_to(topic, topic.latest_offsets())), ["band"])


UDF_MODULE = """
from pyspark.sql import functions as F

def version(_):
    return "{version}"

def tagged(records):
    return records.withColumn("version", F.udf(version, "string")("order_id"))
"""


def test_a_udf_of_the_function_s_module_runs_as_loaded_where_workers_cannot_import_it(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's Python workers (started before this module existed, its folder not on their
    path) run the function module's UDF as this process loaded it: after an edit, the new
    code, even in a worker kept from before."""
    module = tmp_path / "edited_udfs.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    records = spark.range(3).withColumnRenamed("id", "order_id")
    for version in ("first", "second"):
        module.write_text(UDF_MODULE.format(version=version))
        monkeypatch.delitem(sys.modules, "edited_udfs", raising=False)  # a new run's import
        tagged = user_function.apply_function(records, "edited_udfs:tagged")
        assert {row["version"] for row in tagged.collect()} == {version}


def test_dagster_refuses_an_aggregating_function_when_it_loads_the_file(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=10, buckets=1, name="data/orders")
    defs = make_project(tmp_path / "project", AGGREGATING_YAML)
    (defs.parents[2] / "functions.py").write_text(
        (Path(__file__).parent / "user_functions.py").read_text()
    )
    result = dagster_validate(
        tmp_path / "project",
        BACKLOG_DAGSTER_DATA=str(tmp_path / "data"),
        XDG_CACHE_HOME=str(tmp_path / "cache"),
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"attributes.transform.function at {defs}:5" in output, output[-4000:]
    assert "badproj.functions:totals aggregates: a function here must work record" in output


AGGREGATING_YAML = """\
type: backlog_dagster.BacklogPipeline
attributes:
  name: totals
  transform:
    function: badproj.functions:totals
    keys: [customer_id]
    aggregations:
      - {name: total, function: sum, column: amount}
  source: {path: orders, event_time: event_time}
  sink: {path: results.sqlite, table: totals}
"""
