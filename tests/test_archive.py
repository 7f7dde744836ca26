"""The archive: a topic's older records in files, in Kafka Connect's layout."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession

from backlog_dagster.archive.layout import archived_end, files, records_in
from backlog_dagster.archive.source import ArchiveThenLog
from backlog_dagster.archive.spark import FORMAT
from backlog_dagster.cli import main
from backlog_dagster.implementations import open_source
from backlog_dagster.log import Topic
from backlog_dagster.phases.backlog import run_backlog
from backlog_dagster.phases.markers import current_generation
from backlog_dagster.phases.transform import read_schema
from backlog_dagster.phases.truncation import LogTruncated
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.source.spark import read_ranges
from tests.conftest import MakeTopic, append_orders
from tests.pipelines import (
    CUSTOMER_TOTALS,
    assert_same,
    customer_totals_oracle,
    pipeline,
    records_up_to,
)
from tests.test_backlog import kill_and_rerun_backlog, wait_for
from tests.test_realtime import RealtimeThread, reached

#: append_orders stamps its records within the 100 s before this moment.
END_S = 1_790_000_100


def archive(topic: Path, folder: Path, at_s: float, *more: str) -> str:
    moment = datetime.fromtimestamp(at_s, timezone.utc).isoformat()
    result = CliRunner().invoke(
        main, ["log", "archive", str(topic), str(folder), "--before-time", moment, *more]
    )
    assert result.exit_code == 0, result.output
    return result.output


def test_an_archive_holds_each_buckets_older_records_once_in_kafka_connect_layout(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=20_000, buckets=3)
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 60, "--records-per-file", "2500")
    archive(topic.path, folder, END_S - 20, "--records-per-file", "2500")  # goes on
    with Topic(topic.path) as log:
        for bucket, held in files(folder, "orders").items():
            assert all(
                f.path.name == f"orders+{bucket}+{f.start:010d}.parquet"
                and f.path.parent.name == f"partition={bucket}"
                for f in held
            )
            starts = [f.start for f in held]
            ends = [f.start + records_in(f) for f in held]
            assert starts[0] == 0 and starts[1:] == ends[:-1]  # no gap, no overlap
            end = log.offset_for_time(bucket, (END_S - 20) * 1_000_000)
            assert ends[-1] == end
            archived = pa.concat_tables(pq.read_table(f.path) for f in held)
            assert archived.equals(pa.Table.from_batches(list(log.read(bucket, 0, end))))
    assert "nothing new to archive" in archive(topic.path, folder, END_S - 20)


def test_an_archive_in_json_and_then_truncating_the_log(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=6_000, buckets=2)
    folder = tmp_path / "archive"
    with Topic(topic.path) as log:
        first_ids = {b: next(log.read(b, 0, 1))["order_id"][0].as_py() for b in log.buckets()}
    archive(topic.path, folder, END_S - 50, "--format", "json", "--truncate")
    with Topic(topic.path) as log:
        for bucket, bounds in log.bounds().items():
            assert bounds.earliest == archived_end(folder, "orders", bucket) > 0
            (only,) = files(folder, "orders")[bucket]
            rows = [json.loads(line) for line in only.path.read_text().splitlines()]
            assert len(rows) == bounds.earliest
            assert rows[0]["order_id"] == first_ids[bucket]


def archived_pipeline(tmp_path: Path, folder: Path, fmt: str = "parquet") -> PipelineConfig:
    return pipeline(
        tmp_path,
        CUSTOMER_TOTALS,
        source={
            "path": str(tmp_path / "orders"),
            "event_time": "event_time",
            "archive": {"path": str(folder), "format": fmt},
        },
        realtime={"checkpoint_interval": 0.5},
        backlog={"checkpoint_interval": 0.2},
    )


@pytest.mark.parametrize("fmt", ["parquet", "json"])
def test_backlog_from_the_archive_then_the_log_then_realtime_equal_the_oracle(
    spark: SparkSession,
    make_topic: MakeTopic,
    tmp_path: Path,
    fmt: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log keeps only its newer records; the archive the older ones."""
    from backlog_dagster.phases import chunks

    monkeypatch.setattr(chunks, "FIRST_CHUNK_RECORDS", 3_000)  # more than one chunk
    topic = make_topic(records=20_000, buckets=3)
    everything = records_up_to(topic, topic.latest_offsets())
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 50, "--format", fmt, "--truncate")
    assert all(b.earliest > 0 for b in topic.bounds().values())
    config = archived_pipeline(tmp_path, folder, fmt)
    lines: list[str] = []
    with open_sink(config) as sink:
        report = run_backlog(spark, config, sink, log=lines.append)
        assert all(b.start == 0 for b in sink.current_generation().buckets.values())  # type: ignore[union-attr]
    # Which part each bucket was read from, as the run's materialization says, and
    # which part holds an unfinished bucket's next record, as each chunk's line says.
    assert set(report.read_from.values()) == {"archive, log"}
    chunk_lines = [line for line in lines if "; chunk of " in line]
    assert len(chunk_lines) > 1, lines
    assert re.search(r"buckets 0:\d+% archive", chunk_lines[0]), chunk_lines[0]
    with open_source(config) as source:
        for bucket, bounds in topic.bounds().items():
            assert source.held_by(bucket, bounds.earliest - 1) == "archive"
            assert source.held_by(bucket, bounds.earliest) == "log"
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(results, customer_totals_oracle(everything), ["customer_id"])
    if fmt == "json":
        return  # realtime reads the log alone: once is enough
    runner = RealtimeThread(spark, config, tmp_path / "checkpoint")
    runner.start()
    append_orders(topic, 3_000)
    wait_for(lambda: reached(config) == topic.latest_offsets(), timeout=120)
    runner.stop()
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    assert_same(
        results,
        customer_totals_oracle(records_with_archive(folder, topic, fmt)),
        ["customer_id"],
    )


