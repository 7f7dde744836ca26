"""Helpers for pipeline tests: declared pipelines over test topics, and pandas oracles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from backlog_dagster.log import Topic
from backlog_dagster.pipeline.config import PipelineConfig

ROOT = Path(__file__).resolve().parent.parent

CUSTOMER_TOTALS: dict[str, Any] = {
    "keys": ["customer_id"],
    "aggregations": [
        {"name": "total_amount", "function": "sum", "column": "amount"},
        {"name": "orders", "function": "count"},
        {"name": "largest_amount", "function": "max", "column": "amount"},
        {"name": "smallest_amount", "function": "min", "column": "amount"},
        {"name": "mean_amount", "function": "avg", "column": "amount"},
    ],
}
REGION_MINUTES: dict[str, Any] = {
    "keys": ["region"],
    "window": {"size": "1m", "allowed_lateness": "30s"},
    "aggregations": [
        {"name": "orders", "function": "count"},
        {"name": "total_amount", "function": "sum", "column": "amount"},
    ],
}


def pipeline(
    tmp_path: Path, transform: dict[str, Any], name: str = "customer_totals", **attributes: Any
) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "name": name,
            "source": {"path": str(tmp_path / "orders"), "event_time": "event_time"},
            "transform": transform,
            "sink": {"path": str(tmp_path / "results.sqlite"), "table": name},
            **attributes,
        }
    )


def in_chunks(tmp_path: Path, transform: dict[str, Any], name: str) -> PipelineConfig:
    """A pipeline whose backlog commits in several chunks and whose realtime commits
    micro-batches often: merges across chunks, micro-batches and the switch get tested."""
    return pipeline(
        tmp_path,
        transform,
        name=name,
        backlog={"checkpoint_interval": 0.01},  # a first chunk of 10,000 records
        realtime={"checkpoint_interval": 0.5},
    )


def write_defs(folder: Path, config: PipelineConfig, data: Path | None = None) -> Path:
    """Write ``config`` as a defs.yaml; with ``data``, its paths relative to that data root."""
    if data is not None:
        config = config.model_copy(
            update={
                "source": config.source.model_copy(
                    update={"path": str(Path(config.source.path).relative_to(data))}
                ),
                "sink": config.sink.model_copy(
                    update={"path": str(Path(config.sink.path).relative_to(data))}
                ),
            }
        )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "defs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "type": "backlog_dagster.BacklogPipeline",
                "attributes": config.model_dump(mode="json"),
            }
        )
    )
    return path


def records_up_to(
    topic: Topic, end: dict[int, int], start: dict[int, int] | None = None
) -> pd.DataFrame:
    frames = []
    for bucket, stop in end.items():
        low = (start or {}).get(bucket, 0)
        frames += [b.to_pandas() for b in topic.read(bucket, low, stop)]
    return pd.concat(frames, ignore_index=True)


def customer_totals_oracle(records: pd.DataFrame) -> pd.DataFrame:
    return (
        records.groupby("customer_id")
        .agg(
            total_amount=("amount", "sum"),
            orders=("amount", "size"),
            largest_amount=("amount", "max"),
            smallest_amount=("amount", "min"),
            mean_amount=("amount", "mean"),
        )
        .reset_index()
    )


def region_minutes_oracle(records: pd.DataFrame) -> pd.DataFrame:
    minute = records["event_time"].dt.floor("1min")
    return (
        records.assign(window_start=minute.dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ"))
        .groupby(["region", "window_start"])
        .agg(orders=("amount", "size"), total_amount=("amount", "sum"))
        .reset_index()
    )


def assert_same(results: pd.DataFrame, oracle: pd.DataFrame, keys: list[str]) -> None:
    """Equal row for row (floats to a relative 1e-9), whatever the order."""
    got = results[oracle.columns].sort_values(keys).reset_index(drop=True)
    want = oracle.sort_values(keys).reset_index(drop=True)
    assert len(got) == len(want)
    pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-9)


def assert_example_customer_totals(
    data: Path, topic_path: Path, up_to: dict[int, int] | None = None
) -> None:
    """The example project's customer_totals table (SQLite, under ``data``) equals the
    oracle over the log."""
    assert_customer_totals(example_config("customer_totals", data), topic_path, up_to)


def assert_example_region_minutes(data: Path, topic_path: Path) -> None:
    """The example's region_minutes table (SQLite, under ``data``) equals the oracle."""
    assert_region_minutes(example_config("region_minutes", data), topic_path)


def example_config(name: str, data: Path, project: Path = ROOT) -> PipelineConfig:
    """The example pipeline ``name`` as ``project`` declares it, its paths under ``data``."""
    from backlog_dagster.pipeline.load import load_pipeline
    from backlog_dagster.pipeline.paths import with_paths_under

    defs = project / "definitions" / "defs" / name / "defs.yaml"
    return with_paths_under(load_pipeline(defs), data)


def assert_customer_totals(
    config: PipelineConfig, topic_path: Path, up_to: dict[int, int] | None = None
) -> None:
    """customer_totals' results, read through its sink, equal the oracle over the log."""
    from backlog_dagster.sink import open_sink

    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    with Topic(topic_path) as topic:
        oracle = customer_totals_oracle(records_up_to(topic, up_to or topic.latest_offsets()))
    columns = ["customer_id", "total_amount", "orders", "largest_amount"]
    assert_same(results, oracle[columns], ["customer_id"])


def assert_region_minutes(config: PipelineConfig, topic_path: Path) -> None:
    """region_minutes' results equal the oracle over every record not held late."""
    from backlog_dagster.sink import open_sink

    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
        late = {(r["bucket"], r["offset"]) for r in sink.read_late().to_pylist()}
    with Topic(topic_path) as topic:
        oracle = region_minutes_oracle(records_not_late(topic, late))
    assert_same(results, oracle, ["region", "window_start"])


