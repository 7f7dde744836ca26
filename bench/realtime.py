"""Realtime latency at the live rate, and where each micro-batch spends its time.

    .venv/bin/python bench/realtime.py [--seconds 30] [--repeat 3] [--variant NAME ...]

An example pipeline in one warm local Spark session (``local[*]``): a 100,000-record
backlog, then records appended at 20,000 records/s for ``seconds``; per record, the
time from its append to its result being visible in the SQLite sink. Each variant in
``VARIANTS`` (customer_totals as before the cuts the breakdown pointed to, each cut, the
shipped settings at three intervals; the two windowed pipelines at 0.5 s; customer_totals
with Spark's default checkpoint file manager, and with its file-system one (alone and
with the other two pipelines); all three example pipelines' queries side by
side in the one session, as under ``dagster dev`` they share the machine; customer_totals
reading its records from Kafka at 0.5 s and 2 s (a topic of librdkafka's mock cluster, the
records produced at the live rate, JSON values; a record's append is its Kafka
timestamp); region_daily
in windows sliding by a minute, which the workload's late records miss every
micro-batch, with the late windows left out as data and, before, by a filter naming
them) runs ``repeat``
times, alternating, each on a fresh log and sink; ``--variant`` picks some, and without
it those in ``AS_SHIPPED`` run. "Before"
keeps the other cut (no observation where the log's index answers), which no setting
undoes.

Per variant: the medians over runs of p50, p99 and the largest latency (over every
pipeline's records; for several, also each one's p99), the CPU the process tree took
while records were appended (cores), and per part of
a micro-batch (Spark's own: finding the latest offsets, planning, its offset and commit
logs; ours: the commit's preparation, its Spark job, the sink's transaction) the median
over runs of the per-run medians. Writes ``bench/results/<date>-realtime.json`` and its
section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import functools
import math
import operator
import statistics
import sys
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import warm_session
from report import machine_line, publish
from run import PRESETS, _latency_at, machine

from backlog_dagster.kafka.mock_broker import mock_broker
from backlog_dagster.phases import micro_batch, transform
from backlog_dagster.phases.transform import LateWindows
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.source.records import BUCKET_COLUMN, OFFSET_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

READ_HERE = micro_batch.READ_HERE_MAX_RECORDS
ONE_TASK = micro_batch.ONE_TASK_MAX_RECORDS
WITHOUT_LATE_WINDOWS = transform._without_late_windows
WITH_SLIDING_WINDOWS = transform.with_sliding_windows


def _late_windows_named(records: DataFrame, late: LateWindows, size_us: int) -> DataFrame:
    """As before: the windows records came too late for left out by a filter naming each
    (bucket, window end, offsets), literals Spark writes into the code it generates."""
    from pyspark.sql import functions as F

    end = F.col(transform.SLIDE_START) + F.lit(size_us)
    named = [
        (F.col(BUCKET_COLUMN) == bucket)
        & (end == F.lit(window_end_us))
        & F.col(OFFSET_COLUMN).isin(list(offsets))
        for (bucket, window_end_us), offsets in late.items()
    ]
    return records.where(~functools.reduce(operator.or_, named))


def _sliding_windows_by_a_new_lambda(records: DataFrame, config: PipelineConfig) -> DataFrame:
    """As before: a row per sliding window, its starts filtered by a lambda PySpark
    names anew each time (the name goes into the generated code)."""
    from pyspark.sql import functions as F

    window = config.transform.window
    assert window is not None
    size_us, slide_us = window.size_us, window.slide_us
    at = F.unix_micros(F.col(config.source.event_time))
    last = at - F.pmod(at, F.lit(slide_us))
    earliest = last - F.lit((math.ceil(size_us / slide_us) - 1) * slide_us)
    starts = F.filter(F.sequence(earliest, last, F.lit(slide_us)), lambda s: s + size_us > at)
    return records.withColumn(transform.SLIDE_START, F.explode_outer(starts))


@dataclass(frozen=True)
class Variant:
    #: Micro-batch interval (s).
    interval: float
    #: Other ``realtime`` settings.
    settings: dict[str, Any] = field(default_factory=dict)
    #: Whether a small micro-batch is read where its commit runs, not by Spark's scan.
    read_here: bool = True
    #: Whether a small micro-batch read here is aggregated in one task, without a shuffle.
    one_task: bool = True
    #: The example pipelines whose queries run side by side.
    pipelines: tuple[str, ...] = ("customer_totals",)
    #: Session settings over the project's while the variant runs.
    session_conf: dict[str, str] = field(default_factory=dict)
    #: Another ``transform.window`` for every pipeline.
    window: dict[str, str] | None = None
    #: Whether late sliding windows are left out as before: by a filter naming them and a
    #: lambda named anew, new code for Spark to compile every micro-batch with late records.
    late_windows_named: bool = False
    #: Whether the records come from a Kafka topic (librdkafka's mock cluster, a process
    #: of its own) instead of the embedded log.
    kafka: bool = False


#: Spark's own default for checkpoint files, before the project set the FileSystem one.
FILE_CONTEXT = {
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileContextBasedCheckpointFileManager"
    )
}

ALL_THREE = ("customer_totals", "region_minutes", "region_daily")
#: Windows whose slide the workload's late records (31 s to 5 min) miss every micro-batch.
MINUTE_SLIDE = {"size": "2m", "slide": "1m", "allowed_lateness": "30s"}

VARIANTS: dict[str, Variant] = {
    "0.5 s, Spark's default checkpoint files (before)": Variant(0.5, session_conf=FILE_CONTEXT),
    "0.5 s, Spark's scan, 4 partitions (before)": Variant(
        0.5, {"shuffle_partitions": 4}, read_here=False
    ),
    "0.5 s, read here, 4 partitions": Variant(0.5, {"shuffle_partitions": 4}),
    "0.5 s (as shipped: read here, 1 partition)": Variant(0.5),
    "0.25 s (as shipped)": Variant(0.25),
    "2 s (as shipped; the example's interval)": Variant(2.0),
    "from Kafka, 0.5 s (as shipped)": Variant(0.5, kafka=True),
    "from Kafka, 2 s (the example's interval)": Variant(2.0, kafka=True),
    "region_minutes, 0.5 s": Variant(0.5, pipelines=("region_minutes",)),
    "region_daily, 0.5 s": Variant(0.5, pipelines=("region_daily",)),
    "0.5 s, two tasks and a shuffle (before)": Variant(0.5, one_task=False),
    "all three at once, 0.5 s, two tasks and a shuffle (before)": Variant(
        0.5, one_task=False, pipelines=ALL_THREE
    ),
    "all three at once, 0.5 s": Variant(0.5, pipelines=ALL_THREE),
    "all three at once, 0.25 s": Variant(0.25, pipelines=ALL_THREE),
    "region_daily, 2 min windows sliding by 1 min, 0.5 s": Variant(
        0.5, pipelines=("region_daily",), window=MINUTE_SLIDE
    ),
    "region_daily, 2 min windows sliding by 1 min, 0.5 s, late windows named (before)": Variant(
        0.5, pipelines=("region_daily",), window=MINUTE_SLIDE, late_windows_named=True
    ),
}


#: What a run without ``--variant`` measures: the settings as shipped, on the log and on
#: Kafka, each pipeline alone and the three at once. The variants that keep a cut out
#: ("before") measure what each cut gained, once: ``--variant`` names them.
AS_SHIPPED = (
    "0.5 s (as shipped: read here, 1 partition)",
    "2 s (as shipped; the example's interval)",
    "from Kafka, 0.5 s (as shipped)",
    "from Kafka, 2 s (the example's interval)",
    "region_minutes, 0.5 s",
    "region_daily, 0.5 s",
    "all three at once, 0.5 s",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS))
    args = parser.parse_args()
    preset = replace(PRESETS["default"], latency_seconds=args.seconds)
    names = args.variant or list(AS_SHIPPED)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    with ExitStack() as stack:
        kafka = None
        if any(VARIANTS[n].kafka for n in names):
            kafka = stack.enter_context(mock_broker(1))  # stopped after Spark
        spark, scratch = stack.enter_context(warm_session("bench-realtime"))
        # Unrecorded: every pipeline's code paths once (and the Kafka reader's), so that
        # the first variant does not pay the JIT's first work alone.
        used = tuple(dict.fromkeys(p for n in names for p in VARIANTS[n].pipelines))
        short = replace(preset, latency_seconds=10)
        _latency_at(spark, scratch, short, 0.5, name="warm-up", pipelines=used)
        if kafka is not None:
            _latency_at(spark, scratch, short, 0.5, name="warm-up-kafka", kafka=kafka)
        for round_ in range(args.repeat):
            for index, name in enumerate(names):
                variant = VARIANTS[name]
                micro_batch.READ_HERE_MAX_RECORDS = (
                    READ_HERE if variant.read_here else {False: -1, True: -1}
                )
                micro_batch.ONE_TASK_MAX_RECORDS = ONE_TASK if variant.one_task else -1
                transform._without_late_windows = (
                    _late_windows_named if variant.late_windows_named else WITHOUT_LATE_WINDOWS
                )
                transform.with_sliding_windows = (
                    _sliding_windows_by_a_new_lambda
                    if variant.late_windows_named
                    else WITH_SLIDING_WINDOWS
                )
                before = {key: spark.conf.get(key) for key in variant.session_conf}
                for key, value in variant.session_conf.items():
                    spark.conf.set(key, value)
                try:
                    row = _latency_at(
                        spark,
                        scratch,
                        preset,
                        variant.interval,
                        variant.settings,
                        name=f"run-{round_}-{index}",
                        pipelines=variant.pipelines,
                        window=variant.window,
                        kafka=kafka if variant.kafka else None,
                    )
                finally:
                    for key, value in before.items():
                        spark.conf.set(key, value)
                runs[name].append(row)
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "live_rate": preset.live_rate,
        "seconds": args.seconds,
        "repeat": args.repeat,
        "variants": {name: summarize(rows) for name, rows in runs.items()},
        "runs": runs,
    }
    path = publish("realtime", results, "realtime.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over runs of each run's latency percentiles and per-part medians."""
    parts: dict[str, list[float]] = {}
    for row in rows:
        for part, figures in row["breakdown"]["parts"].items():
            parts.setdefault(part, []).append(figures["median"])
    return {
        "p50_s": statistics.median(r["p50_s"] for r in rows),
        "p99_s": statistics.median(r["p99_s"] for r in rows),
        "p99_s_runs": [round(r["p99_s"], 3) for r in rows],
        "max_s": statistics.median(r["max_s"] for r in rows),
        "p99_s_by_pipeline": {
            pipeline: statistics.median(r["p99_s_by_pipeline"][pipeline] for r in rows)
            for pipeline in rows[0]["p99_s_by_pipeline"]
        },
        "cpu_cores": statistics.median(r["cpu_cores_while_appending"] for r in rows),
        "live_rate_reached": statistics.median(r["live_rate_reached"] for r in rows),
        "parts_median_s": {part: statistics.median(v) for part, v in parts.items()},
    }