def test_what_archive_and_log_both_hold_counts_once_and_new_files_change_nothing(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=15_000, buckets=3)
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 60)  # the log keeps everything: they overlap
    config = archived_pipeline(tmp_path, folder)
    with open_sink(config) as sink, open_source(config) as source:
        current_generation(sink, source, config, print)  # the markers
        archive(topic.path, folder, END_S - 10)  # files appear before the backlog reads
        run_backlog(spark, config, sink, log=print)
        results = sink.read_results().to_pandas()
    assert_same(
        results,
        customer_totals_oracle(records_up_to(topic, topic.latest_offsets())),
        ["customer_id"],
    )


def test_offsets_neither_archive_nor_log_hold_are_named(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=9_000, buckets=1)
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 70)
    end = archived_end(folder, "orders", 0)
    assert end is not None
    topic.bucket(0).truncate_before(end + 500)  # retention took more than was archived
    config = archived_pipeline(tmp_path, folder)
    with (
        open_sink(config) as sink,
        pytest.raises(LogTruncated, match=rf"bucket 0 offsets \[{end}, {end + 500}\)"),
    ):
        run_backlog(spark, config, sink, log=print)


def test_a_hole_between_archive_files_stops_the_run_or_is_skipped_and_counted(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """A file lost from the middle of the archive: the backlog commits up to the hole,
    then stops naming it (on_truncation: fail) or goes past it, recording the skip."""
    topic = make_topic(records=12_000, buckets=2)
    hole = (2_000, 3_000)  # bucket 0's third file
    latest = topic.latest_offsets()
    kept = pd.concat(
        [
            records_up_to(topic, {0: hole[0]}),
            records_up_to(topic, {0: latest[0]}, {0: hole[1]}),
            records_up_to(topic, {1: latest[1]}),
        ],
        ignore_index=True,
    )
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 30, "--records-per-file", "1000", "--truncate")
    lost = files(folder, "orders")[0][2]
    assert (lost.start, lost.start + records_in(lost)) == hole
    lost.path.unlink()
    config = archived_pipeline(tmp_path, folder)
    named = rf"bucket 0 offsets \[{hole[0]}, {hole[1]}\)"
    with open_sink(config) as sink, pytest.raises(LogTruncated, match=named):
        run_backlog(spark, config, sink, log=print)
    skipping = config.model_copy(
        update={"source": config.source.model_copy(update={"on_truncation": "skip"})}
    )
    with open_sink(skipping) as sink:
        report = run_backlog(spark, skipping, sink, log=print)
        assert sink.skipped_records() == report.skipped_records == hole[1] - hole[0]
        results = sink.read_results().to_pandas()
    assert_same(results, customer_totals_oracle(kept), ["customer_id"])


