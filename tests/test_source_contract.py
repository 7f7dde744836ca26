"""The source contract: the phases, the sensor and the checks depend on ``Source`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "backlog_dagster"

#: Where the embedded log may be named: itself, its Spark reader, the contract's
#: ``open_source``, and the tools made for it (its CLI, the demo that loads it, the
#: scaffolder that reads a topic). Its Spark-DDL helpers (``log.schema``) are neutral.
KNOWS_THE_LOG = ("log", "spark", "source", "cli.py", "demo.py", "components/scaffold.py")


def test_nothing_but_the_source_package_opens_the_log_for_a_pipeline() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if any(where == k or where.startswith(f"{k}/") for k in KNOWS_THE_LOG):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if module.startswith("backlog_dagster.log") and module != "backlog_dagster.log.schema":
                offenders.append(f"{where}: from {module} import …")
            if isinstance(node, ast.Name) and node.id in ("Topic", "TopicError"):
                offenders.append(f"{where}: names {node.id}")
    assert offenders == []