def markdown(results: dict[str, Any]) -> str:
    variants = results["variants"]
    names = list(variants)
    lines = [
        "## Realtime latency and where a micro-batch's time goes (`bench/realtime.py`)",
        "",
        f"{machine_line(results['machine'])}; {results['date']}. customer_totals (unless "
        "a column names another example pipeline) in one warm local Spark session, live "
        f"{results['live_rate']:,} records/s for "
        f"{results['seconds']:g} s after a 100,000-record backlog; latency is a record's "
        "append to its result being visible in the SQLite sink. Medians over "
        f"{results['repeat']} runs per variant, alternating.",
        "",
        "| | " + " | ".join(names) + " |",
        "| --- |" + " --- |" * len(names),
    ]
    for label, key in (("p50", "p50_s"), ("p99", "p99_s"), ("largest", "max_s")):
        lines.append(
            f"| {label} | " + " | ".join(f"{variants[n][key]:.3f} s" for n in names) + " |"
        )
    lines.append(
        "| p99 per run | "
        + " | ".join(", ".join(f"{v:.2f}" for v in variants[n]["p99_s_runs"]) for n in names)
        + " |"
    )
    lines.append(
        "| p99 by pipeline, when several | "
        + " | ".join(
            ", ".join(f"{p} {v:.2f}" for p, v in variants[n]["p99_s_by_pipeline"].items())
            if len(variants[n]["p99_s_by_pipeline"]) > 1
            else ""
            for n in names
        )
        + " |"
    )
    lines.append(
        "| CPU while appending (cores: this process, its JVM and Python workers) | "
        + " | ".join(f"{variants[n]['cpu_cores']:.2f}" for n in names)
        + " |"
    )
    parts = list(variants[names[0]]["parts_median_s"])
    for part in parts:
        cells = []
        for n in names:
            value = variants[n]["parts_median_s"].get(part)
            if value is None:
                cells.append("")
            elif part == "records":
                cells.append(f"{value:,.0f}")
            else:
                cells.append(f"{value * 1000:.0f} ms")
        lines.append(f"| micro-batch: {part} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
