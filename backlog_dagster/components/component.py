"""The ``BacklogPipeline`` Dagster component: one YAML file, one pipeline's definitions.

    # defs.yaml
    type: backlog_dagster.BacklogPipeline
    attributes:
      name: customer_totals
      source: {path: ..., event_time: event_time}
      transform: {keys: [customer_id], aggregations: [{name: total, function: sum, column: amount}]}
      sink: {path: ..., table: customer_totals}
      translation:                      # optional: how its two assets show in Dagster
        group_name: payments
        owners: [team:data]
        tags: {tier: "{{ phase }}"}

A ``Component, Resolvable`` as Dagster's own integrations are: its attributes are the
pipeline's settings (``PipelineConfig``, whose errors name the file, line and field) plus
a ``translation`` of each phase's asset spec, with ``{{ pipeline }}`` and ``{{ phase }}``
to template with. A subclass can override ``get_asset_spec`` and the phase steps
(``execute_backlog``, ``execute_realtime``). Loading it reads local files only: whatever
needs a broker or a database is checked when a run starts.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import dagster as dg
from dagster.components.resolved.core_models import AssetAttributesModel
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel, Field
from typing_extensions import Self

from backlog_dagster.components.assets import (
    BacklogRunConfig,
    RealtimeRunConfig,
    backlog_step,
    phase_specs,
    pipeline_definitions,
    realtime_step,
    refuse_misfit,
)
from backlog_dagster.components.scaffold import BacklogPipelineScaffolder
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.pipeline.paths import data_root, with_paths_under

Phase = Literal["backlog", "realtime"]


@dataclass(frozen=True)
class PhaseAsset:
    """What a ``translation`` is applied to: one phase's asset of one pipeline."""

    pipeline: str
    phase: Phase


_TRANSLATION = TranslationFnResolver[PhaseAsset](
    lambda asset: {"pipeline": asset.pipeline, "phase": asset.phase}
)


class BacklogPipelineAttributes(PipelineConfig):
    """A ``BacklogPipeline``'s attributes: the pipeline, and how its assets show."""

    # Dagster makes AssetAttributesModel at import time, so type checkers see a variable.
    translation: str | AssetAttributesModel | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Changes to each phase's asset spec (key, group_name, owners, tags, "
        "kinds, automation_condition, metadata, description), with {{ pipeline }} and "
        "{{ phase }} (backlog or realtime) to template with; applied to both assets. "
        "Default: keys <name>_backlog and <name>_realtime in group <name>.",
    )


@dg.scaffold_with(BacklogPipelineScaffolder)
class BacklogPipeline(dg.Component, dg.Resolvable):
    """A PySpark pipeline over a bucketed log that catches up in batch, then streams.

    Relative paths in its attributes resolve under the data root (``data_root``).
    """

    def __init__(
        self,
        config: PipelineConfig,
        translation: TranslationFn[PhaseAsset] | None = None,
        defs_file: Path | None = None,
    ) -> None:
        self.config = config
        self.translation = translation
        #: The YAML file the pipeline was declared in: errors at run time name it.
        self.defs_file = defs_file

    @classmethod
    def model(cls) -> type[BaseModel]:
        return BacklogPipelineAttributes

    @classmethod
    def resolve_from_model(cls, context: dg.ResolutionContext, model: BaseModel) -> Self:
        assert isinstance(model, BacklogPipelineAttributes)
        translation = None
        if model.translation is not None:
            translation = _TRANSLATION.execute(context, model, "translation")
        config = PipelineConfig(
            **{name: getattr(model, name) for name in PipelineConfig.model_fields}
        )
        return cls(config, translation)

    @classmethod
    def load(cls, attributes: BaseModel | None, context: dg.ComponentLoadContext) -> Self:
        """Resolved as Dagster resolves any component, then placed: relative paths under
        the project's data root, checked against the source's columns (file, line and
        field), and the YAML file kept for run-time errors."""
        if not isinstance(attributes, BacklogPipelineAttributes):
            raise ValueError(f"{context.path}: a BacklogPipeline needs attributes")
        resolved = super().load(attributes, context)
        folder = Path(context.path)
        config = with_paths_under(resolved.config, data_root(Path(context.project_root)))
        refuse_misfit(config, context)
        return cls(
            config, resolved.translation, folder / "defs.yaml" if folder.is_dir() else folder
        )

    def get_asset_spec(self, phase: Phase) -> dg.AssetSpec:
        """The asset of ``phase``: the pipeline's own (``phase_specs``), through the
        ``translation``; the realtime asset depends on the backlog's, whatever its key."""
        spec = phase_specs(self.config)[phase]
        if phase == "realtime":
            spec = spec.replace_attributes(deps=[self.get_asset_spec("backlog").key])
        if self.translation is None:
            return spec
        return self.translation(spec, PhaseAsset(self.config.name, phase))

    def execute_backlog(
        self, context: dg.AssetExecutionContext, config: BacklogRunConfig
    ) -> dg.MaterializeResult:
        """The backlog step of a run; override to do something around it."""
        return backlog_step(self.config, self.defs_file, context, config)

    def execute_realtime(
        self, context: dg.AssetExecutionContext, config: RealtimeRunConfig
    ) -> Iterator[dg.MaterializeResult]:
        """The realtime step of a run (it runs until cancelled); override to do
        something around it."""
        yield from realtime_step(self.config, self.defs_file, context, config)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return self.definitions()

    def definitions(self) -> dg.Definitions:
        """The pipeline's assets, check, jobs and switch sensor (no load context needed)."""
        specs: dict[str, Any] = {
            phase: self.get_asset_spec(phase) for phase in ("backlog", "realtime")
        }
        return pipeline_definitions(
            self.config,
            self.defs_file,
            specs,
            (self.execute_backlog, self.execute_realtime),
        )
