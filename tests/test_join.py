"""transform.join: reference data joined to each record, read again in realtime, each
commit recording the version it joined."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pandas as pd
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError
from pyspark.sql import SparkSession

from backlog_dagster.log import Topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.reference import ReferenceError, read_reference
from backlog_dagster.phases.transform import source_problems
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import assert_same, in_chunks, records_up_to
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached
from tests.test_sink_contract import on_sink


def segments(tmp_path: Path, join: dict[str, object]) -> PipelineConfig:
    return in_chunks(
        tmp_path,
        {
            "join": {"on": ["customer_id"], "columns": ["segment"], **join},
            "keys": ["segment"],
            "aggregations": [
                {"name": "orders", "function": "count"},
                {"name": "total_amount", "function": "sum", "column": "amount"},
            ],
        },
        "segments",
    )


def reference_of(records: pd.DataFrame, gold: str) -> pd.DataFrame:
    """Every customer but one in ten: ``gold`` for ids ending in 0-4, silver otherwise."""
    customers = sorted(records["customer_id"].unique())
    kept = [c for i, c in enumerate(customers) if i % 10]
    return pd.DataFrame(
        {"customer_id": kept, "segment": [gold if c[-1] in "01234" else "silver" for c in kept]}
    )


def oracle(parts: list[tuple[pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    joined = pd.concat([records.merge(ref, on="customer_id") for records, ref in parts])
    return (
        joined.groupby("segment")
        .agg(orders=("amount", "size"), total_amount=("amount", "sum"))
        .reset_index()
    )


def test_the_reference_data_is_named_once_and_fits_the_source(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    with pytest.raises(ValidationError, match="by path or by table"):
        segments(tmp_path, {"path": "a.parquet", "table": "customers"})
    topic = make_topic(records=10, buckets=1)
    config = segments(tmp_path, {"path": "a.parquet", "on": ["customer"], "columns": ["region"]})
    assert [(p.field, p.message.split(";")[0]) for p in source_problems(config, topic)] == [
        ("transform.join.on.0", "'customer' is not a column of the source"),
        ("transform.join.columns.0", "'region' is a column of the source already"),
        (
            "transform.keys.0",
            "'segment' is not a column of the source nor one of transform.columns",
        ),
    ]


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_reference_table_in_the_sink_needs_one_row_per_key(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    dsn = request.getfixturevalue("postgres_dsn") if kind == "postgres" else None
    config = on_sink(segments(tmp_path, {"table": "customers"}), kind, dsn)

    def execute(*statements: str) -> None:
        if dsn is None:
            with sqlite3.connect(tmp_path / "results.sqlite") as db:
                for statement in statements:
                    db.execute(statement)
        else:
            with psycopg.connect(dsn, autocommit=True) as db:
                for statement in statements:
                    db.execute(statement.replace("customers", "results.customers"))

    with open_sink(config) as sink:
        with pytest.raises(ReferenceError, match=r"transform\.join\.table: no table"):
            read_reference(config, sink)
        execute(
            "CREATE TABLE customers (customer_id TEXT, segment TEXT, since TEXT)",
            "INSERT INTO customers VALUES ('C1', 'gold', '2020'), ('C2', 'silver', '2021'), "
            "('C1', 'silver', '2022')",
        )
        with pytest.raises(ReferenceError, match=r"1 key\(s\) on more than one row .*'C1'"):
            read_reference(config, sink)
        execute("DELETE FROM customers WHERE since = '2022'")
        first = read_reference(config, sink)
        assert sorted(first.table.to_pylist(), key=str) == [
            {"customer_id": "C1", "segment": "gold"},
            {"customer_id": "C2", "segment": "silver"},
        ]
        assert read_reference(config, sink).version == first.version


def test_joined_in_backlog_and_realtime_a_changed_table_joins_from_the_next_refresh(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=2)
    path = tmp_path / "customers.parquet"
    before = records_up_to(topic, topic.latest_offsets())
    first = reference_of(before, gold="gold")
    pq.write_table(pa.Table.from_pandas(first, preserve_index=False), path)
    config = segments(tmp_path, {"path": str(path), "refresh": "1s"})
    with open_sink(config) as sink:
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
        letters = sink.read_dead_letters().to_pandas()
    assert_same(results, oracle([(before, first)]), ["segment"])
    # A customer the table lacks has no segment: a dead letter saying so.
    unmatched = ~before["customer_id"].isin(first["customer_id"])
    assert len(letters) == unmatched.sum() > 0
    assert set(letters["reason"]) == {f"key segment is null: no row of join.path {path} matches"}

    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    append_orders(topic, 3_000, seed=21, live=True)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    middle = topic.latest_offsets()
    # The table changes: gold becomes platinum from the next refresh on.
    second = reference_of(before, gold="platinum")
    pq.write_table(pa.Table.from_pandas(second, preserve_index=False), path)
    time.sleep(2.5)
    append_orders(topic, 3_000, seed=22, live=True)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with Topic(topic.path) as log:
        early = records_up_to(log, middle)
        late = records_up_to(log, log.latest_offsets(), start=middle)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(results, oracle([(early, first), (late, second)]), ["segment"])
    # Each commit recorded the version it joined: the first table's, then the second's.
    with sqlite3.connect(tmp_path / "results.sqlite") as db:
        versions = [
            version
            for (version,) in db.execute(
                "SELECT joined FROM backlog_commits WHERE pipeline = 'segments' "
                "ORDER BY committed_at"
            )
        ]
    assert len(versions) > 2 and all(versions)
    assert len(set(versions)) == 2 and versions[0] != versions[-1]
    assert versions == sorted(versions, key=versions.index)  # one change, not back and forth
