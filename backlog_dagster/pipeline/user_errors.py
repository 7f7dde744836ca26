"""The mistakes a user can fix, which runs and the CLI report as a message naming the
pipeline's file rather than as a stack trace."""

from __future__ import annotations


def user_error_types() -> tuple[type[Exception], ...]:
    """Mistakes the user can fix (config against the source, bad record, truncated log,
    missing topic, unreachable sink, unset setting, a Java or an extra not installed,
    state of another definition, a run already going): reported as a message naming the
    file, not a stack trace."""
    from backlog_dagster.phases.bad_records import BadRecord
    from backlog_dagster.phases.lock import PhaseAlreadyRunning
    from backlog_dagster.phases.markers import DefinitionChanged
    from backlog_dagster.phases.reference import ReferenceError
    from backlog_dagster.phases.transform import TransformError
    from backlog_dagster.phases.truncation import LogTruncated
    from backlog_dagster.pipeline.extras import MissingExtra
    from backlog_dagster.pipeline.secrets import SettingUnset
    from backlog_dagster.sink import SinkUnreachable
    from backlog_dagster.source import SourceError
    from backlog_dagster.spark.java import JavaMissing
    from backlog_dagster.spark.session import SparkSettingRefused

    return (
        BadRecord,
        DefinitionChanged,
        JavaMissing,
        LogTruncated,
        MissingExtra,
        PhaseAlreadyRunning,
        ReferenceError,
        SettingUnset,
        SinkUnreachable,
        SourceError,
        SparkSettingRefused,
        TransformError,
    )
