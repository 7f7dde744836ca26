"""The component as Dagster's own integrations are: attributes resolved from YAML, asset
specs changed by a ``translation``, and hooks a subclass overrides."""

from __future__ import annotations

import textwrap
from pathlib import Path

import dagster as dg
import pytest

from backlog_dagster.components.component import BacklogPipeline
from tests.test_pipeline_config import dagster_validate, make_project

PIPELINE = """\
name: orders_total
source: {path: orders, event_time: event_time}
transform:
  keys: [customer_id]
  aggregations:
    - {name: total, function: sum, column: amount}
sink: {path: results.sqlite, table: orders_total}
"""

TRANSLATED = (
    PIPELINE
    + """\
translation:
  key: "streams/{{ pipeline }}/{{ phase }}"
  group_name: payments
  owners: [team:data]
  tags: {phase: "{{ phase }}"}
  kinds: [kafka]
  automation_condition: "{{ automation_condition.on_cron('0 * * * *') }}"
"""
)


def definitions_of(yaml: str) -> dg.Definitions:
    return BacklogPipeline.resolve_from_yaml(yaml).definitions()


def spec_of(defs: dg.Definitions, key: str) -> dg.AssetSpec:
    return next(
        s for s in defs.resolve_all_asset_specs() if s.key == dg.AssetKey.from_user_string(key)
    )


def test_without_a_translation_the_assets_are_the_pipelines_own() -> None:
    defs = definitions_of(PIPELINE)
    backlog, realtime = (
        spec_of(defs, "orders_total_backlog"),
        spec_of(defs, "orders_total_realtime"),
    )
    assert backlog.group_name == realtime.group_name == "orders_total"
    assert backlog.kinds == {"spark", "sqlite"}
    assert [dep.asset_key for dep in realtime.deps] == [backlog.key]


def test_a_translation_sets_key_group_owners_tags_kinds_and_automation_per_phase() -> None:
    defs = definitions_of(TRANSLATED)
    backlog = spec_of(defs, "streams/orders_total/backlog")
    realtime = spec_of(defs, "streams/orders_total/realtime")
    for spec, phase in ((backlog, "backlog"), (realtime, "realtime")):
        assert spec.group_name == "payments"
        assert spec.owners == ["team:data"]
        assert spec.tags["phase"] == phase
        assert spec.kinds == {"kafka"}  # a translation replaces kinds, as Dagster's do
        assert spec.automation_condition is not None
    # The realtime asset follows the backlog's key, whatever the translation made it.
    assert [dep.asset_key for dep in realtime.deps] == [backlog.key]
    # The jobs, the check and the op names (which run configs name) follow too.
    job = defs.resolve_job_def("orders_total_backlog_then_realtime_job")
    assert set(job.asset_layer.executable_asset_keys) >= {backlog.key}
    check_keys = {(key.asset_key, key.name) for key in defs.resolve_asset_graph().asset_check_keys}
    assert check_keys == {(backlog.key, "catches_up"), (realtime.key, "keeps_up")}
    # What realtime keeps fresh, in Dagster's own terms (the catalog's health).
    assert realtime.freshness_policy is not None and backlog.freshness_policy is None
    ops = {node.name for node in job.graph.node_defs}
    assert "orders_total_backlog" in ops


def test_a_subclass_overrides_a_phases_step_and_its_spec() -> None:
    class Audited(BacklogPipeline):
        def get_asset_spec(self, phase):  # type: ignore[no-untyped-def]
            return super().get_asset_spec(phase).merge_attributes(tags={"audited": "yes"})

        def execute_backlog(self, context, config):  # type: ignore[no-untyped-def]
            return dg.MaterializeResult(metadata={"audited_by": "subclass"})

    defs = Audited.resolve_from_yaml(PIPELINE).definitions()
    assert spec_of(defs, "orders_total_backlog").tags["audited"] == "yes"
    backlog = next(
        a
        for a in defs.assets or []
        if isinstance(a, dg.AssetsDefinition) and a.key.path[-1].endswith("_backlog")
    )
    result = dg.materialize([backlog])
    materialized = result.asset_materializations_for_node("orders_total_backlog")
    assert materialized[0].metadata["audited_by"] == dg.MetadataValue.text("subclass")


def test_a_translation_with_an_unknown_field_is_refused_naming_file_line_and_field(
    tmp_path: Path,
) -> None:
    body = textwrap.indent(PIPELINE + "translation: {group_name: g, colour: red}\n", "  ")
    defs = make_project(tmp_path, "type: backlog_dagster.BacklogPipeline\nattributes:\n" + body)
    result = dagster_validate(tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert f"colour at {defs}:10" in output, output[-3000:]
    assert "Extra inputs are not permitted" in output


@pytest.mark.parametrize("yaml", [TRANSLATED])
def test_dagster_loads_a_translated_pipeline_from_its_yaml(tmp_path: Path, yaml: str) -> None:
    body = textwrap.indent(yaml, "  ")
    make_project(tmp_path, "type: backlog_dagster.BacklogPipeline\nattributes:\n" + body)
    result = dagster_validate(tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
