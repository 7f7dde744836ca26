"""Settings read from the environment when a run starts, and kept out of every message.

A ``FromEnv`` setting is resolved through Dagster's ``EnvVar`` only where it is used
(the run's process), so its value is never part of the definitions, the run config or
the component's attributes the UI shows. Errors raised while it is in use have it
replaced by ``***`` before they reach Dagster's event log.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from backlog_dagster.errors import UserError
from backlog_dagster.pipeline.config import FromEnv


class SettingUnset(ValueError, UserError):
    """A setting reads an environment variable that is not set."""


def resolve(value: str | FromEnv, field: str) -> str:
    """The setting's value; for ``{env: NAME}``, the variable's value now."""
    if isinstance(value, str):
        return value
    # Only here: Spark's Python workers and a Connect server's commit process import this
    # module, and Dagster's import took 0.6 s and 35 MiB of each of their starts.
    import dagster as dg

    found = dg.EnvVar(value.env).get_value()
    if not found:
        raise SettingUnset(
            f"attributes.{field}: environment variable {value.env} is not set (or empty); "
            f"set it where the runs start, e.g. in the .env file beside the project"
        )
    return found


@contextmanager
def secret_kept_out(value: str | FromEnv, secret: str) -> Iterator[None]:
    """Raise any error of the block again with ``secret`` replaced, when it is one."""
    try:
        yield
    except Exception as error:
        if isinstance(value, str) or secret not in str(error):
            raise
        raise RuntimeError(f"{type(error).__name__}: {error}".replace(secret, "***")) from None
