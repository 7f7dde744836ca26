"""Why ``conftest.pytest_xdist_make_scheduler`` is there: xdist's own ``--dist loadgroup``
does not keep an ``xdist_group`` together here. When this test fails, it does: replace
the scheduler with ``xdist_group`` marks on the `dagster dev` modules."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def test_xdist_loadgroup_does_not_yet_keep_a_group_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(
        textwrap.dedent(f"""\
        import os
        import pytest

        pytestmark = pytest.mark.xdist_group(name="heavy")

        @pytest.mark.parametrize("i", range(6))
        def test_heavy(i):
            with open({str(tmp_path / "workers")!r}, "a") as out:
                out.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
        """)
    )
    (tmp_path / "test_light.py").write_text(
        "import pytest, time\n\n@pytest.mark.parametrize('i', range(6))\n"
        "def test_light(i):\n    time.sleep(0.05)\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-2000:]
    workers = set((tmp_path / "workers").read_text().split())
    assert len(workers) == 2, "loadgroup groups now: use it instead of the custom scheduler"