def test_a_backlog_killed_while_it_reads_the_archive_recovers_exactly(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    """Chunks of 0.1 s over an archive that holds nine tenths of the records: killed
    inside a chunk after one committed (in the archive: the first chunks are there),
    the next run goes on from the sink's progress and the results equal the oracle."""
    topic = make_topic(records=200_000, buckets=4)
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 10, "--truncate")
    config = archived_pipeline(tmp_path, folder)
    config = config.model_copy(
        update={"backlog": config.backlog.model_copy(update={"checkpoint_interval": 0.1})}
    )
    markers = kill_and_rerun_backlog(config, topic, tmp_path)
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    up_to_markers = records_with_archive(folder, topic, "parquet", markers)
    assert_same(results, customer_totals_oracle(up_to_markers), ["customer_id"])


def test_a_parquet_archive_is_read_by_sparks_own_reader_at_the_same_offsets(
    spark: SparkSession, make_topic: MakeTopic, tmp_path: Path
) -> None:
    """The backlog's read of a Parquet archive is a Parquet scan, not the Python hand-over,
    and yields the records, offsets and times the Python reader does, over ranges that
    start and end inside files and reach on into the log."""
    topic = make_topic(records=12_000, buckets=2)
    folder = tmp_path / "archive"
    archive(topic.path, folder, END_S - 50, "--records-per-file", "1500", "--truncate")
    config = archived_pipeline(tmp_path, folder)
    with open_source(config) as source:
        assert isinstance(source, ArchiveThenLog)
        start = {b: 700 for b in source.bounds()}
        end = {b: v.latest - 300 for b, v in source.bounds().items()}
        schema = read_schema(config, source, arrival=True)
        native = source.read_batch(spark, schema, start, end)
        assert any(path.endswith(".parquet") for path in native.inputFiles())
        through_python = read_ranges(
            spark, spark.read.format(FORMAT).options(**source.spark_options()), schema, start, end
        )
        order = ["_bucket", "_offset"]
        got = native.toPandas().sort_values(order, ignore_index=True)
        expected = through_python.toPandas().sort_values(order, ignore_index=True)
        assert len(got) == sum(end[b] - start[b] for b in start)
        pd.testing.assert_frame_equal(got, expected)
        for bucket, held in files(folder, "orders").items():
            whole = source.max_record_time(bucket, held[0].start, held[0].start + 1500)
            part = source.max_record_time(bucket, held[0].start, held[0].start + 1499)
            expected_max = [
                int(pc.max(stored.record_times.cast(pa.int64())).as_py())
                for stored in source.read_records(bucket, held[0].start, held[0].start + 1500)
            ]
            assert whole == max(expected_max) and part is not None and part <= whole


def records_with_archive(
    folder: Path, topic: Topic, fmt: str, up_to: dict[int, int] | None = None
) -> pd.DataFrame:
    """Every record (up to offsets ``up_to``): the archive's below the log's earliest
    offset, then the log's."""
    frames = []
    for bucket, bounds in topic.bounds().items():
        end = (up_to or {}).get(bucket, bounds.latest)
        for held in files(folder, "orders").get(bucket, []):
            table = (
                pq.read_table(held.path)
                if fmt == "parquet"
                else pd.read_json(held.path, lines=True)
            )
            frame = table.to_pandas() if isinstance(table, pa.Table) else table
            keep = min(bounds.earliest, end) - held.start
            frames.append(frame.iloc[: max(0, keep)])
        if end > bounds.earliest:
            frames.append(records_up_to(topic, {bucket: end}, {bucket: bounds.earliest}))
    return pd.concat(frames, ignore_index=True)
