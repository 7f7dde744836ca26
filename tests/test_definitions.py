"""The example project loads in Dagster, and its assets materialize on a real instance."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import yaml

from backlog_dagster.tools import dev_server
from tests.pipelines import assert_example_customer_totals, assert_example_region_daily

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
    # workspace.yaml and [tool.dg.project] name the code location alike: no warnings.
    assert "does not match" not in result.stdout + result.stderr


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
            "orders_log,orders_per_bucket,customer_totals_backlog,region_minutes_backlog,"
            "region_daily_backlog",
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
        assert backlog["records_done"] == 60_000 and backlog["generation"] == 1
        assert re.fullmatch(
            r"[\d,]+ records/s read, since the run began to read", backlog["read_rate"]
        )
        table = backlog["buckets"]
        assert [r.data["reached"] for r in table.records] == [
            r.data["marker"] for r in table.records
        ]
        assert metadata("region_minutes_backlog")["records_done"] == 60_000
        assert metadata("region_daily_backlog")["records_done"] == 60_000

    assert_example_customer_totals(tmp_path, tmp_path / "example" / "orders")
    assert_example_region_daily(tmp_path, tmp_path / "example" / "orders")


def test_dg_scaffold_defs_writes_a_pipeline_that_runs(tmp_path: Path) -> None:
    """A new project: `dg scaffold defs backlog_dagster.BacklogPipeline <name>` over the
    user's own topic, `dg check yaml` and `dg check defs` pass, the backlog materializes."""
    from tests.test_pipeline_config import make_project

    defs = make_project(tmp_path / "project", "")
    shutil.rmtree(defs.parent)  # a project with no component yet
    project = tmp_path / "project"
    data = project / ".data"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "DAGSTER_HOME": "", "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    cli = str(bin_dir / "backlog-dagster")
    subprocess.run(
        [
            cli,
            "log",
            "create",
            str(data / "events"),
            "--schema",
            "id BIGINT, user STRING, amount DOUBLE, ts TIMESTAMP",
            "--timestamp-column",
            "ts",
            "--buckets",
            "2",
        ],
        check=True,
        env=env,
    )
    (tmp_path / "events.csv").write_text(
        "id,user,amount,ts\n"
        + "".join(f"{i},u{i % 3},{i}.5,2026-11-20T10:00:{i:02d}Z\n" for i in range(30))
    )
    subprocess.run(
        [cli, "log", "append", str(data / "events"), str(tmp_path / "events.csv"), "--key", "user"],
        check=True,
        env=env,
    )

    def dg_(*args: str) -> str:
        done = subprocess.run(
            [str(bin_dir / "dg"), *args],
            cwd=project,
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    dg_("scaffold", "defs", "backlog_dagster.BacklogPipeline", "per_user", "--topic", "events")
    written = (project / "badproj" / "defs" / "per_user" / "defs.yaml").read_text()
    assert "keys: [user]" in written and "column: amount" in written
    assert "All component YAML validated successfully" in dg_("check", "yaml")
    assert "All definitions loaded successfully" in dg_("check", "defs")
    # The asset specs are overridden in YAML as for any Dagster component.
    defs_yaml = project / "badproj" / "defs" / "per_user" / "defs.yaml"
    defs_yaml.write_text(
        written
        + "post_processing:\n  assets:\n    - target: '*'\n      attributes:\n"
        + "        group_name: sales\n        owners: ['team:data']\n"
        + "        tags: {tier: gold}\n"
    )
    listed = subprocess.run(
        [str(bin_dir / "dg"), "list", "defs", "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    assets = {a["asset_key"]: a for a in json.loads(listed.stdout)["assets"]}
    for key in ("per_user_backlog", "per_user_realtime"):
        assert assets[key]["group_name"] == "sales"
        assert assets[key]["owners"] == [{"team": "data"}]
        assert {"key": "tier", "value": "gold"} in assets[key]["tags"]
    home = tmp_path / "home"
    home.mkdir()
    result = subprocess.run(
        [
            DAGSTER,
            "asset",
            "materialize",
            "-m",
            "badproj.definitions",
            "--select",
            "per_user_backlog",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "DAGSTER_HOME": str(home)},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    import sqlite3

    with sqlite3.connect(data / "results.sqlite") as db:
        rows = db.execute(
            "SELECT user, records, total_amount FROM per_user_view ORDER BY user"
        ).fetchall()
    assert rows == [(f"u{k}", 10, sum(i + 0.5 for i in range(30) if i % 3 == k)) for k in range(3)]


def test_the_projects_instance_settings_go_under_a_homes_own(tmp_path: Path) -> None:
    """The project's ``dagster.yaml`` (a run queue that looks every second and launches on
    threads) is a valid instance config; written into a Dagster home that already keeps
    its storage on PostgreSQL, both hold, and the home's own sections are kept as they were.
    """
    home = tmp_path / "dagster_home"
    home.mkdir()
    dev_server.with_project_instance(ROOT, home)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        queue = instance.run_coordinator
        assert isinstance(queue, dg.QueuedRunCoordinator)
        assert queue.dequeue_interval_seconds == 1 and queue.dequeue_use_threads
    other = tmp_path / "postgres_home"
    other.mkdir()
    shutil.copy(ROOT / dev_server.POSTGRES_INSTANCE, other / "dagster.yaml")
    dev_server.with_project_instance(ROOT, other)
    settings = yaml.safe_load((other / "dagster.yaml").read_text())
    own = yaml.safe_load((ROOT / dev_server.POSTGRES_INSTANCE).read_text())
    assert settings == {
        **own,
        "run_queue": {"dequeue_interval_seconds": 1, "dequeue_use_threads": True},
    }
