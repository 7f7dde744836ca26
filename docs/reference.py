"""The reference pages, generated from the code as the site is built (a MkDocs hook), so
that they cannot drift from it: every YAML setting of a pipeline from the pydantic
models' fields, every CLI command from click, every sink table and its columns from a
sink opened in a scratch folder.

``tests/test_docs.py`` imports it to check that every setting has a description.
"""

from __future__ import annotations

import json
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import yaml

DOCS = Path(__file__).resolve().parent
#: The pages written here, by their path in the site.
PAGES = ("reference/settings.md", "reference/cli.md", "reference/sink-columns.md")


@dataclass(frozen=True)
class Setting:
    """One YAML setting: its dotted path, type, default, description and an example."""

    path: str
    type: str
    default: str
    description: str
    example: str


def settings() -> list[Setting]:
    """Every setting of a pipeline's ``attributes``, depth first, as YAML names them."""
    from backlog_dagster.components.component import BacklogPipelineAttributes
    from backlog_dagster.pipeline.config import PipelineConfig

    schema = PipelineConfig.model_json_schema(by_alias=True)
    examples = _example_values()
    # The component's own attribute, beside the pipeline's: its inner fields are
    # Dagster's asset attributes, documented by Dagster.
    translation = BacklogPipelineAttributes.model_fields["translation"]
    own = Setting(
        "translation",
        "mapping (Dagster's asset attributes) or template",
        "none",
        translation.description or "",
        _yaml({"group_name": "payments", "owners": ["team:data"]}),
    )
    return [*_walk(schema, schema["$defs"], "", examples), own]


def _walk(
    node: dict[str, Any],
    defs: dict[str, Any],
    prefix: str,
    examples: dict[str, Any],
    suffix: str = "",
) -> Iterator[Setting]:
    """The settings of the model ``node``, its nested models' after each one's own row;
    ``suffix`` says which ``kind`` of a mapping they belong to."""
    required = set(node.get("required", []))
    for name, field in node.get("properties", {}).items():
        path = f"{prefix}{name}"
        default = "required" if name in required else _default(field)
        description = field.get("description", "")
        models = _models_of(field, defs)
        if models:
            kind = "list of mappings" if field.get("type") == "array" else "mapping"
            yield Setting(path + suffix, kind, default, description, "")
            inner = f"{path}[]." if field.get("type") == "array" else f"{path}."
            for label, model in models:
                yield from _walk(model, defs, inner, examples, label or suffix)
            continue
        example = examples.get(path, "")
        shown = "" if example == "" else _yaml(example)
        yield Setting(path + suffix, _type_of(field, defs), default, description, shown)


def _models_of(field: dict[str, Any], defs: dict[str, Any]) -> list[tuple[str | None, Any]]:
    """The nested models a field holds (one, one per ``kind``, or a list's items), if it
    holds models."""
    holder = field.get("items", field) if field.get("type") == "array" else field
    refs = [holder] if "$ref" in holder else holder.get("oneOf", []) + holder.get("anyOf", [])
    targets = [defs.get(r["$ref"].rsplit("/", 1)[-1], {}) for r in refs if "$ref" in r]
    models = [t for t in targets if t.get("properties") and t.get("title") != "FromEnv"]
    if len(models) < 2:
        return [(None, model) for model in models]
    kinds = [m["properties"].get("kind", {}) for m in models]
    return [
        (f" (kind: {k.get('const') or k.get('enum', ['?'])[0]})", m)
        for k, m in zip(kinds, models, strict=True)
    ]


def _type_of(field: dict[str, Any], defs: dict[str, Any]) -> str:
    if "enum" in field:
        return " | ".join(str(v) for v in field["enum"])
    if "const" in field:
        return str(field["const"])
    if "anyOf" in field:
        return " or ".join(dict.fromkeys(_type_of(option, defs) for option in field["anyOf"]))
    if "$ref" in field:
        name = field["$ref"].rsplit("/", 1)[-1]
        return "{env: NAME}" if name == "FromEnv" else name
    kind = field.get("type", "any")
    if kind == "array":
        return f"list of {_type_of(field.get('items', {}), defs)}"
    if kind == "object":
        return "mapping"
    return {"null": "null", "number": "number", "integer": "integer"}.get(kind, kind)


def _default(field: dict[str, Any]) -> str:
    """The default as YAML; none shown for a mapping of defaults (its settings show them)
    or for one a validator fills in (the description says it)."""
    if "default" not in field:
        return ""
    default = field["default"]
    return "" if isinstance(default, dict) and default else _yaml(default)


