"""The Spark home the project launches Spark from: the pyspark installation's launch
scripts and jars, without its zipped copy of PySpark.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path of
every Python process it starts: its workers, the daemons that fork them, a Spark Connect
server's ``foreachBatch`` and streaming-source processes. That zip holds sources only,
so each of those processes compiled every PySpark module it imported (a worker's
imports took 0.8 core-seconds from the zip against 0.3 from the installed package,
whose modules pip compiled once). A Spark session starts several such processes (a
daemon and a worker each for creating, planning and reading a Python data source), a
Connect server several per client session and per streaming query. Through ``dagster
dev`` with a Spark per run (``bench/e2e.py --case as_shipped --baseline``, the example,
2 cores, medians of three, alternating in one run) the three pipelines switched at 85 to
93 s with this home against 105 to 127 s without it.

This home is a folder (``project_folder``) whose entries link to the installation's
launch scripts and jars, and nothing else: those processes then import the installed
PySpark, the same version as the jars the JVM runs. A ``SPARK_HOME`` the user set is
left alone (``spark.session.use_this_python``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: What Spark's launch scripts use of a Spark home: the launch home links to these.
LAUNCH_ENTRIES = ("bin", "sbin", "jars", "conf", "RELEASE")


def project_folder() -> Path:
    """Where the project keeps the launch home it makes for one installation: in the
    virtual environment when there is one (gone with it), else in the user's cache."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "var" / "backlog-dagster"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "backlog-dagster"


def installed_home() -> Path:
    """The pyspark installation, which carries Spark's launch scripts and jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def spark_home() -> Path:
    """The Spark home of a Spark this process starts: the user's ``SPARK_HOME``, else
    the launch home."""
    given = os.environ.get("SPARK_HOME")
    return Path(given) if given else launch_home()


def launch_home() -> Path:
    """The Spark home to launch from: the installation without its zipped PySpark, made
    once per installation; the installation itself where there is no zip to leave out
    or the folder cannot be written."""
    installed = installed_home()
    if not (installed / "python" / "lib" / "pyspark.zip").exists():
        return installed
    try:
        return _linked_home(installed)
    except OSError:
        return installed


def _linked_home(installed: Path) -> Path:
    import pyspark

    digest = hashlib.sha256(str(installed.resolve()).encode()).hexdigest()[:12]
    cache = project_folder()
    home = cache / f"spark-home-{pyspark.__version__}-{digest}"
    if (home / "bin" / "spark-submit").exists():
        return home
    cache.mkdir(parents=True, exist_ok=True)
    # Made beside it and renamed into place, so that runs starting at once never see
    # half a home: the first rename wins, the others' copies are dropped.
    building = Path(tempfile.mkdtemp(prefix=f".{home.name}-", dir=cache))
    try:
        for name in LAUNCH_ENTRIES:
            if (installed / name).exists():
                (building / name).symlink_to(installed / name)
        with contextlib.suppress(OSError):
            os.rename(building, home)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    if not (home / "bin" / "spark-submit").exists():
        raise OSError(f"could not make a Spark home in {cache}")
    return home
