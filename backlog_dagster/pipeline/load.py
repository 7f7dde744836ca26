"""Read a pipeline's ``defs.yaml`` outside Dagster (the CLI), with Dagster-like errors."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from backlog_dagster.pipeline.config import PipelineConfig


class PipelineFileError(ValueError):
    """A defs.yaml that is not a valid pipeline; the message names file and fields."""


def load_pipeline(path: Path) -> PipelineConfig:
    """The pipeline declared in ``path``, relative data paths not yet resolved."""
    try:
        document = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise PipelineFileError(f"{path}: cannot read it as YAML: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("attributes"), dict):
        raise PipelineFileError(f"{path}: expected a mapping with 'type' and 'attributes'")
    try:
        return PipelineConfig.model_validate(document["attributes"])
    except ValidationError as error:
        raise PipelineFileError(describe_errors(path, error)) from error


def describe_errors(path: Path, error: ValidationError) -> str:
    lines = [f"{path}: {error.error_count()} mistake(s) in the pipeline's attributes:"]
    for item in error.errors():
        field = ".".join(str(part) for part in ("attributes", *item["loc"]))
        lines.append(f"  {field}: {item['msg']}")
    return "\n".join(lines)


def project_root_of(path: Path) -> Path:
    """The nearest folder above ``path`` with a pyproject.toml, else the current one."""
    for folder in path.resolve().parents:
        if (folder / "pyproject.toml").exists():
            return folder
    return Path.cwd()
