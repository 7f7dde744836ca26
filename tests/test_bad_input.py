"""Bad input: bad records, a pipeline that does not fit its source, an unreachable sink, a
truncated log. Each gets an exact message, and nothing is lost or silently dropped."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from backlog_dagster.cli import main
from backlog_dagster.components.assets import backlog_asset
from backlog_dagster.log import Topic, create_topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.bad_records import BadRecord
from backlog_dagster.phases.markers import DefinitionChanged, current_generation
from backlog_dagster.phases.transform import TransformError, source_problems
from backlog_dagster.phases.truncation import LogTruncated
from backlog_dagster.phases.watermark import judged_by_arrival
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import SinkUnreachable, open_sink
from backlog_dagster.source import Payload
from backlog_dagster.source.schema import parse_ddl
from tests.conftest import MakeTopic
from tests.pipelines import (
    CUSTOMER_TOTALS,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
    write_defs,
)
from tests.test_backlog import wait_for
from tests.test_realtime import RealtimeThread, reached

SCHEMA = "customer STRING, amount DOUBLE, code STRING, at TIMESTAMP"
AT = "2026-11-20T10:00:00Z"
#: Offset (in bucket 0) → the record, and the reason it is bad.
BAD = {
    10: ('{"customer": "a", "amount": ', "does not parse: "),
    11: (
        json.dumps({"customer": "b", "amount": "ten", "code": "1", "at": AT}),
        "does not parse: ",
    ),
    12: (json.dumps({"amount": 3.0, "code": "1", "at": AT}), "key customer is missing or null"),
    13: (
        json.dumps({"customer": "c", "code": "1", "at": AT}),
        "sum input of total amount is missing or null",
    ),
    14: (
        json.dumps({"customer": "d", "amount": 1.0, "code": "x1", "at": AT}),
        "max input of top_code code_number = CAST(code AS INT) is null",
    ),
    15: (
        json.dumps({"customer": "e", "amount": 1.0, "code": "1"}),
        "event time at is missing or null",
    ),
}


def payments(tmp_path: Path, **source: Any) -> PipelineConfig:
    """A pipeline over a JSON topic, with a derived column that can fail."""
    return PipelineConfig.model_validate(
        {
            "name": "payments",
            "source": {
                "path": str(tmp_path / "payments"),
                "event_time": "at",
                "record_schema": SCHEMA,
                **source,
            },
            "transform": {
                "columns": {"code_number": "CAST(code AS INT)"},
                "keys": ["customer"],
                "aggregations": [
                    {"name": "total", "function": "sum", "column": "amount"},
                    {"name": "orders", "function": "count"},
                    {"name": "top_code", "function": "max", "column": "code_number"},
                ],
            },
            "sink": {"path": str(tmp_path / "results.sqlite"), "table": "payments"},
        }
    )


def json_topic(tmp_path: Path, records: int = 1_000, first: int = 0) -> Topic:
    path = tmp_path / "payments"
    if (path / "topic.sqlite").exists():
        topic = Topic(path)
    else:
        topic = create_topic(
            path, parse_ddl("ts TIMESTAMP"), timestamp_column="ts", buckets=2, payload=Payload.JSON
        )
    for bucket in (0, 1):
        values = [
            json.dumps({"customer": f"k{i % 7}", "amount": i / 4, "code": str(i % 5), "at": AT})
            for i in range(first, first + records)
        ]
        if bucket == 0 and first == 0:
            for offset, (text, _) in BAD.items():
                values[offset] = text
        now = pa.array([time.time_ns() // 1000] * records, pa.int64())
        topic.append(
            bucket,
            pa.table({"ts": now.cast(pa.timestamp("us", tz="UTC")), "value": values}),
        )
    return topic


def good_oracle(first: int, records: int, bad_offsets: set[int]) -> dict[str, tuple[float, int]]:
    want: dict[str, tuple[float, int]] = {}
    for bucket in (0, 1):
        for i in range(first, first + records):
            if bucket == 0 and i in bad_offsets:
                continue
            total, count = want.get(f"k{i % 7}", (0.0, 0))
            want[f"k{i % 7}"] = (total + i / 4, count + 1)
    return want


def assert_totals(got: dict[str, tuple[float, int]], want: dict[str, tuple[float, int]]) -> None:
    assert got.keys() == want.keys()
    for key, (total, count) in want.items():
        assert got[key][1] == count and got[key][0] == pytest.approx(total), key


def results_of(config: PipelineConfig) -> dict[str, tuple[float, int]]:
    with open_sink(config) as sink:
        rows = sink.read_results().to_pylist()
    return {r["customer"]: (r["total"], r["orders"]) for r in rows}


def test_bad_records_go_to_the_dead_letter_table_in_backlog_and_realtime(
    spark: SparkSession, tmp_path: Path
) -> None:
    topic = json_topic(tmp_path)
    config = payments(tmp_path)
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=print)
        letters = sink.read_dead_letters().to_pylist()
    assert report.bad_records == len(BAD) and report.rows_read == 2_000
    assert [(r["bucket"], r["offset"]) for r in letters] == [(0, o) for o in BAD]
    for row in letters:
        text, reason = BAD[row["offset"]]
        assert row["reason"].startswith(reason), row
        if reason.startswith("does not parse"):
            assert row["payload"] == text  # the raw text, as it was in the log
        else:  # the record as read, as JSON
            assert json.loads(row["payload"]).get("customer") == json.loads(text).get("customer")
    # The derived column names its expression in the reason.
    assert letters[4]["reason"] == (
        "max input of top_code code_number = CAST(code AS INT) is null: an input is missing "
        "or the expression failed"
    )
    assert_totals(results_of(config), good_oracle(0, 1_000, set(BAD)))

    # Realtime: more records, one of them bad, go the same ways.
    realtime = RealtimeThread(spark, config, tmp_path / "checkpoint")
    realtime.start()
    try:
        with Topic(topic.path) as live:
            live.append(
                1,
                pa.table(
                    {
                        "ts": pa.array([time.time_ns() // 1000], pa.int64()).cast(
                            pa.timestamp("us", tz="UTC")
                        ),
                        "value": ['{"customer": "z", "amount": oops}'],
                    }
                ),
            )
            json_topic(tmp_path, records=50, first=1_000)
            end = live.latest_offsets()
        deadline = time.monotonic() + 120
        while reached(config) != end:
            assert time.monotonic() < deadline, "realtime did not catch up"
            time.sleep(0.5)
    finally:
        realtime.stop()
    with open_sink(config) as sink:
        letters = sink.read_dead_letters().to_pylist()
    assert len(letters) == len(BAD) + 1
    assert (letters[-1]["bucket"], letters[-1]["offset"]) == (1, 1_000)
    assert letters[-1]["payload"] == '{"customer": "z", "amount": oops}'
    want = good_oracle(0, 1_000, set(BAD))
    for key, (total, count) in good_oracle(1_000, 50, set()).items():
        total_before, count_before = want.get(key, (0.0, 0))
        want[key] = (total_before + total, count_before + count)
    assert_totals(results_of(config), want)
    status = CliRunner().invoke(main, ["pipeline", "status", str(write_defs(tmp_path, config))])
    assert "bad records: 7 (in table payments_dead_letters)" in " ".join(status.output.split())


def test_on_bad_record_fail_stops_naming_bucket_and_offset(
    spark: SparkSession, tmp_path: Path
) -> None:
    json_topic(tmp_path)
    config = payments(tmp_path, on_bad_record="fail")
    with open_sink(config) as sink:
        with pytest.raises(BadRecord) as error:
            run_backlog(spark, config, sink, log=print)
        generation = sink.current_generation()
    message = str(error.value)
    assert message.startswith(
        "pipeline payments: bad record at bucket 0 offset 10: does not parse: "
    )
    assert message.endswith(
        '(record: \'{"customer": "a", "amount": \'); 6 bad record(s) in this batch, nothing '
        "of it committed. Fix the records or the schema, or set source.on_bad_record: "
        "dead_letter to keep bad records in payments_dead_letters and go on."
    )
    assert generation is not None and all(b.reached == 0 for b in generation.buckets.values())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"transform": {**CUSTOMER_TOTALS, "keys": ["customer"]}},
            "attributes.transform.keys.0: 'customer' is not a column of the source nor one of "
            "transform.columns; the source's columns: order_id, customer_id, region, amount, "
            "event_time",
        ),
        (
            {
                "transform": {
                    "keys": ["customer_id"],
                    "aggregations": [{"name": "total", "function": "sum", "column": "amout"}],
                }
            },
            "attributes.transform.aggregations.0.column: 'amout' is not a column of the source "
            "nor one of transform.columns; the source's columns: order_id, customer_id, region, "
            "amount, event_time",
        ),
        (
            {
                "source_event_time": "ordered_at",
                "transform": {**CUSTOMER_TOTALS, "window": {"size": "1m"}},
            },
            "attributes.source.event_time: 'ordered_at' is not a column of the source (a window "
            "needs it); its columns: order_id, customer_id, region, amount, event_time",
        ),
        (
            {"source_event_time": "amount"},
            "attributes.source.event_time: 'amount' is DOUBLE, not a TIMESTAMP; name a "
            "TIMESTAMP column or derive one under transform.columns",
        ),
        (
            {
                "transform": {
                    "keys": ["customer_id"],
                    "aggregations": [{"name": "total", "function": "sum", "column": "region"}],
                }
            },
            "attributes.transform.aggregations.0.column: sum needs a numeric input, and "
            "'region' is STRING; if it holds numbers, derive one under transform.columns, e.g. "
            "{region_number: CAST(region AS DOUBLE)}",
        ),
        (
            {
                "transform": {
                    "columns": {"label": "concat(region, '!')"},
                    "keys": ["customer_id"],
                    "aggregations": [{"name": "mean", "function": "avg", "column": "label"}],
                }
            },
            "attributes.transform.aggregations.0.column: avg needs a numeric input, and "
            "'label' is STRING",
        ),
        (
            {
                "transform": {
                    "keys": ["customer_id"],
                    "aggregations": [
                        {"name": "total", "function": "sum", "column": "amount"},
                        {"name": "doubled", "function": "sum", "column": "amout * 2"},
                    ],
                }
            },
            "attributes.transform.aggregations.1.column: Spark cannot use 'amout * 2': "
            "[UNRESOLVED_COLUMN.WITH_SUGGESTION]",
        ),
        (
            {"transform": {**CUSTOMER_TOTALS, "filter": "amout > 5"}},
            "attributes.transform.filter: Spark cannot use 'amout > 5': "
            "[UNRESOLVED_COLUMN.WITH_SUGGESTION]",
        ),
    ],
)
def test_a_pipeline_that_does_not_fit_its_source_is_refused_naming_the_field(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    change: dict[str, Any],
    expected: str,
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, change.get("transform", CUSTOMER_TOTALS))
    if "source_event_time" in change:
        source = config.source.model_copy(update={"event_time": change["source_event_time"]})
        config = config.model_copy(update={"source": source})
    with open_sink(config) as sink, pytest.raises(TransformError) as error:
        run_backlog(spark, config, sink, log=print)
    assert str(error.value).startswith(expected)


def test_a_run_names_the_defs_file_in_its_failure(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, {**CUSTOMER_TOTALS, "keys": ["customer"]})
    defs = tmp_path / "defs" / "customer_totals" / "defs.yaml"
    result = dg.materialize([backlog_asset(config, defs)], raise_on_error=False)
    failures = [e for e in result.all_events if e.is_step_failure]
    assert len(failures) == 1
    error = failures[0].step_failure_data.error
    assert error is not None
    assert f"{defs}: attributes.transform.keys.0: 'customer' is not a column" in error.message


def test_an_unreachable_sink_names_the_field(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    config = config.model_copy(
        update={"sink": config.sink.model_copy(update={"path": str(blocker / "results.sqlite")})}
    )
    with pytest.raises(SinkUnreachable) as error:
        open_sink(config)
    assert str(error.value) == (
        f"attributes.sink.path: cannot open the SQLite database {blocker / 'results.sqlite'} "
        f"([Errno 17] File exists: '{blocker}'); make sure its folder exists or can be "
        "created, and is writable"
    )


def test_a_windowed_pipeline_with_an_event_time_the_log_does_not_index(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A JSON field as the event time: the log cannot tell it by arrival, so lateness is
    judged at the committed progress (the same watermark: the smallest over buckets)."""
    topic = json_topic(tmp_path)
    attributes = payments(tmp_path).model_dump()
    attributes["transform"]["window"] = {"size": "1m"}
    attributes["realtime"]["checkpoint_interval"] = 0.3
    windowed = PipelineConfig.model_validate(attributes)
    assert source_problems(windowed, topic) == []
    assert not judged_by_arrival(windowed, topic)
    by_log = windowed.model_copy(
        update={"source": windowed.source.model_copy(update={"event_time": "_timestamp"})}
    )
    assert judged_by_arrival(by_log, topic)

    with open_sink(windowed) as sink:
        run_backlog(spark, windowed, sink, log=print)
    runner = RealtimeThread(spark, windowed, tmp_path / "checkpoint")
    runner.start()
    old = "2026-11-20T09:50:00Z"  # ten minutes before every record so far: late
    for bucket, at in ((0, old), (1, AT), (0, AT)):
        value = json.dumps({"customer": "late?", "amount": 1.0, "code": "1", "at": at})
        stamp = pa.array([time.time_ns() // 1000], pa.int64()).cast(pa.timestamp("us", tz="UTC"))
        topic.append(bucket, pa.table({"ts": stamp, "value": [value]}))
    wait_for(lambda: reached(windowed) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(windowed) as sink:
        late = sink.read_late().to_pylist()
        rows = {r["customer"]: r["orders"] for r in sink.read_results().to_pylist()}
    assert [(r["bucket"], r["offset"]) for r in late] == [(0, 1_000)]
    assert rows["late?"] == 2


def test_a_definition_changed_before_any_result_takes_new_markers(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A definition that never committed anything (it may never have run) is replaced
    without a reset: starting over loses nothing."""
    topic = make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink:
        current_generation(sink, topic, config, print)
    changed = pipeline(tmp_path, {**CUSTOMER_TOTALS, "keys": ["region"]})
    logged: list[str] = []
    with open_sink(changed) as sink:
        generation = current_generation(sink, topic, changed, logged.append)
        assert generation.number == 2
        assert generation.reason == "definition changed before any result"
    assert logged[0].startswith(
        "generation 2: the definition changed before any result was committed; new boundary "
        "markers taken: bucket 0 [0, "
    )


def test_state_of_a_different_definition_is_refused_with_the_fix(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=1_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink:
        generation = current_generation(sink, topic, config, print)
        sink.commit(
            generation.number,
            {0: 0},
            {0: 1},
            pa.table({"customer_id": ["C1"], "total_amount": [1.0], "orders": [1]})
            .append_column("largest_amount", pa.array([1.0]))
            .append_column("smallest_amount", pa.array([1.0]))
            .append_column("_mean_amount_sum", pa.array([1.0]))
            .append_column("_mean_amount_count", pa.array([1])),
        )
    changed = pipeline(tmp_path, {**CUSTOMER_TOTALS, "keys": ["region"]})
    with open_sink(changed) as sink, pytest.raises(DefinitionChanged) as error:
        current_generation(sink, topic, changed, print)
    assert str(error.value) == (
        "pipeline customer_totals: the sink holds results of a different definition (source "
        "start or transform changed since generation 1). Run `backlog-dagster pipeline reset` "
        "to start over with the new definition."
    )


def test_records_retention_removed_unread_stop_the_run_or_are_skipped_and_counted(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=8_000, buckets=2)
    config = pipeline(tmp_path, CUSTOMER_TOTALS)
    with open_sink(config) as sink:
        current_generation(sink, topic, config, print)  # the markers: from offset 0
    topic.bucket(1).truncate_before(100)
    with open_sink(config) as sink, pytest.raises(LogTruncated) as error:
        run_backlog(spark, config, sink, log=print)
    assert str(error.value) == (
        "pipeline customer_totals: retention removed 100 record(s) the pipeline had not read "
        "yet: bucket 1 offsets [0, 100). Set source.on_truncation: skip to go on from the "
        "earliest offsets the log holds (the skipped records are logged and counted), or run "
        "`backlog-dagster pipeline reset` to start over from what the log holds."
    )
    skipping = config.model_copy(
        update={"source": config.source.model_copy(update={"on_truncation": "skip"})}
    )
    logged: list[str] = []
    with open_sink(skipping) as sink:
        report = run_backlog(spark, skipping, sink, log=logged.append)
        assert sink.skipped_records() == 100
        results = sink.read_results().to_pandas()
    assert report.skipped_records == 100
    assert (
        "skipped 100 record(s) that retention removed before they were read: bucket 1 "
        "offsets [0, 100)"
    ) in logged
    end = topic.latest_offsets()
    oracle = customer_totals_oracle(records_up_to(topic, end, start={1: 100}))
    assert_same(results, oracle, ["customer_id"])


def test_retention_during_a_chunk_that_reads_on_commits_what_it_read_then_skips(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records removed unread while a chunk reads on in another Spark job: the job it
    has read commits first, then the gap is skipped and counted; nothing else is lost."""
    from backlog_dagster.phases import backlog as backlog_phase
    from backlog_dagster.phases import chunks

    monkeypatch.setattr(chunks, "FIRST_CHUNK_RECORDS", 10_000)
    topic = make_topic(records=60_000, buckets=2)
    config = pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        source={
            "path": str(tmp_path / "orders"),
            "event_time": "event_time",
            "on_truncation": "skip",
        },
        backlog={"checkpoint_interval": 60},
    )
    latest = topic.latest_offsets()
    real = backlog_phase._aggregate
    first_read: dict[int, int] = {}
    kept = [records_up_to(topic, {0: latest[0]})]

    def retention_after_the_first_job(*args: Any) -> Any:
        done = real(*args)
        if not first_read:
            first_read.update(args[4])  # the job's end offsets
            kept.append(records_up_to(topic, {1: first_read[1]}))
            topic.bucket(1).truncate_before(first_read[1] + 5_000)
        return done

    monkeypatch.setattr(backlog_phase, "_aggregate", retention_after_the_first_job)
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=print)
        assert sink.skipped_records() == 5_000
        results = sink.read_results().to_pandas()
    assert report.job_timings[0][0] == 10_000 and report.chunk_timings[0][0] == 10_000
    assert report.skipped_records == 5_000 and report.rows_read == 55_000
    kept.append(records_up_to(topic, latest, start={0: latest[0], 1: first_read[1] + 5_000}))
    assert_same(results, customer_totals_oracle(pd.concat(kept)), ["customer_id"])


def test_sql_text_reads_back_as_written(spark: SparkSession) -> None:
    """Dead letters' reasons quote the user's expressions inside Spark SQL text."""
    from backlog_dagster.spark import sql_text as sql

    tricky = "it's a \\ back'slash\\' -- not a comment\n\"quoted\" ✓"
    row = spark.range(1).selectExpr(
        f"{sql.text(tricky)} AS said", f"{sql.expression('1 -- a comment')} + 1 AS two"
    )
    column = "odd `name` with.dot"
    named = spark.range(1).withColumnRenamed("id", column).selectExpr(sql.name(column))
    assert [tuple(r) for r in row.collect()] == [(tricky, 2)]
    assert named.columns == [column]
