"""The example project loads in Dagster, and its assets materialize on a real instance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from tests.pipelines import assert_example_customer_totals

ROOT = Path(__file__).resolve().parent.parent
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def test_workspace_validates_with_the_dagster_cli() -> None:
    result = subprocess.run(
        [DAGSTER, "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Validation successful" in result.stdout + result.stderr


def test_example_assets_materialize_through_the_dagster_cli(tmp_path: Path) -> None:
    """`dagster asset materialize` on a persistent instance, as a user runs it."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "BACKLOG_DAGSTER_DATA": str(tmp_path)}
    config = {"ops": {"orders_log": {"config": {"records": 60_000, "buckets": 4}}}}
    result = subprocess.run(
        [
            DAGSTER,
            "asset",
            "materialize",
            "-m",
            "definitions.definitions",
            "--select",
            "orders_log,orders_per_bucket,customer_totals_backlog,region_minutes_backlog",
            "--config-json",
            json.dumps(config),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]

    with dg.DagsterInstance.from_config(str(home)) as instance:

        def metadata(key: str) -> dict:  # type: ignore[type-arg]
            event = instance.get_latest_materialization_event(dg.AssetKey(key))
            assert event is not None and event.asset_materialization is not None
            return {k: v.value for k, v in event.asset_materialization.metadata.items()}

        assert metadata("orders_per_bucket")["records"] == 60_000
        backlog = metadata("customer_totals_backlog")
        assert backlog["rows_read"] == 60_000 and backlog["generation"] == 1
        assert backlog["records_per_s"] > 0
        table = backlog["buckets"]
        assert [r.data["reached"] for r in table.records] == [
            r.data["marker"] for r in table.records
        ]
        assert metadata("region_minutes_backlog")["rows_read"] == 60_000

    assert_example_customer_totals(tmp_path, tmp_path / "example" / "orders")
