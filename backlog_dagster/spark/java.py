"""The Java a Spark this process starts runs on, found as Spark's launch script finds it
(``JAVA_HOME``, else ``java`` on the path), checked before Spark is started so that a
missing or too old Java is one sentence, not a gateway that "exited before sending its
port number". A Java runtime is enough: nothing here compiles Java."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from backlog_dagster.errors import UserError

#: The oldest Java that Spark 4 runs on.
OLDEST_JAVA = 17
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


class JavaMissing(RuntimeError, UserError):
    """No Java, or one too old, for a Spark this process would start."""


def java_command() -> Path | None:
    """The ``java`` that Spark's launch script would run, if there is one."""
    home = os.environ.get("JAVA_HOME")
    if home:
        java = Path(home) / "bin" / "java"
        return java if java.is_file() else None
    found = shutil.which("java")
    return Path(found) if found else None


def major_version(banner: str) -> int | None:
    """The major version in ``java -version``'s words (``1.8.0`` is 8, ``17.0.15`` 17)."""
    match = _VERSION.search(banner)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@functools.cache
def java_problem() -> str | None:
    """What is wrong with this machine's Java for Spark, or None (asked once a process:
    ``java -version`` takes a tenth of a second)."""
    java = java_command()
    where = "JAVA_HOME" if os.environ.get("JAVA_HOME") else "the PATH"
    if java is None:
        return (
            f"Spark needs a Java runtime ({OLDEST_JAVA} or newer) and none was found on "
            f"{where}: install one (such as OpenJDK {OLDEST_JAVA}'s JRE) or set JAVA_HOME "
            "to it; or point spark_master at a Spark Connect server (sc://…)"
        )
    try:
        done = subprocess.run(
            [str(java), "-version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"Spark needs a Java runtime; {java} (from {where}) did not run: {error}"
    major = major_version(done.stderr + done.stdout)
    if major is None or major < OLDEST_JAVA:
        found = "an unknown version" if major is None else f"Java {major}"
        return (
            f"Spark needs Java {OLDEST_JAVA} or newer; {java} (from {where}) is {found}: "
            f"install Java {OLDEST_JAVA} or newer and set JAVA_HOME to it"
        )
    return None


def require_java() -> None:
    """Raise ``JavaMissing`` saying what to do unless a usable Java is there."""
    said = java_problem()
    if said is not None:
        raise JavaMissing(said)
