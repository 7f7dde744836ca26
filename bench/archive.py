"""The backlog from a Parquet archive against the same records from the embedded log.

    .venv/bin/python bench/archive.py [--records 16000000] [--repeat 3]

The reference workload (8 buckets) goes into a topic of the embedded log; a copy of the
topic is archived whole to Parquet in Kafka Connect's layout (``log archive``'s code,
1,000,000 records a file) and truncated, so that its backlog reads every record from the
archive. The example's customer_totals backlog (``checkpoint_interval`` 0) then runs
over each, in one warm Spark session (``local[*]``), alternating, ``repeat`` times, each
into a fresh SQLite sink. The log's records reach Spark through the Python data source;
the archive's through Spark's own Parquet reader.

Writes ``bench/results/<date>-archive.json`` (``archive_over_log``: the archive's rate
over the log's) and its section of ``BENCHMARKS.md``.
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

from cases import _totals, ours
from report import backlog_cases, case_rows, machine_line, publish
from run import _example, _fresh_sink, _topic, machine

from backlog_dagster.log import Topic
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.tools.log_archive import archive_before

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=16_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    try:
        results = measure(scratch, args.records, args.repeat)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    path = publish("archive", results, "archive.py", _markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def measure(scratch: Path, records: int, repeat: int) -> dict[str, Any]:
    from backlog_dagster.implementations import open_session

    log_path = scratch / "example" / "orders"
    _topic(log_path, records).close()
    archived_path = scratch / "archived" / "orders"
    shutil.copytree(log_path, archived_path)
    began = time.perf_counter()
    with Topic(archived_path) as archived:
        end = archived.latest_offsets()
        archive_before(archived, scratch / "archive", end)
        for bucket, offset in end.items():
            archived.bucket(bucket).truncate_before(offset)
    archive_s = time.perf_counter() - began
    print(f"archived {records:,} records to Parquet in {archive_s:.1f} s")
    log_config = _example(scratch)
    archive_config = _from_archive(
        _fresh_sink(log_config, scratch, "unused", archived_path), scratch / "archive"
    )
    spark = open_session("local[*]", app_name="bench-archive")
    spark.sparkContext.setLogLevel("ERROR")
    ours(spark, _fresh_sink(log_config, scratch, "warm-log"), 0)
    ours(spark, _fresh_sink(archive_config, scratch, "warm-archive"), 0)
    files = sorted(str(p) for p in (scratch / "archive").rglob("*.parquet"))
    runs: dict[str, list[float]] = {"log": [], "archive": [], "parquet_alone": []}
    for rep in range(repeat):
        for name, config in (("log", log_config), ("archive", archive_config)):
            run = ours(spark, _fresh_sink(config, scratch, f"{name}-{rep}"), 0)
            assert run["records"] == records, run
            runs[name].append(round(run["seconds"], 2))
            print(f"{name}: {records:,} records in {run['seconds']:.2f} s")
        began = time.perf_counter()
        _totals(spark.read.parquet(*files)).toArrow()
        runs["parquet_alone"].append(round(time.perf_counter() - began, 2))
        print(f"parquet alone: {runs['parquet_alone'][-1]:.2f} s")
    spark.stop()
    cases = backlog_cases(runs, records)
    return {
        "records": records,
        "repeat": repeat,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "archive_write_records_per_second": round(records / archive_s),
        "backlog": cases,
        "archive_over_log": round(cases["log"]["median_s"] / cases["archive"]["median_s"], 3),
    }


def _from_archive(config: PipelineConfig, archive: Path) -> PipelineConfig:
    source = config.source.model_dump(mode="json") | {
        "archive": {"path": str(archive), "format": "parquet"}
    }
    return PipelineConfig.model_validate(
        config.model_dump(mode="json", by_alias=True) | {"source": source}
    )


def _markdown(results: dict[str, Any]) -> str:
    backlog = results["backlog"]
    rows = case_rows(
        [
            ("embedded log (Python data source)", backlog["log"]),
            ("Parquet archive (Spark's reader)", backlog["archive"]),
            ("the same files, Spark alone (no backlog run)", backlog["parquet_alone"]),
        ]
    )
    return f"""## The backlog from an archive

`bench/archive.py`, {results["date"][:10]}: the example's customer_totals backlog over the
same {results["records"]:,} reference records (8 buckets), from the embedded log and
from a Parquet archive in Kafka Connect's layout (1,000,000 records a file, the log
truncated behind it), in one warm Spark session, alternating, {results["repeat"]} times
each. {machine_line(results["machine"])}

| source | samples (s) | median (s) | records/s |
| --- | --- | --- | --- |
{rows}

The archive over the log (`archive_over_log`): **{results["archive_over_log"]:.2f}
times** the log's rate. The last row is Spark reading the archive's files and making
the same aggregation by itself, no backlog run around it (no markers, progress, sink or
per-bucket offsets): a bound on what reading the archive could gain. Writing the archive
ran at {results["archive_write_records_per_second"]:,} records/s.
"""


if __name__ == "__main__":
    main()
