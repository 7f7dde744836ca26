"""The crash matrix's long run: random kill points at random moments, many trials.

    .venv/bin/python bench/crash.py [--trials 30] [--per-session 10] [--seed 1] [--resume]

Each session starts the example project under ``dagster dev`` on a fresh generated
backlog with a live producer (``tests/crash.py``), then runs trials one after another:
a kill point drawn at random, its moment drawn at random, the kill, the recovery, and
an audit of both pipelines' sinks against the log. A session ends with the producer
stopped, the pipelines caught up with the log's end and a last audit.

Writes ``bench/results/<date>-crash.json`` and ``<date>-crash.md`` (the table of trials:
kill point, recovered, lost, duplicated, recovery time), rewritten after every trial, so
a run stopped early leaves the table of the trials it finished (its header says how
many); with ``--spark-connect``, ``<date>-crash-spark-connect.*``. ``BENCHMARKS.md``
shows the newest run of either mode. ``--resume`` goes on from that day's file
up to ``--trials`` in new sessions (give it another ``--seed``); each trial records the
commit it ran on.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the harness lives in tests/
sys.path.insert(0, str(ROOT / "bench"))

import page  # noqa: E402
from report import machine_line  # noqa: E402
from run import machine  # noqa: E402

from backlog_dagster.spark.servers import connect_server, stop  # noqa: E402
from tests.crash import PIPELINES, ExampleUnderTest, audit, kill_points, run_trial  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--per-session", type=int, default=10)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--live-rate", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resume", action="store_true", help="go on from today's file")
    parser.add_argument(
        "--spark-connect",
        action="store_true",
        help="the runs share one Spark Connect server that outlives them (started here)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.monotonic()
    # Each Spark mode has result files of its own.
    stem = RESULTS / f"{datetime.now(timezone.utc):%Y-%m-%d}-crash"
    section = "bench/crash.py"
    if args.spark_connect:
        stem, section = stem.with_name(stem.name + "-spark-connect"), section + " --spark-connect"
    earlier: dict[str, Any] = {"trials": [], "sessions": [], "bench_seconds": 0.0}
    if args.resume:
        earlier = json.loads(stem.with_suffix(".json").read_text())
    trials: list[dict[str, Any]] = earlier["trials"]
    sessions: list[dict[str, Any]] = earlier["sessions"]
    # A session stopped before its last audit has trials but no entry in ``sessions``.
    begun = max([len(sessions)] + [t["session"] for t in trials])
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()

    points = kill_points(args.spark_connect)

    def write() -> None:
        figures = {
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": earlier.get("machine") or machine(),
            "settings": earlier.get("settings", vars(args)),
            "resumed": earlier.get("resumed", []) + ([vars(args)] if args.resume else []),
            "kill_points": points,
            "trials": trials,
            "sessions": sessions,
            "summary": summarize(trials, points),
            "recovery": recovery(trials),
            "bench_seconds": round(earlier["bench_seconds"] + time.monotonic() - started, 1),
        }
        RESULTS.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n")
        stem.with_suffix(".md").write_text(markdown(figures))

    while len(trials) < args.trials:
        count = min(args.per_session, args.trials - len(trials))
        session = run_session(begun, count, args, rng, trials, write, commit)
        begun += 1
        sessions.append(session)
        write()
        print(f"session {session['session']}: {session}", flush=True)
    page.write()
    print(f"wrote {stem}.json, {stem}.md and BENCHMARKS.md in {time.monotonic() - started:.0f} s")


def _next_kill_point(
    trials: list[dict[str, Any]], rng: random.Random, points: dict[str, str]
) -> str:
    """A random kill point among those least tried so far: every one gets its turn
    (16 plain random draws once left one of six untried)."""
    tried = [trial["kill_point"] for trial in trials]
    fewest = min(tried.count(point) for point in points)
    return rng.choice([point for point in points if tried.count(point) == fewest])


def run_session(
    number: int,
    count: int,
    args: argparse.Namespace,
    rng: random.Random,
    trials: list[dict[str, Any]],
    write: Callable[[], None],
    commit: str,
) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="crash-"))
    with contextlib.ExitStack() as stack:
        server = None
        if args.spark_connect:
            server = stack.enter_context(connect_server(folder / "connect"))
        example = ExampleUnderTest(
            folder, args.records, args.live_rate, seed=args.seed + number, spark_server=server
        )

        def stop_restarted_server() -> None:  # a spark_server trial starts another
            if example.spark_server is not server and example.spark_server is not None:
                stop(example.spark_server)

        stack.callback(stop_restarted_server)
        return _trials_of_session(example, number, count, rng, trials, write, commit, folder)


def _trials_of_session(
    example: ExampleUnderTest,
    number: int,
    count: int,
    rng: random.Random,
    trials: list[dict[str, Any]],
    write: Callable[[], None],
    commit: str,
    folder: Path,
) -> dict[str, Any]:
    session: dict[str, Any] = {"session": number + 1}
    try:
        example.start()
        for _ in range(count):
            points = kill_points(example.spark_server is not None)
            kill_point = _next_kill_point(trials, rng, points)
            try:
                outcome = dataclasses.asdict(run_trial(example, kill_point, rng))
            except TimeoutError as error:  # the moment never came, or no recovery
                outcome = {"kill_point": kill_point, "recovered": False, "note": str(error)}
            outcome |= {"trial": len(trials) + 1, "session": number + 1, "commit": commit}
            trials.append(outcome)
            write()
            print(json.dumps(outcome), flush=True)
        example.stop_producer()
        session["caught_up"] = example.wait_in_realtime(
            PIPELINES, 0, timeout=300
        ) and example.wait_caught_up(300)
        session["final_audit"] = audit(example.sink_path, example.topic_path)
    finally:
        example.stop()
        shutil.rmtree(folder, ignore_errors=True)
    return session


def summarize(trials: list[dict[str, Any]], points: dict[str, str]) -> dict[str, dict[str, Any]]:
    summary = {}
    for kill_point in points:
        mine = [t for t in trials if t["kill_point"] == kill_point]
        recovery = [t["recovery_s"] for t in mine if t.get("recovery_s") is not None]
        summary[kill_point] = {
            "trials": len(mine),
            "hit": sum(bool(t.get("hit")) for t in mine),
            "recovered": sum(bool(t["recovered"]) for t in mine),
            "lost": sum(t.get("lost", 0) for t in mine),
            "duplicated": sum(t.get("duplicated", 0) for t in mine),
            "mismatched": sum(t.get("mismatched", 0) for t in mine),
            "recovery_s_median": statistics.median(recovery) if recovery else None,
            "recovery_s_max": max(recovery) if recovery else None,
        }
    return summary


def recovery(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Seconds from the kill until the pipelines it hit committed in realtime again, over
    every trial that recovered, whatever its kill point."""
    seconds = [t["recovery_s"] for t in trials if t.get("recovery_s") is not None]
    return {
        "median_s": statistics.median(seconds) if seconds else None,
        "trials": len(seconds),
    }


