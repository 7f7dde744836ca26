"""``dg scaffold defs backlog_dagster.BacklogPipeline <name>``: a defs.yaml that loads.

The pipeline is written for the topic it is pointed at (``--topic``, a path under the
data root): its record-time column as the event time, its first text column as the key,
a count and, if it has a numeric column, that column's sum. A topic that does not exist
yet gets the reference ``orders`` shape, with the command that creates it in a comment.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pyarrow as pa
from pydantic import BaseModel, Field

from backlog_dagster.log import Topic, TopicError
from backlog_dagster.pipeline.paths import data_root


class ScaffoldParams(BaseModel):
    topic: str = Field(
        "orders", description="The topic's directory, relative to the data root (.data/)."
    )


class BacklogPipelineScaffolder(dg.Scaffolder[ScaffoldParams]):
    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return ScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[ScaffoldParams]) -> None:
        name = re.sub(r"\W", "_", request.target_path.name)
        root = data_root(request.project_root or Path.cwd())
        topic = request.params.topic
        request.target_path.mkdir(parents=True, exist_ok=True)
        (request.target_path / "defs.yaml").write_text(
            defs_yaml(request.type_name, name, topic, _shape(root / topic))
        )


def _shape(path: Path) -> tuple[str, str, str | None] | None:
    """``(event time, key, numeric column)`` of the topic at ``path``; None if absent."""
    try:
        with Topic(path) as topic:
            schema, event_time = topic.schema, topic.timestamp_column
    except TopicError:
        return None
    text = [f.name for f in schema if pa.types.is_string(f.type)]
    numbers = [
        f.name for f in schema if pa.types.is_floating(f.type) or pa.types.is_decimal(f.type)
    ] or [f.name for f in schema if pa.types.is_integer(f.type)]
    key = text[0] if text else next(n for n in schema.names if n != event_time)
    return event_time, key, numbers[0] if numbers else None


def defs_yaml(
    type_name: str, name: str, topic: str, shape: tuple[str, str, str | None] | None
) -> str:
    if shape is None:
        header = (
            f"# The topic {topic} does not exist yet: this is the reference orders shape.\n"
            f"# Create it with: backlog-dagster log produce .data/{topic} --records 1000000\n"
        )
        shape = ("event_time", "customer_id", "amount")
    else:
        header = f"# Written for the topic {topic}: its record time, a key, a count and a sum.\n"
    event_time, key, number = shape
    sum_line = (
        ""
        if number is None
        else f"      - {{name: total_{number}, function: sum, column: {number}}}\n"
    )
    return (
        f"{header}"
        "# Every field is described in backlog-dagster's docs/pipeline.md.\n"
        f"type: {type_name}\n"
        "attributes:\n"
        f"  name: {name}\n"
        "  source:\n"
        f"    path: {topic}\n"
        f"    event_time: {event_time}\n"
        "  transform:\n"
        f"    keys: [{key}]\n"
        "    aggregations:\n"
        "      - {name: records, function: count}\n"
        f"{sum_line}"
        "  sink:\n"
        "    path: results.sqlite\n"
        f"    table: {name}\n"
        "  backlog:\n"
        "    checkpoint_interval: 30s\n"
        "  realtime:\n"
        "    checkpoint_interval: 2s\n"
    )
