"""The embedded bucketed log: the default source, with no server to run."""

from backlog_dagster.log.bucket import Bucket, BucketBounds, OffsetOutOfRange
from backlog_dagster.log.schema import TIMESTAMP, SchemaError, parse_ddl, to_ddl, type_name
from backlog_dagster.log.topic import (
    JSON_VALUE_COLUMN,
    BucketInfo,
    Payload,
    Topic,
    TopicError,
    create_topic,
)

__all__ = [
    "JSON_VALUE_COLUMN",
    "TIMESTAMP",
    "Bucket",
    "BucketBounds",
    "BucketInfo",
    "OffsetOutOfRange",
    "Payload",
    "SchemaError",
    "Topic",
    "TopicError",
    "create_topic",
    "parse_ddl",
    "to_ddl",
    "type_name",
]