def _yaml(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def _example_values() -> dict[str, Any]:
    """Each setting's value in the complete example of ``pipeline.md`` (its first YAML
    block), by dotted path: the reference's examples are those the guide explains."""
    text = (DOCS / "pipeline.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None, "pipeline.md has no YAML example"
    values: dict[str, Any] = {}

    def flatten(node: object, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                flatten(value, f"{prefix}{key}.")
        if prefix:
            values.setdefault(prefix[:-1], node)

    flatten(yaml.safe_load(block.group(1))["attributes"], "")
    return values


def settings_page() -> str:
    rows = [
        "# Settings",
        "",
        "Every setting of a pipeline's `attributes:` in its `defs.yaml`, generated from the",
        "models Dagster validates the file with (`backlog_dagster.pipeline.config`): a",
        "mistake is refused when Dagster loads the file, naming the file, line and field.",
        "Durations take `500ms`, `30s`, `5m`, `1h`, `2d` or seconds. The examples are the",
        "values of the complete example in [Declaring a pipeline](../pipeline.md).",
        "",
        "| setting | type | default | what it does | example |",
        "| --- | --- | --- | --- | --- |",
    ]
    for s in settings():
        cells = [f"`{s.path}`", s.type, f"`{s.default}`" if s.default else "", s.description]
        cells.append(f"`{s.example}`" if s.example else "")
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def cli_page() -> str:
    from backlog_dagster.cli import main

    lines = [
        "# Command line",
        "",
        "`backlog-dagster`, generated from its click commands (`--help` prints the same).",
        "",
    ]
    for path, command in _commands(main, "backlog-dagster"):
        if isinstance(command, click.Group):
            continue
        with click.Context(command, info_name=path) as context:
            usage = command.get_usage(context)
        lines += [f"## `{path}`", "", (command.help or "").strip(), "", f"    {usage}", ""]
        for param in command.params:
            if isinstance(param, click.Option):
                names = ", ".join(f"`{n}`" for n in param.opts)
                default = (
                    "" if param.default in (None, (), False) else f" (default: `{param.default}`)"
                )
                lines.append(f"- {names}: {param.help or ''}{default}")
            elif isinstance(param, click.Argument):
                lines.append(f"- `{param.human_readable_name}` (argument)")
        lines.append("")
    return "\n".join(lines)


def _commands(group: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    yield path, group
    if isinstance(group, click.Group):
        for name, command in sorted(group.commands.items()):
            yield from _commands(command, f"{path} {name}")


def sink_tables() -> dict[str, list[tuple[str, str]]]:
    """Every table (and view) a SQLite sink makes for a windowed pipeline with every kind
    of aggregation, and its columns with their types."""
    from backlog_dagster.pipeline.config import PipelineConfig
    from backlog_dagster.sink import open_sink

    with tempfile.TemporaryDirectory() as folder:
        config = PipelineConfig.model_validate(
            {
                "name": "orders_per_minute",
                "source": {"path": str(Path(folder) / "orders"), "event_time": "event_time"},
                "transform": {
                    "keys": ["region"],
                    "window": {"size": "1m"},
                    "aggregations": [
                        {"name": "orders", "function": "count"},
                        {"name": "mean_amount", "function": "avg", "column": "amount"},
                        {"name": "customers", "function": "count_distinct", "column": "id"},
                        {
                            "name": "amount",
                            "function": "quantiles",
                            "column": "amount",
                            "quantiles": [0.5, 0.99],
                        },
                    ],
                },
                "sink": {"path": str(Path(folder) / "results.sqlite"), "table": "results"},
            }
        )
        with open_sink(config):
            pass
        with sqlite3.connect(Path(folder) / "results.sqlite") as db:
            names = [row[0] for row in db.execute("SELECT name FROM sqlite_master ORDER BY name")]
            return {
                name: [(c[1], c[2]) for c in db.execute(f'PRAGMA table_info("{name}")')]
                for name in names
                if not name.startswith("sqlite_")
            }


def sink_columns_page() -> str:
    lines = [
        "# Sink tables and columns",
        "",
        "Generated from a SQLite sink opened for a windowed pipeline named",
        "`orders_per_minute` with results table `results` and one aggregation of each kind",
        "(a PostgreSQL sink holds the same tables in its schema). What each table and",
        "column means: [What a sink holds](sink-tables.md).",
        "",
    ]
    for table, columns in sink_tables().items():
        lines += [f"## `{table}`", "", "| column | type |", "| --- | --- |"]
        lines += [f"| `{name}` | {kind or 'any'} |" for name, kind in columns]
        lines.append("")
    return "\n".join(lines)


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the generated pages to the site."""
    from mkdocs.structure.files import File

    for path, page in zip(PAGES, (settings_page, cli_page, sink_columns_page), strict=True):
        files.append(File.generated(config, path, content=page()))
    return files
