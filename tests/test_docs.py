"""The documentation site: every setting described, the site built in strict mode (a
broken link or a page left out of the navigation fails), and the built pages opened in
headless Chromium through their navigation."""

from __future__ import annotations

import functools
import http.server
import importlib.util
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from selenium.webdriver.common.by import By

from tests.browser import chromium
from tests.wheel import ROOT


def script(name: str, path: Path) -> ModuleType:
    """The module of a script outside the package, imported as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def reference() -> ModuleType:
    """``docs/reference.py``, the hook that generates the reference pages."""
    return script("docs_reference", ROOT / "docs" / "reference.py")


def test_every_setting_has_a_description_and_the_reference_lists_it() -> None:
    settings = reference().settings()
    assert len(settings) > 50
    undescribed = [s.path for s in settings if not s.description.strip()]
    assert undescribed == [], f"settings without a description: {undescribed}"
    paths = {s.path for s in settings}
    for expected in ("source.event_time", "transform.aggregations[].function", "spark_master"):
        assert expected in paths
    assert "sink.dsn (kind: postgres)" in paths


def test_benchmarks_md_is_generated_one_section_per_bench() -> None:
    """BENCHMARKS.md is what ``bench/page.py`` makes of the latest results, never edited by
    hand, and shows each bench once: earlier runs stay in ``bench/results/``."""
    page = script("bench_page", ROOT / "bench" / "page.py")
    text = (ROOT / "BENCHMARKS.md").read_text()
    assert text == page.page(), "BENCHMARKS.md differs: run `.venv/bin/python bench/page.py`"
    scripts = re.findall(r"^From `bench/results/[^`]+` \(`bench/([\w.]+)`\)\.$", text, re.M)
    assert len(set(scripts)) == len(scripts), scripts
    assert set(scripts) <= {bench.script for bench in page.BENCHES}, scripts


def test_every_sink_table_column_is_explained_on_the_page_about_the_sink() -> None:
    """The generated column list and the page that says what each means agree."""
    page = (ROOT / "docs" / "reference" / "sink-tables.md").read_text()
    for table, columns in reference().sink_tables().items():
        if table.startswith("results"):  # the pipeline's own, named after its table
            continue
        assert f"`{table}`" in page, table
        for name, _ in columns:
            assert f"`{name}`" in page or name == "pipeline", f"{table}.{name}"


def nav_pages(nav: list[object]) -> Iterator[tuple[str, str]]:
    """``(title, page)`` of every entry of mkdocs.yml's ``nav``, depth first."""
    for entry in nav:
        assert isinstance(entry, dict)
        for title, target in entry.items():
            if isinstance(target, list):
                yield from nav_pages(target)
            else:
                yield title, target


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The site built in strict mode, served on loopback; its URL."""
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


def test_the_built_site_opens_in_chromium_and_its_navigation_reaches_every_page(
    site: str, tmp_path: Path
) -> None:
    nav = yaml.safe_load(
        (ROOT / "mkdocs.yml").read_text().replace("!!python/name:", "python-name ")
    )["nav"]
    pages = list(nav_pages(nav))
    with chromium(tmp_path / "profile") as browser:
        browser.get(site)
        assert "backlog-dagster" in browser.title
        links = {
            a.get_attribute("href") or "" for a in browser.find_elements(By.CSS_SELECTOR, "nav a")
        }
        for title, page in pages:
            url = site + ("" if page == "index.md" else page.removesuffix(".md") + "/")
            assert url in links, f"{title} ({page}) is not in the site's navigation"
            browser.get(url)
            heading = browser.find_element(By.TAG_NAME, "h1").text
            assert heading and "404" not in browser.title, (page, browser.title)
            assert "Page not found" not in browser.find_element(By.TAG_NAME, "body").text
        browser.get(site + "reference/settings/")
        table = browser.find_element(By.TAG_NAME, "table").text
        assert "source.event_time" in table and "spark_master" in table
        browser.get(site + "reference/cli/")
        assert "backlog-dagster log create" in browser.find_element(By.TAG_NAME, "body").text
