"""How far the Spark jobs a session runs now have read: the share of read tasks done.

A backlog chunk is one Spark job (``checkpoint_interval: 0`` makes the whole backlog
one), and its first stage reads the records in tasks of about equal size, so the share
of that stage's finished tasks is the best estimate of records read that Spark gives
while the job runs (the later stages only merge what it read). A local or cluster
session asks its status tracker; a Spark Connect client is told by the server with each
response, through a progress handler.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from backlog_dagster.spark.session import is_connect

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Share of read tasks finished (0 to 1) in the jobs running now; None when none runs.
TasksDone = Callable[[], float | None]


@contextmanager
def watching_tasks(spark: SparkSession) -> Iterator[TasksDone]:
    """While the block runs, a function that tells the share of read tasks done now."""
    if not is_connect(spark):
        yield lambda: _tracked(spark)
        return
    from pyspark.sql.connect.shell.progress import ProgressHandler

    class ReadShare(ProgressHandler):
        """Keeps the share of the first stage's tasks done, as the server last said."""

        def __init__(self) -> None:
            self.lock = threading.Lock()
            self.share: float | None = None

        def __call__(self, stages: Any, inflight_tasks: int, operation_id: Any, done: bool) -> None:
            first = min(stages or [], key=lambda s: s.stage_id, default=None)
            with self.lock:
                if done or first is None or not first.num_tasks:
                    self.share = None
                else:
                    self.share = first.num_completed_tasks / first.num_tasks

        def read(self) -> float | None:
            with self.lock:
                return self.share

    handler = ReadShare()
    spark.registerProgressHandler(handler)
    try:
        yield handler.read
    finally:
        spark.removeProgressHandler(handler)


def _tracked(spark: SparkSession) -> float | None:
    tracker = spark.sparkContext.statusTracker()
    total = completed = 0
    for job_id in tracker.getActiveJobsIds():
        job = tracker.getJobInfo(job_id)
        stage = None if job is None or not job.stageIds else tracker.getStageInfo(min(job.stageIds))
        if stage is not None:
            total += stage.numTasks
            completed += stage.numCompletedTasks
    return completed / total if total else None
