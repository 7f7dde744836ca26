"""``backlog-dagster log …`` through click, against real topics on disk."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from backlog_dagster.cli import main
from backlog_dagster.log import Topic


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_produce_describe_tail_add_and_truncate(tmp_path: Path) -> None:
    topic = str(tmp_path / "orders")
    run(
        "log",
        "produce",
        topic,
        "--records",
        "30000",
        "--buckets",
        "3",
        "--days",
        "1",
        "--live-rate",
        "2000",
        "--live-seconds",
        "1.5",
    )
    with Topic(topic) as log:
        held = sum(b.records for b in log.bounds().values())
    assert 30_000 + 1000 <= held <= 30_000 + 4000  # about 1.5 s at 2,000 records/s
    described = run("log", "describe", topic)
    assert "all" in described and f"{held:,}" in described
    tailed = run("log", "tail", topic, "--bucket", "1", "-n", "3").strip().splitlines()
    assert len(tailed) == 3 and "'order_id'" in tailed[0]
    assert "added buckets 3..4" in run("log", "add-buckets", topic, "2")
    run("log", "truncate", topic, "--before-time", "2999-01-01T00:00:00+00:00")
    with Topic(topic) as log:
        assert log.buckets() == [0, 1, 2, 3, 4]
        assert all(b.records == 0 for b in log.bounds().values())


def test_cli_errors_are_one_clear_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["log", "describe", str(tmp_path / "none")])
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == f"Error: no topic at {tmp_path / 'none'} (expected topic.sqlite there)"
    )
    result = CliRunner().invoke(
        main,
        [
            "log",
            "create",
            str(tmp_path / "t"),
            "--schema",
            "id BIGINT, tags MAP<STRING, INT>",
            "--timestamp-column",
            "id",
        ],
    )
    assert result.exit_code == 1
    assert "column 'tags': type 'MAP' is not supported" in result.output
