"""The example project loads in Dagster and its assets materialize on a real instance."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import dagster as dg
import pytest
from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent


def load_definitions(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.setenv("BACKLOG_DAGSTER_DATA", str(data_dir))
    spec = importlib.util.spec_from_file_location(
        "example_definitions", ROOT / "definitions" / "definitions.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_workspace_validates_with_the_dagster_cli() -> None:
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("dagster")),
            "definitions",
            "validate",
            "-w",
            "workspace.yaml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DAGSTER_HOME": ""},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Validation successful" in result.stdout + result.stderr


def test_example_assets_materialize_on_a_real_instance(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = load_definitions(tmp_path / "data", monkeypatch)
    (tmp_path / "dagster").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "dagster")) as instance:
        result = dg.materialize(
            [module.orders_log, module.orders_per_bucket],
            instance=instance,
            resources={"pyspark": module.spark_resource("local[2]")},
            run_config={"ops": {"orders_log": {"config": {"records": 50_000, "buckets": 4}}}},
        )
        assert result.success
        counted = instance.get_latest_materialization_event(dg.AssetKey("orders_per_bucket"))
        assert counted is not None and counted.asset_materialization is not None
        assert counted.asset_materialization.metadata["records"].value == 50_000
        loaded = instance.get_latest_materialization_event(dg.AssetKey("orders_log"))
        assert loaded is not None and loaded.asset_materialization is not None
        buckets = loaded.asset_materialization.metadata["buckets"].value
        assert sum(r.data["latest"] for r in buckets.records) == 50_000
