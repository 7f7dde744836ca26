"""A realtime run as a standby makes it, in a process of its own, for the Spark Connect
tests: its query armed, then waiting for the switch while the test restarts the server.

Run as ``python tests/standby_worker.py DEFS GO TOTAL``: arms the realtime query of the
pipeline in ``DEFS`` (its backlog finished), says ``armed``, waits until the file ``GO``
exists, then runs realtime (going on in a new session if the server started again
meanwhile) until the sink's progress reaches ``TOTAL`` records.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from backlog_dagster.cli.pipeline import pipeline_of
from backlog_dagster.phases.realtime import RealtimeRun, armed_realtime, run_realtime
from backlog_dagster.phases.session import new_pipeline_session, pipeline_spark
from backlog_dagster.sink import open_sink
from backlog_dagster.spark.session import stopping_reopened


def main(defs: Path, go: Path, total: int) -> None:
    config = pipeline_of(defs)

    def reached_total() -> bool:
        with open_sink(config) as sink:
            generation = sink.current_generation()
        if generation is None:
            return False
        return sum(b.reached for b in generation.buckets.values()) >= total

    with (
        pipeline_spark(config, "realtime") as spark,
        open_sink(config) as sink,
        open_sink(config) as status_sink,
        tempfile.TemporaryDirectory(prefix="standby-checkpoint-") as checkpoint,
        stopping_reopened(lambda: new_pipeline_session(config, "realtime")) as reopen,
        armed_realtime(spark, config, RealtimeRun(checkpoint_dir=Path(checkpoint))) as armed,
    ):
        print("armed", flush=True)
        while not go.exists():
            time.sleep(0.2)
        run_realtime(
            spark,
            config,
            sink,
            status_sink,
            RealtimeRun(
                checkpoint_dir=Path(checkpoint),
                should_stop=reached_total,
                log=lambda line: print(line, flush=True),
                on_status=lambda status: None,
            ),
            armed=armed,
            reopen=reopen,
        )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
