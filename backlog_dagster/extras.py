"""The package's optional parts (``pip install 'backlog-dagster[EXTRA]'``) and whether
each is installed, so that a pipeline asking for one that is not gets a sentence saying
what to install, where it asks (its file and field when Dagster loads it), not an
``ImportError`` from deep inside a run."""

from __future__ import annotations

import importlib.util

from backlog_dagster.errors import UserError

#: Each extra, what it is for, and the modules it brings (checked without importing them).
EXTRAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "connect": (
        "a Spark Connect server (spark_master: sc://…) needs PySpark's Spark Connect client",
        ("grpc", "grpc_status", "google.rpc", "zstandard"),
    ),
    "postgres": (
        "a PostgreSQL sink (sink.kind: postgres) needs the psycopg driver",
        ("psycopg",),
    ),
}


class MissingExtra(RuntimeError, UserError):
    """An optional part of the package that a pipeline needs is not installed."""


def missing_modules(extra: str) -> list[str]:
    """The modules of ``extra`` that this Python cannot import."""
    _, modules = EXTRAS[extra]
    return [module for module in modules if not _importable(module)]


def problem(extra: str) -> str | None:
    """What to install for ``extra``, or None when it is installed."""
    missing = missing_modules(extra)
    if not missing:
        return None
    why, _ = EXTRAS[extra]
    return (
        f"{why}, which is not installed here (no module {', '.join(missing)}): "
        f"pip install 'backlog-dagster[{extra}]'"
    )


def require(extra: str) -> None:
    """Raise ``MissingExtra`` saying what to install unless ``extra`` is installed."""
    said = problem(extra)
    if said is not None:
        raise MissingExtra(said)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
