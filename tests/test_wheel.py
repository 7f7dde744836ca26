"""The wheel and the sdist hold every file the package opens at run time: what an
editable install hides (a source file of another kind left out of the package data)."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from tests.wheel import PACKAGE, ROOT, build, sdist_files, tracked_package_files, wheel_files


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel and the sdist of the checkout."""
    return build(tmp_path_factory.mktemp("dist"))


def opened_beside_modules() -> set[str]:
    """The files the package's code names beside one of its modules: ``Path(__file__)``
    with ``.with_name(NAME)`` or ``/ NAME``, and ``module.__file__`` of a module it runs
    as a program; as paths in the wheel."""
    named: set[str] = set()
    for source in sorted((ROOT / PACKAGE).rglob("*.py")):
        folder = source.parent.relative_to(ROOT).as_posix()
        imported: dict[str, str] = {}
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
            named |= _named_by(node, imported, folder)
    return named


def _named_by(node: ast.AST, imported: dict[str, str], folder: str) -> set[str]:
    """The package file ``node`` names, if it names one (``opened_beside_modules``)."""
    if (
        isinstance(node, ast.Attribute)
        and node.attr == "__file__"
        and isinstance(node.value, ast.Name)
        and node.value.id in imported
    ):
        return {imported[node.value.id].replace(".", "/") + ".py"}
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "with_name"
        and _is_own_file(node.func.value)
        and isinstance(node.args[0], ast.Constant)
    ):
        return {f"{folder}/{node.args[0].value}"}
    if (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Div)
        and _is_own_file(node.left)
        and isinstance(node.right, ast.Constant)
    ):
        return {f"{folder}/{node.right.value}"}
    return set()


def _is_own_file(node: ast.expr) -> bool:
    """``Path(__file__)``, or its ``.parent``."""
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        node = node.value
    return isinstance(node, ast.Call) and any(
        isinstance(a, ast.Name) and a.id == "__file__" for a in node.args
    )


def test_the_wheel_holds_every_file_of_the_package_and_every_file_it_opens(
    built: tuple[Path, Path],
) -> None:
    wheel, sdist = wheel_files(built[0]), sdist_files(built[1])
    tracked = set(tracked_package_files())
    assert tracked, "git lists no file of the package"
    assert tracked - wheel == set(), "tracked files of the package missing from the wheel"
    opened = opened_beside_modules()
    assert f"{PACKAGE}/spark/connect_main.py" in opened  # the finder sees what it must
    assert opened - wheel == set(), "files the package opens, missing from the wheel"
    assert not [name for name in wheel if name.endswith((".java", ".class", ".jar"))]
    assert tracked - sdist == set(), "tracked files of the package missing from the sdist"
    assert {"pyproject.toml", "README.md"} <= sdist


def test_the_package_compiles_nothing_and_fetches_nothing_where_it_is_installed() -> None:
    """No JDK compiler, package manager or download at run time: a Java runtime and
    pip's install are all a user's machine has."""
    refused = ("javac", "apt-get", "urlretrieve", "curl ", "wget ")
    for source in sorted((ROOT / PACKAGE).rglob("*.py")):
        text = source.read_text()
        for word in refused:
            assert word not in text, f"{source.relative_to(ROOT)} uses {word}"


def test_every_python_a_dagster_project_allows_may_install_it(built: tuple[Path, Path]) -> None:
    """``create-dagster`` scaffolds ``requires-python = ">=3.10,<3.15"``, and uv resolves
    a project's dependencies for its whole range: the package must admit all of it."""
    from packaging.specifiers import SpecifierSet

    metadata = zipfile.ZipFile(built[0]).read(f"{PACKAGE}-0.1.0.dist-info/METADATA").decode()
    (line,) = [x for x in metadata.splitlines() if x.startswith("Requires-Python:")]
    allowed = SpecifierSet(line.split(":", 1)[1].strip())
    assert all(f"3.{minor}" in allowed for minor in range(10, 15)), allowed
