"""Our backlog against one pure Spark batch job over the same records, at two sizes.

    .venv/bin/python bench/batch_ratio.py [--sizes 4000000 16000000] [--repeat 5] [--warm-up 3]

Per size: the reference records (8 buckets) in a fresh log; in one warm Spark session
(``local[*]``), after ``warm_up`` rounds of each, ``repeat`` rounds alternating the example's
customer_totals backlog (``checkpoint_interval`` 0, into a fresh SQLite sink: markers,
the job, the commit with its progress) and one pure batch job with the same
aggregation whose rows are inserted into a fresh SQLite table (``bench/cases.py``).
Reports each one's median and the ratio of the medians' rates (target: at least 0.9).

Three warm-up rounds, not one: after one, both kept getting faster for three or four
rounds more as the JVM compiled their code (4,000,000 records, 2026-11-29: ours 2.12,
1.84, 1.72, 1.56, 1.53 s, the pure job 1.76, 1.76, 1.44, 1.45, 1.44 s), so the medians
weighed how far each had warmed up as much as what it costs.

Writes ``bench/results/<date>-batch-ratio.json`` and its section of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cases import ours, pure_batch, warm_session
from report import machine_line, publish
from run import _example, _fresh_sink, _topic, machine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_000_000, 16_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--warm-up", type=int, default=3)
    args = parser.parse_args()
    sizes: dict[str, Any] = {}
    with warm_session("bench-batch-ratio") as (spark, scratch):
        for records in args.sizes:
            folder = scratch / str(records)
            topic = _topic(folder / "example" / "orders", records)
            config = _example(folder)
            for round_ in range(args.warm_up):
                ours(spark, _fresh_sink(config, folder, f"warm-up-{round_}"), 0)
                pure_batch(spark, topic, folder / f"warm-up-batch-{round_}.sqlite")
            samples: dict[str, list[float]] = {"ours": [], "pure_batch": []}
            for round_ in range(args.repeat):
                run = ours(spark, _fresh_sink(config, folder, f"ours-{round_}"), 0)
                samples["ours"].append(run["seconds"])
                batch = pure_batch(spark, topic, folder / f"batch-{round_}.sqlite")
                samples["pure_batch"].append(batch["seconds"])
                print(
                    f"{records:,}: ours {run['seconds']:.2f} s, pure batch "
                    f"{batch['seconds']:.2f} s",
                    flush=True,
                )
            topic.close()
            medians = {name: statistics.median(s) for name, s in samples.items()}
            sizes[str(records)] = {
                "samples_s": samples,
                "median_s": medians,
                "ours_over_pure_batch": medians["pure_batch"] / medians["ours"],
            }
    results = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "repeat": args.repeat,
        "warm_up": args.warm_up,
        "sizes": sizes,
    }
    path = publish("batch-ratio", results, "batch_ratio.py", markdown(results))
    print(f"wrote {path} and BENCHMARKS.md")


def markdown(results: dict[str, Any]) -> str:
    lines = [
        "## The backlog against one pure Spark batch job (`bench/batch_ratio.py`)",
        "",
        f"{machine_line(results['machine'])}; {results['date']}. customer_totals over the "
        f"reference records in one local Spark session, after {results['warm_up']} "
        "warm-up rounds of each: our backlog phase "
        "(`checkpoint_interval: 0`, markers to commit) and one batch job with the same "
        "aggregation whose rows are inserted into SQLite, alternating, medians of "
        f"{results['repeat']}. Target: at least 0.9x.",
        "",
        "| records | ours (s) | pure batch (s) | ours / pure batch (rate) | samples: ours; batch |",
        "| ---: | ---: | ---: | ---: | --- |",
    ]
    for records, size in results["sizes"].items():
        samples = size["samples_s"]
        lines.append(
            f"| {int(records):,} | {size['median_s']['ours']:.2f} | "
            f"{size['median_s']['pure_batch']:.2f} | {size['ours_over_pure_batch']:.2f}x | "
            + ", ".join(f"{s:.2f}" for s in samples["ours"])
            + "; "
            + ", ".join(f"{s:.2f}" for s in samples["pure_batch"])
            + " |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