def reproduce(settings: dict[str, Any]) -> str:
    """The command that runs the crash matrix with ``settings`` again."""
    command = (
        f".venv/bin/python bench/crash.py --trials {settings['trials']} "
        f"--per-session {settings['per_session']} --records {settings['records']} "
        f"--live-rate {settings['live_rate']} --seed {settings['seed']}"
    )
    return command + (" --spark-connect" if settings.get("spark_connect") else "")


def markdown(figures: dict[str, Any]) -> str:
    settings = figures["settings"]
    # A resumed run goes on up to its own --trials.
    planned = [settings, *figures.get("resumed", [])][-1]["trials"]
    lines = [
        f"# Crash matrix, {figures['date'][:10]}",
        "",
        f"{len(figures['trials'])} of {planned} trials, in "
        f"{len(figures['sessions'])} finished session(s) of the "
        f"example project under `dagster dev`; backlog {settings['records']:,} records, live "
        f"producer {settings['live_rate']:,} records/s; seed {settings['seed']}"
        + "".join(f"; resumed with seed {r['seed']}" for r in figures.get("resumed", []))
        + f"; {figures['bench_seconds'] / 60:.0f} minutes in all. Spark: "
        + (
            "one Spark Connect server shared by the runs, outliving them"
            if settings.get("spark_connect")
            else "a local Spark per run"
        )
        + ".",
        "",
        f"Reproduce: `{reproduce(settings)}`. Machine: "
        + (
            machine_line(figures["machine"])
            if "machine" in figures
            else "not recorded (the bench recorded it from 2026-12-06 on)"
        )
        + ".",
        "",
        "| kill point | trials | moment hit | recovered | lost | duplicated | wrong values "
        "| recovery s (median) | recovery s (max) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kill_point, row in figures["summary"].items():
        lines.append(
            f"| {kill_point} | {row['trials']} | {row['hit']} | {row['recovered']} | "
            f"{row['lost']} | {row['duplicated']} | {row['mismatched']} | "
            f"{_seconds(row['recovery_s_median'])} | {_seconds(row['recovery_s_max'])} |"
        )
    commits = sorted({t.get("commit", "") for t in figures["trials"]})
    if len(commits) > 1:  # a resumed run: the code under test may have changed between
        lines += [
            "",
            "| commit | trials | lost | duplicated | recovery s (median) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for commit in commits:
            mine = [t for t in figures["trials"] if t.get("commit", "") == commit]
            recovery = [t["recovery_s"] for t in mine if t.get("recovery_s") is not None]
            lines.append(
                f"| {commit} | {len(mine)} | {sum(t.get('lost', 0) for t in mine)} | "
                f"{sum(t.get('duplicated', 0) for t in mine)} | "
                f"{_seconds(statistics.median(recovery) if recovery else None)} |"
            )
    lines += [
        "",
        "Recovery time: from the kill until every pipeline the kill touched committed in "
        "realtime again (Dagster reports a killed run whose code server lives; a run "
        "whose code server died too is noticed by its heartbeat, silent for 15 s here).",
        "",
        "## Trials",
        "",
        "| # | commit | kill point | pipeline | phase | hit | killed | recovered | lost "
        "| duplicated | recovery s | note |",
        "| ---: | --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for t in figures["trials"]:
        killed = ", ".join(sorted(set(t.get("killed", []))))
        lines.append(
            f"| {t['trial']} | {t.get('commit', '')} | {t['kill_point']} | "
            f"{t.get('pipeline', '')} | "
            f"{t.get('phase', '')} | {t.get('hit', '')} | {killed} | {t['recovered']} | "
            f"{t.get('lost', '')} | {t.get('duplicated', '')} | "
            f"{_seconds(t.get('recovery_s'))} | {t.get('note', '')} |"
        )
    lines += ["", "## Sessions' last audit (producer stopped, caught up with the log's end)", ""]
    for session in figures["sessions"]:
        lines.append(
            f"- session {session['session']}: caught up {session.get('caught_up')}, "
            f"{json.dumps(session.get('final_audit'))}"
        )
    return "\n".join(lines) + "\n"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def benchmarks_section(figures: dict[str, Any], stem: str) -> str:
    """The run's summary for ``BENCHMARKS.md``: its table by kill point, without the trials."""
    summary = markdown(figures).split("\n## Trials", 1)[0].rstrip()
    summary = summary.replace(
        f"# Crash matrix, {figures['date'][:10]}",
        f"## Crash matrix and recovery (`bench/crash.py`), {figures['date'][:10]}",
        1,
    )
    recovery = figures["recovery"]
    return (
        f"{summary}\n\n`recovery.median_s`: {_seconds(recovery['median_s'])} over the "
        f"{recovery['trials']} trials that recovered. Every trial: `bench/results/{stem}.md`.\n"
    )


if __name__ == "__main__":
    main()
