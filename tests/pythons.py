"""The interpreters of the Python versions the package supports, found on this machine:
``pythonX.Y`` on the PATH when it runs, else pyenv's build of that version. ``make``
asks it for the unit tests' interpreters (``python tests/pythons.py 3.10``), the user's
project test for the oldest and the newest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

#: The oldest and the newest Python the package is tested on (``requires-python``).
OLDEST, NEWEST = "3.10", "3.13"


def find(version: str) -> Path | None:
    """An interpreter of ``version`` that runs, or None."""
    name = f"python{version}"
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    on_path = shutil.which(name)
    candidates = [Path(on_path)] if on_path else []
    candidates += sorted(pyenv.glob(f"{version}.*/bin/{name}"), reverse=True)
    for candidate in candidates:
        done = subprocess.run([candidate, "-c", ""], capture_output=True, check=False)
        if done.returncode == 0:
            return candidate
    return None


if __name__ == "__main__":
    found = find(sys.argv[1])
    if found is None:
        sys.exit(f"no Python {sys.argv[1]} on this machine (PATH or pyenv)")
    print(found)
