"""``bench/run.py``'s figures as a PNG and as the table in ``BENCHMARKS.md``."""

from __future__ import annotations

import itertools
import json
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def write_plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    catch_up = figures["catch_up"]
    names = [
        n for n in catch_up if isinstance(catch_up[n], dict) and "records_per_second" in catch_up[n]
    ]
    fig, (bars, latency, scale) = plt.subplots(1, 3, figsize=(16, 4.8))
    rates = [catch_up[n]["records_per_second"] / 1e6 for n in names]
    bars.bar([n.replace("_", "\n") for n in names], rates, color="#4477aa")
    bars.set_ylabel("million records/s (median)")
    bars.set_title(f"catch-up of {catch_up['records']:,} records")
    for index, rate in enumerate(rates):
        bars.annotate(f"{rate:.2f}", (index, rate), ha="center", va="bottom")

    for row in figures["realtime_latency"]:
        edges, counts = row["histogram_s"], row["histogram_counts"]
        centres = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        latency.plot(
            centres,
            counts,
            marker=".",
            label=f"{row['checkpoint_interval_s']:g} s batches: p50 {row['p50_s']:.2f}, "
            f"p99 {row['p99_s']:.2f} s",
        )
    latency.set_xlabel("append → visible in the sink (s)")
    latency.set_ylabel("records")
    latency.set_title(f"realtime latency at {figures['settings']['live_rate']:,} records/s asked")
    latency.legend(fontsize=8)

    rows = figures["scaling"]
    scale.plot([r["records"] / 1e6 for r in rows], [r["median_seconds"] for r in rows], "o-")
    scale.set_xlabel("backlog (million records)")
    scale.set_ylabel("seconds (median)", color="#4477aa")
    scale.set_title("backlog time and driver peak memory by size")
    memory = scale.twinx()
    memory.plot(
        [r["records"] / 1e6 for r in rows],
        [r["driver_peak_rss_mib"] for r in rows],
        "s--",
        color="#cc6677",
    )
    memory.set_ylabel("driver peak RSS (MiB)", color="#cc6677")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_markdown(figures: dict[str, Any], stem: Path) -> str:
    """``bench/run.py``'s tables of the result ``stem``.json (``bench/page.py``)."""
    return _markdown(figures, stem)


def publish(name: str, results: dict[str, Any], script: str, section: str) -> Path:
    """Write ``results`` to ``bench/results/<date>-<name>.json`` and regenerate
    ``BENCHMARKS.md`` from the latest results (``bench/page.py``); the JSON's path.
    ``script`` and ``section`` (the bench's table of these results) are printed, so the
    run shows its figures whether or not the page lists this bench."""
    import page  # here: the page imports the benches, which import this module

    root = Path(__file__).resolve().parent.parent
    path = root / "bench" / "results" / f"{datetime.now(timezone.utc):%Y-%m-%d}-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"bench/{script}:\n{section}")
    page.write()
    return path


def backlog_cases(runs: dict[str, list[float]], records: int) -> dict[str, dict[str, Any]]:
    """Each case's samples (s), their median and the rate at the median."""
    cases = {}
    for name, seconds in runs.items():
        median = statistics.median(seconds)
        cases[name] = {
            "samples_s": seconds,
            "median_s": median,
            "records_per_second": round(records / median),
        }
    return cases


def case_rows(labelled: list[tuple[str, dict[str, Any]]]) -> str:
    """Markdown rows ``| label | samples | median | records/s |`` of ``backlog_cases``."""
    return "\n".join(
        f"| {label} | {', '.join(f'{s:.2f}' for s in case['samples_s'])} "
        f"| {case['median_s']:.2f} | {case['records_per_second']:,} |"
        for label, case in labelled
    )


def machine_line(machine: dict[str, Any]) -> str:
    """The machine a run was on, as the reports say it."""
    return (
        f"{machine['cpus']} cores, {machine['memory_mib'] // 1024} GiB, "
        f"PySpark {machine['pyspark']}, Dagster {machine['dagster']}"
    )


def _markdown(figures: dict[str, Any], stem: Path) -> str:
    catch_up, settings, machine = figures["catch_up"], figures["settings"], figures["machine"]
    plain = catch_up["plain_streaming"]
    ratios = catch_up["ratios"]
    lines = [
        "## Catch-up, realtime latency and the example as users run it (`bench/run.py`)",
        "",
        f"Reproduce: `.venv/bin/python bench/run.py --size {figures['preset']}` (presets: "
        "small, default, reference). Latest run: "
        f"{figures['date']}, {machine_line(machine)}; it took "
        f"{figures['bench_seconds'] / 60:.1f} minutes. Raw figures: "
        f"`bench/results/{stem.name}.json`; plot: `bench/results/{stem.name}.png`.",
        "",
        f"### Catch-up of {catch_up['records']:,} records (`customer_totals` into SQLite)",
        "",
        "| how | records/s (median of 3) | seconds |",
        "| --- | ---: | ---: |",
    ]
    labels = {
        "ours_interval_0s": "ours: backlog phase, `checkpoint_interval: 0`",
        f"ours_interval_{settings['positive_interval']:g}s": "ours: backlog phase, "
        f"`checkpoint_interval: {settings['positive_interval']:g}s`",
        "pure_batch": "one pure Spark batch job",
        "plain_streaming": "plain Structured Streaming catch-up",
    }
    for name, label in labels.items():
        row = catch_up[name]
        lines.append(
            f"| {label} | {row['records_per_second']:,.0f} | {row['median_seconds']:.2f} |"
        )
    lines += [
        "",
        f"Ours / plain streaming: **{ratios['ours_over_plain_streaming']:.1f}x** "
        f"(with the {settings['positive_interval']:g} s interval: "
        f"{ratios['ours_interval_over_plain_streaming']:.1f}x); ours / pure batch: "
        f"**{ratios['ours_over_pure_batch']:.2f}x** (targets: ≥ 5x and ≥ 0.9x). The plain "
        f"query: stateful aggregation in update mode, {plain['read_limit_per_trigger']:,} "
        f"records per trigger, a {plain['trigger']} processing-time trigger, "
        f"{plain['shuffle_partitions']} shuffle partitions, changed rows upserted per "
        "micro-batch.",
        "",
        "### Backlog time by size (each size in a fresh process)",
        "",
        "| records | seconds (median of 3) | records/s | driver peak RSS (MiB) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in figures["scaling"]:
        lines.append(
            f"| {row['records']:,} | {row['median_seconds']:.2f} | "
            f"{row['records_per_second']:,.0f} | {row['driver_peak_rss_mib']:,.0f} |"
        )
    lines += [
        "",
        "### Realtime latency (append → result visible in the sink, every record)",
        "",
        "| micro-batch interval | records/s reached | records | p50 (s) | p95 (s) | p99 (s) "
        "| max (s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in figures["realtime_latency"]:
        lines.append(
            f"| {row['checkpoint_interval_s']:g} s | {row['live_rate_reached']:,.0f} | "
            f"{row['records']:,} | {row['p50_s']:.3f} | {row['p95_s']:.3f} | "
            f"{row['p99_s']:.3f} | {row['max_s']:.3f} |"
        )
    import e2e  # here: it imports this module

    as_users_run_it = figures["as_users_run_it"]
    cases = " ".join(f"--case {case}" for case in as_users_run_it["cases"])
    lines += [
        "",
        e2e.markdown(
            as_users_run_it,
            heading="### The example as users run it, through `dagster dev` "
            f"(`bench/e2e.py {cases}`)",
        ).rstrip("\n"),
    ]
    return "\n".join(lines)
