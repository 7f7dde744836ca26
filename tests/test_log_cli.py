"""``backlog-dagster log …`` through click, against real topics on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def test_append_your_own_records_from_parquet_csv_and_json_lines(tmp_path: Path) -> None:
    import pandas as pd

    topic = str(tmp_path / "events")
    run(
        "log",
        "create",
        topic,
        "--schema",
        "id BIGINT, user STRING, amount DOUBLE, ts TIMESTAMP",
        "--timestamp-column",
        "ts",
        "--buckets",
        "3",
    )
    csv = tmp_path / "a.csv"
    csv.write_text(
        "id,user,amount,ts\n1,a,2.5,2026-11-20T10:00:00Z\n2,b,3,2026-11-20 10:00:01.5\n"
        "3,a,1,2026-11-20T11:00:02+01:00\n"
    )
    out = run("log", "append", topic, str(csv), "--key", "user")
    jsonl = tmp_path / "b.jsonl"
    jsonl.write_text(
        '{"id": 4, "user": "c", "amount": 1.0, "ts": "2026-11-20T10:00:03Z", "x": 1}\n'
    )
    run("log", "append", topic, str(jsonl), "--bucket", "2")
    frame = pd.DataFrame(
        {
            "id": [5],
            "user": ["d"],
            "amount": [4.0],
            "ts": [pd.Timestamp("2026-11-20T10:00:04.000001Z")],  # nanoseconds, whole µs
        }
    )
    frame.to_parquet(tmp_path / "c.parquet")
    run("log", "append", topic, str(tmp_path / "c.parquet"), "--bucket", "0")
    with Topic(topic) as log:
        held = {b: pa_rows(log, b) for b in log.buckets()}
        frame["ts"] = [pd.Timestamp("2026-11-20T10:00:04.000001001Z")]
        with pytest.raises(ValueError, match=r"has 1 timestamp\(s\) with nanoseconds") as error:
            log.append(0, frame)  # the pandas API: refused rather than cut
        assert "df['ts'] = df['ts'].dt.floor('us')" in str(error.value)
    rows = sorted((r["id"], r["user"], r["ts"].isoformat()) for b in held.values() for r in b)
    assert rows == [
        (1, "a", "2026-11-20T10:00:00+00:00"),
        (2, "b", "2026-11-20T10:00:01.500000+00:00"),
        (3, "a", "2026-11-20T10:00:02+00:00"),
        (4, "c", "2026-11-20T10:00:03+00:00"),
        (5, "d", "2026-11-20T10:00:04.000001+00:00"),
    ]
    # The same key, the same bucket.
    bucket_of = {r["id"]: b for b, rs in held.items() for r in rs}
    assert bucket_of[1] == bucket_of[3] and bucket_of[4] == 2
    assert "records at offsets" in out

    refused = CliRunner().invoke(main, ["log", "append", topic, str(csv)])
    assert refused.exit_code == 2 and "give one of --bucket or --key" in refused.output
    bad = tmp_path / "bad.csv"
    bad.write_text("id,user,amount\n1,a,2\n")
    missing = CliRunner().invoke(main, ["log", "append", topic, str(bad), "--bucket", "0"])
    assert missing.exit_code == 1
    assert f"{bad}: lacks the topic's column(s) ts" in missing.output


def pa_rows(log: Topic, bucket: int) -> list[dict]:  # type: ignore[type-arg]
    bounds = log.bucket(bucket).bounds()
    return [row for batch in log.read(bucket, 0, bounds.latest) for row in batch.to_pylist()]
