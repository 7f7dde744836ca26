"""The package as a user installs it: the wheel and sdist ``python -m build`` makes of
this checkout, and a fresh virtualenv outside the checkout with the wheel installed."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "backlog_dagster"
#: uv, installed beside this Python by ``make``: it makes and fills the virtualenvs.
UV = Path(sys.executable).with_name("uv")
#: What a user adds to run Dagster's UI and its ``dg`` and ``create-dagster`` commands,
#: of the Dagster release the package is built against.
DAGSTER_TOOLS = (
    "dagster-webserver>=1.13.27,<1.14",
    "dagster-dg-cli>=1.13.27,<1.14",
    "create-dagster>=1.13.27,<1.14",
)


def build(out: Path) -> tuple[Path, Path]:
    """``python -m build`` of the checkout: the wheel and the sdist it wrote to ``out``."""
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return wheel, sdist


def wheel_files(wheel: Path) -> set[str]:
    return set(zipfile.ZipFile(wheel).namelist())


def sdist_files(sdist: Path) -> set[str]:
    """The sdist's files, without its top folder (``name-version/``)."""
    with tarfile.open(sdist) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


def fresh_venv(where: Path, python: Path, requirements: Sequence[str]) -> Path:
    """A virtualenv at ``where`` on ``python`` with ``requirements`` installed (not
    editable); its ``bin`` folder."""
    run([str(UV), "venv", "--quiet", "--python", str(python), str(where)])
    install(where / "bin", requirements)
    return where / "bin"


def install(venv_bin: Path, requirements: Sequence[str]) -> None:
    """``pip install`` of ``requirements`` into the virtualenv of ``venv_bin``."""
    python = str(venv_bin / "python")
    run([str(UV), "pip", "install", "--quiet", "--python", python, *requirements])


def run(command: Sequence[str], timeout: float = 900, **options: object) -> str:
    """Run ``command``; its output. Fails the test, with the output, when it fails."""
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, **options
    )  # type: ignore[call-overload]
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return str(done.stdout)


def tracked_package_files() -> list[str]:
    """The package's files as git tracks them."""
    listed = subprocess.run(
        ["git", "ls-files", PACKAGE], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    return listed.split()


#: Variables that would lead a user's processes to the checkout or its virtualenv.
CHECKOUT_VARIABLES = (
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SPARK_HOME",
    "PYSPARK_PYTHON",
    "PYSPARK_DRIVER_PYTHON",
    "PYTHONSTARTUP",
)


def without_checkout(environment: dict[str, str]) -> dict[str, str]:
    """``environment`` without what would put the checkout or its virtualenv on a user's
    path: Python's and Spark's path variables."""
    kept = {k: v for k, v in environment.items() if k not in CHECKOUT_VARIABLES}
    return kept | {"PYTHONNOUSERSITE": "1"}