def records_not_late(topic: Topic, late: set[tuple[int, int]]) -> pd.DataFrame:
    """Every record the topic holds but those at ``late`` ``(bucket, offset)`` places."""
    frames = []
    for bucket, bounds in topic.bounds().items():
        offset = bounds.earliest
        for batch in topic.read(bucket, bounds.earliest, bounds.latest):
            frame = batch.to_pandas()
            frame["_key"] = [(bucket, offset + i) for i in range(len(frame))]
            frames.append(frame)
            offset += len(frame)
    records = pd.concat(frames, ignore_index=True)
    return records[~records["_key"].isin(late)]


#: HLL with lg_config_k 12: relative standard error 1.04 / sqrt(4096), about 1.6 %;
#: three of them.
HLL_BOUND = 3 * 1.04 / 64
#: KLL with k 200: the normalized rank error DataSketches gives for one quantile (99 %).
KLL_RANK_BOUND = 0.0165


def assert_sketched(config: PipelineConfig, records: pd.DataFrame, values: pd.Series) -> int:
    """A pipeline keyed by region in sliding windows, with ``orders`` (count),
    ``customers`` (count_distinct of customer_id) and quantiles of ``values`` named by its
    last aggregation: counts exact, estimates within the sketches' documented bounds.
    Returns the windows checked."""
    import numpy as np

    from backlog_dagster.sink import open_sink

    window = config.transform.window
    assert window is not None
    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
    at = records["event_time"].astype("datetime64[us, UTC]").astype("int64")
    size, slide = window.size_us, window.slide_us
    last = at - at % slide
    rows = []
    for k in range(-(-size // slide)):
        start = last - k * slide
        inside = start + size > at
        rows.append(
            records[inside].assign(
                window=pd.to_datetime(start[inside], unit="us", utc=True), value=values[inside]
            )
        )
    exploded = pd.concat(rows)
    results["window"] = pd.to_datetime(results["window_start"], utc=True)
    exact = exploded.groupby(["region", "window"])
    assert len(results) == exact.ngroups, (len(results), exact.ngroups, results.head())
    quantiles = config.transform.aggregations[-1]
    assert quantiles.quantiles is not None
    for (region, start), group in exact:
        row = results[(results["region"] == region) & (results["window"] == start)].iloc[0]
        assert row["orders"] == len(group)
        distinct = group["customer_id"].nunique()
        assert abs(row["customers"] - distinct) <= max(1, HLL_BOUND * distinct), (row, distinct)
        ordered = np.sort(group["value"].to_numpy())
        for q, column in zip(quantiles.quantiles, quantiles.outputs, strict=True):
            # A value that several records share holds every rank between its first
            # and its last: the estimate's error is q's distance from that range.
            lowest, highest = (
                np.searchsorted(ordered, row[column], side=side) / len(ordered)
                for side in ("left", "right")
            )
            error = max(lowest - q, q - highest, 0.0)
            assert error <= KLL_RANK_BOUND + 1 / len(ordered), (column, lowest, highest, q)
    return len(results)


def assert_example_region_daily(data: Path, topic_path: Path) -> None:
    """The example's region_daily table (SQLite, under ``data``) against the log: its
    function adds 20 % tax to the amount it takes quantiles of."""
    with Topic(topic_path) as topic:
        records = records_up_to(topic, topic.latest_offsets())
    config = example_config("region_daily", data)
    assert assert_sketched(config, records, records["amount"] * 1.2) > 0


#: Large orders, each with its amount in cents.
LARGE_ORDERS = {
    "filter": "amount >= 100",
    "columns": {"cents": "CAST(round(amount * 100) AS BIGINT)"},
}
ORDER_COLUMNS = ["order_id", "customer_id", "region", "amount", "event_time"]


def large_orders_oracle(records: pd.DataFrame, banded: bool) -> pd.DataFrame:
    """``LARGE_ORDERS`` over ``records``; ``banded``: after ``tests.user_functions:banded``."""
    from tests.user_functions import LARGE

    kept = records[records["amount"] >= 100].copy()
    if banded:
        kept["with_tax"] = kept["amount"] * 1.2
        kept["band"] = [
            "large" if a >= LARGE else None if r == "region-00" else "small"
            for a, r in zip(kept["amount"], kept["region"], strict=True)
        ]
    kept["cents"] = (kept["amount"] * 100).round().astype("int64")
    return kept


def assert_each_kept_once(
    config: PipelineConfig, records: pd.DataFrame, banded: bool = False
) -> None:
    """A stateless pipeline's rows: each of ``records`` that ``LARGE_ORDERS`` keeps, once."""
    from backlog_dagster.sink import open_sink

    with open_sink(config) as sink:
        results = sink.read_results().to_pandas()
        assert sink.dead_letter_count() == 0
    extra = ["with_tax", "band"] if banded else []
    assert list(results.columns) == [*ORDER_COLUMNS, *extra, "cents"]
    expected = large_orders_oracle(records, banded)
    assert results["order_id"].is_unique and len(results) == len(expected) > 1000
    results = results.sort_values("order_id").reset_index(drop=True)
    expected = expected.sort_values("order_id").reset_index(drop=True)
    results["event_time"] = pd.to_datetime(results["event_time"], utc=True)
    expected["event_time"] = pd.to_datetime(expected["event_time"], utc=True)
    pd.testing.assert_frame_equal(
        results[expected.columns.tolist()], expected, check_dtype=False, check_exact=False
    )
