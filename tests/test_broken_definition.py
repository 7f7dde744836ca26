"""A definition that cannot run leaves no trap, through `dagster dev`: break, watch, fix.

A mistake only Spark sees (a filter naming a column the source lacks) passes the load;
its backlog run fails naming the file and field, the standby fails on the same check
instead of holding a Spark driver, and once the file is fixed and the code location
reloaded, the sensor takes the pipeline through backlog and switch with nothing done by
hand: no reset, since nothing was committed under the broken definition.

The pipeline's older records are in a Parquet archive and the log keeps the rest (the
same session serves both): its backlog reads each bucket from both, says so, and the
results equal the oracle over every record.

The same session is looked at in headless Chromium: while the fixed backlog runs, the
backlog asset's overview shows its progress and ETA and the sensor's page says where the
pipeline is; after the switch, the realtime asset's overview shows the phase and the lag.

Then two pipelines are added to the running deployment, each taken by its sensor from
backlog to realtime under the daemon: the example's region_daily (its own PySpark
function, sliding windows, sketches) and a stateless pipeline; both against oracles.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from dagster_graphql import DagsterGraphQLClient

from backlog_dagster.pipeline.config import PipelineConfig
from backlog_dagster.sink import open_sink
from backlog_dagster.tools.dev_server import dagster_dev
from tests.browser import chromium, page_showing, screenshot
from tests.conftest import MakeTopic
from tests.dagster_server import copy_example
from tests.pipelines import (
    LARGE_ORDERS,
    assert_each_kept_once,
    assert_same,
    assert_sketched,
    customer_totals_oracle,
    example_config,
    records_up_to,
)
from tests.test_archive import END_S, archive
from tests.test_switch import runs_of, sink_state, wait_until

BROKEN_FILTER = "amout > 0"
#: Enough records for the backlog to run while the browser looks (one chunk, as the
#: example has it: its progress and ETA come from Spark's finished read tasks) on one
#: core. Dagster's daemon ticks a sensor every 5 s at best, and a run's Spark is cold:
#: of 1,200,000 records' 25 s read through the Python data source, its tasks finished in
#: the last 5 s, leaving one observation with an ETA 4.4 s before the materialization
#: replaced it on the overview. With the log read in Spark's JVM, 2,000,000 records'
#: backlog ended before any tick saw a finished read task (twice in two runs).
RECORDS = 8_000_000
#: The backlog of each pipeline added to the running deployment (the log's last records).
ADDED_BACKLOG = 100_000


# A backstop: 5 to 6 minutes on a quiet machine, past 10 beside the other worker's
# dagster dev session on a slow one.
@pytest.mark.timeout(1200)
def test_a_broken_definition_fixed_in_place_runs_without_a_reset(
    make_topic: MakeTopic, tmp_path: Path
) -> None:
    topic = make_topic(records=RECORDS, buckets=2, name="example/orders")
    everything = records_up_to(topic, topic.latest_offsets())
    # The pipelines added later start near the log's end: a short backlog each.
    late_start = {b: max(0, end - ADDED_BACKLOG // 2) for b, end in topic.latest_offsets().items()}
    recent = records_up_to(topic, topic.latest_offsets(), late_start)
    archive(topic.path, tmp_path / "example" / "archive", END_S - 50, "--truncate")
    assert all(b.earliest > 0 for b in topic.bounds().values())
    project = tmp_path / "project"

    added_later: dict[str, dict[str, Any]] = {}

    def only_customer_totals(attributes: dict[str, Any]) -> bool:
        attributes["source"]["archive"] = {"path": "example/archive", "format": "parquet"}
        # One core: the backlog takes long enough to be looked at, and leaves the other
        # core to the tests beside this one.
        attributes["spark_master"] = "local[1]"
        if attributes["name"] != "customer_totals":
            # Added once the browser is done: both cores and a short backlog (each
            # backlog run goes on as its realtime run, as shipped).
            attributes["spark_master"] = "local[*]"
            attributes["source"]["start"] = {"offsets": late_start}
            added_later[attributes["name"]] = attributes
            return False
        attributes["transform"]["filter"] = BROKEN_FILTER
        # A standby realtime run beside the backlog run, which fails on the same check.
        attributes["switch"] |= {"standby": True, "continue_as_realtime": False}
        # Reports and ticks often enough for a browser to see them within seconds.
        attributes["switch"] |= {"interval": "2s", "status_every": "1s", "report_every": "2s"}
        return True

    copy_example(project, only_customer_totals)
    defs = project / "definitions" / "defs" / "customer_totals" / "defs.yaml"
    home = tmp_path / "dagster_home"
    with dagster_dev(project, home, tmp_path) as server:
        client = DagsterGraphQLClient("127.0.0.1", port_number=server.port)
        instance = dg.DagsterInstance.from_config(str(home))

        def ended(job: str) -> list[dg.DagsterRun]:
            return [r for r in runs_of(instance, job) if r.is_finished]

        wait_until(
            lambda: ended("customer_totals_backlog_job") and ended("customer_totals_realtime_job"),
            300,
            "the broken backlog run and its standby to fail",
        )
        backlog = ended("customer_totals_backlog_job")[0]
        standby = ended("customer_totals_realtime_job")[0]
        assert backlog.status == standby.status == dg.DagsterRunStatus.FAILURE
        assert standby.tags["backlog_dagster/standby"] == "true"
        for run in (backlog, standby):
            failure = str(instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE))
            assert f"{defs}: attributes.transform.filter: Spark cannot use" in failure
        assert not any(
            r.status == dg.DagsterRunStatus.STARTED
            for r in runs_of(instance, "customer_totals_realtime_job")
        ), "a standby still holds a Spark driver"

        document = yaml.safe_load(defs.read_text())
        document["attributes"]["transform"]["filter"] = "amount > 0"
        defs.write_text(yaml.safe_dump(document, sort_keys=False))
        client.reload_repository_location("example")

        fixed = {"customer_totals": example_config("customer_totals", tmp_path, project)}
        with chromium(tmp_path / "chromium") as browser:
            try:
                the_ui_shows_the_backlog_then_the_realtime_phase(
                    browser,
                    f"http://127.0.0.1:{server.port}",
                    instance,
                    fixed,
                    tmp_path / "screenshots",
                )
            except AssertionError as error:
                raise AssertionError(f"{error}\n{sensor_lines(home)}") from None
        # Two pipelines added to the running deployment: the example's region_daily
        # (its own function, sliding windows, sketches) and a stateless one. Each runs
        # under the daemon from its sensor's first tick to realtime.
        daily = added_later["region_daily"]
        added_later["large_orders"] = {
            **daily,
            "name": "large_orders",
            "transform": LARGE_ORDERS,
            "sink": {**daily["sink"], "table": "large_orders"},
        }
        for name, attributes in added_later.items():
            (defs.parents[1] / name).mkdir()
            document = {"type": "backlog_dagster.BacklogPipeline", "attributes": attributes}
            (defs.parents[1] / name / "defs.yaml").write_text(yaml.safe_dump(document))
        client.reload_repository_location("example")
        added = {name: example_config(name, tmp_path, project) for name in added_later}
        wait_until(
            lambda: all(sink_state(added, name)[0] == "realtime" for name in added),
            400,
            "the added pipelines to switch",
        )
        assert assert_sketched(added["region_daily"], recent, recent["amount"] * 1.2)
        assert_each_kept_once(added["large_orders"], recent)
        with open_sink(fixed["customer_totals"]) as sink:
            results = sink.read_results().to_pandas()
        columns = ["customer_id", "total_amount", "orders", "largest_amount"]
        assert_same(results, customer_totals_oracle(everything)[columns], ["customer_id"])
        backlog = (
            instance.fetch_materializations(dg.AssetKey("customer_totals_backlog"), limit=1)
            .records[0]
            .asset_materialization
        )
        assert backlog is not None
        table = backlog.metadata["buckets"].value
        assert {r.data["read_from"] for r in table.records} == {"archive, log"}  # type: ignore[union-attr]
        import sqlite3

        with sqlite3.connect(tmp_path / "example" / "results.sqlite") as db:
            reasons = [
                r[0]
                for r in db.execute(
                    "SELECT reason FROM backlog_generations WHERE pipeline = 'customer_totals' "
                    "ORDER BY generation"
                )
            ]
        assert reasons == ["first start", "definition changed before any result"]
        instance.dispose()


def sensor_lines(home: Path, last: int = 40) -> str:
    """The last lines the switch sensor's ticks left in the `dagster dev` log: what it
    saw, and whether its ticks ran at all."""
    text = (home / "dagster-dev.log").read_text(errors="replace")
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in text.splitlines()]
    return "\n".join([line for line in lines if "customer_totals_switch" in line][-last:])


def the_ui_shows_the_backlog_then_the_realtime_phase(
    browser: Any,
    url: str,
    instance: dg.DagsterInstance,
    configs: dict[str, PipelineConfig],
    screenshots: Path,
) -> None:
    # The page is open before the backlog reads a record, and reloaded every few
    # seconds as a reader would: the backlog's progress shows while it runs (once the
    # backlog materializes, the overview shows the materialization's metadata instead).
    # Its ETA is known only once Spark's first read tasks end, which on a busy machine
    # can be seconds before the materialization: it is looked for among the asset's
    # observations below.
    text = page_showing(
        browser,
        f"{url}/assets/customer_totals_backlog",
        ["percent_done", "records_done", "phase_since"],
        timeout=400,
        reload_every=1.5,
    )
    assert re.search(r"catching up \d+ % \([\d,]+ of [\d,]+ records\)", text), text
    # Seen while the backlog ran: its run had not materialized the asset yet.
    assert "finished_at" not in text, text
    # One time format on the page: the pipeline's, not a second one beside it.
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text), text
    screenshot(browser, screenshots, "backlog-progress", scroll_to="Metadata")
    # The realtime asset's check says, from the first moment, that it is not live yet.
    page_showing(
        browser,
        f"{url}/assets/customer_totals_realtime?view=checks",
        ["keeps_up", "not streaming yet: catching up"],
    )
    screenshot(browser, screenshots, "checks-during-backlog")
    text = page_showing(
        browser, f"{url}/locations/example/sensors/customer_totals_switch", ['"where": "']
    )
    # The cursor, which the tick list shows, holds the state and no raw Unix time.
    assert not re.search(r"\d{10}", text), text
    screenshot(browser, screenshots, "sensor")
    wait_until(
        lambda: sink_state(configs, "customer_totals")[0] == "realtime",
        400,
        "the fixed pipeline to switch to realtime",
    )
    observed = instance.fetch_observations(dg.AssetKey("customer_totals_backlog"), limit=1000)
    descriptions = [
        r.asset_observation.description or "" for r in observed.records if r.asset_observation
    ]
    assert any(re.search(r", ETA \d", d) for d in descriptions), descriptions
    text = page_showing(
        browser,
        f"{url}/assets/customer_totals_realtime",
        ["streaming, lag", "lag_records", "phase_since"],
    )
    screenshot(browser, screenshots, "realtime-phase", scroll_to="Metadata")
    # From the checks: streaming, and the backlog finished.
    page_showing(
        browser,
        f"{url}/assets/customer_totals_realtime?view=checks",
        ["keeps_up", "streaming, lag"],
    )
    page_showing(
        browser,
        f"{url}/assets/customer_totals_backlog?view=checks",
        ["catches_up", "backlog finished"],
    )
    screenshot(browser, screenshots, "checks-streaming")
    # The Runs list names what a run does (here the standby took over: a realtime run)
    # and its tags follow the pipeline.
    page_showing(
        browser, f"{url}/runs", ["customer_totals_realtime_job", "backlog_dagster/phase: realtime"]
    )
    screenshot(browser, screenshots, "runs")
    page_showing(browser, f"{url}/assets", ["customer_totals_realtime", "customer_totals_backlog"])
    screenshot(browser, screenshots, "catalog")
    # The lineage graph shows each asset's checks. It counts a check only when it was
    # evaluated after the asset's latest materialization: the backlog's, evaluated again
    # after its run materialized it, and the realtime's, which the realtime run evaluates
    # right after each status it materializes (here every 2 s).
    lineage = f"{url}/locations/example/asset-groups/customer_totals/lineage"
    # "Passed" once the nodes' checks have loaded (the page shows "Loading..." first).
    names = ["customer_totals_realtime", "customer_totals_backlog", "Passed"]
    shown = {"text": ""}

    def both_checks_evaluated() -> bool:
        shown["text"] = page_showing(browser, lineage, names)
        return shown["text"].count("1 / 1 Passed") == 2

    try:
        wait_until(both_checks_evaluated, 120, "both checks to pass on the lineage graph")
    except AssertionError as error:
        raise AssertionError(f"{error}; the lineage graph showed:\n{shown['text']}") from None
    screenshot(browser, screenshots, "lineage")
