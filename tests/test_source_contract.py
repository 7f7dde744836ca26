"""The source contract: the phases, the sensor and the checks depend on ``Source`` alone."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "backlog_dagster"

#: Where the embedded log may be named: itself, the one place that opens the source a
#: pipeline names (``implementations``), and the tools made for it (its CLI, the demo that
#: loads it, the scaffolder that reads a topic, the mirror that copies a topic to Kafka).
#: The reference workload (``tools.workload``, which writes through an ``Appender``: a
#: topic of the log or a Kafka producer) is neutral.
NEUTRAL = ("backlog_dagster.tools.workload",)
KNOWS_THE_LOG = (
    "log",
    "implementations.py",
    "cli",
    "tools",
    "components/scaffold.py",
)


def test_nothing_but_the_source_package_opens_the_log_for_a_pipeline() -> None:
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if any(where == k or where.startswith(f"{k}/") for k in KNOWS_THE_LOG):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            module = (node.module or "") if isinstance(node, ast.ImportFrom) else ""
            if module.startswith("backlog_dagster.log") and module not in NEUTRAL:
                offenders.append(f"{where}: from {module} import …")
            if isinstance(node, ast.Name) and node.id in ("Topic", "TopicError"):
                offenders.append(f"{where}: names {node.id}")
    assert offenders == []


def test_opening_a_source_imports_no_pyspark(tmp_path: Path) -> None:
    """The sensor opens sources every tick, in Dagster's processes: no Spark there."""
    import subprocess
    import sys

    from backlog_dagster.log import create_topic
    from backlog_dagster.tools.workload import ORDERS_SCHEMA

    create_topic(
        tmp_path / "orders", ORDERS_SCHEMA, timestamp_column="event_time", buckets=2
    ).close()
    script = f"""
import sys
from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.implementations import open_source
for archive in (None, {{"path": {str(tmp_path / "archive")!r}}}):
    config = PipelineConfig.model_validate({{
        "name": "p",
        "source": {{"path": {str(tmp_path / "orders")!r}, "event_time": "event_time",
                   "archive": archive}},
        "transform": {{"keys": ["region"], "aggregations": [{{"name": "n", "function": "count"}}]}},
        "sink": {{"path": {str(tmp_path / "r.sqlite")!r}, "table": "p"}},
    }})
    with open_source(config) as source:
        source.bounds()
print("pyspark" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def test_what_sparks_python_workers_import_imports_no_dagster() -> None:
    """Spark's Python workers (a source's reader, a realtime query's commit) import these
    at their start: Dagster's import is most of a second and tens of MiB of each."""
    import subprocess
    import sys

    modules = [
        "backlog_dagster.phases.micro_batch",
        "backlog_dagster.implementations",
        "backlog_dagster.log.spark",
        "backlog_dagster.kafka.spark",
        "backlog_dagster.archive.spark",
        "backlog_dagster.sink",
    ]
    script = (
        f"import sys\nfor m in {modules!r}:\n    __import__(m)\nprint('dagster' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
