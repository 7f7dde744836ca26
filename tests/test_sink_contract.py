"""The sink contract: the rest of the code depends on ``Sink`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "backlog_dagster"


def test_nothing_outside_the_sink_package_knows_its_implementations() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "sink"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "backlog_dagster.sink."
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}: from {node.module} import …")
            if isinstance(node, ast.Name) and node.id in ("SqliteSink", "PipelineState"):
                offenders.append(f"{path.relative_to(PACKAGE)}: names {node.id}")
    assert offenders == []
