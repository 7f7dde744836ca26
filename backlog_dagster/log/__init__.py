"""The embedded bucketed log: the default source, with no server to run."""

from backlog_dagster.log.bucket import Bucket, BucketBounds, OffsetOutOfRange
from backlog_dagster.log.topic import BucketInfo, Topic, TopicError, create_topic

__all__ = [
    "Bucket",
    "BucketBounds",
    "BucketInfo",
    "OffsetOutOfRange",
    "Topic",
    "TopicError",
    "create_topic",
]
