"""Every code block on every page of the documentation site runs as written, and the site builds.

Each page's ```python blocks run top to bottom in one namespace, in a fresh working directory (a
page is self-contained, as a reader meets it). A block right after the comment
``<!-- requires: module.name -->`` runs once that name exists (names another branch adds), and a
page whose first line is ``<!-- docs-test: slow -->`` runs under ``make test-slow``.
"""

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "notebooks" not in p.parts)
BLOCK = re.compile(r"(?:<!-- requires: (?P<requires>[\w.]+) -->\n)?```python\n(?P<code>.*?)```", re.S)
SLOW = "<!-- docs-test: slow -->"


def _present(dotted):
    module, _, name = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def _params():
    for page in PAGES:
        text = page.read_text()
        if "```python" not in text:
            continue
        marks = [pytest.mark.slow] if text.startswith(SLOW) else []
        yield pytest.param(page, id=str(page.relative_to(DOCS)), marks=marks)


@pytest.mark.parametrize("page", list(_params()))
def test_page_code_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": f"docs.{page.stem}"}
    ran = 0
    for match in BLOCK.finditer(page.read_text()):
        if match["requires"] and not _present(match["requires"]):
            continue
        exec(compile(match["code"], str(page), "exec"), namespace)
        ran += 1
    assert ran, f"{page.name}: no block ran"


def test_every_page_with_code_is_tested():
    # a ```py or ```pycon block would escape the runner above
    for page in PAGES:
        assert not re.search(r"```(py|pycon|python3)\n", page.read_text()), page


def test_api_pages_name_every_public_name():
    sys.path.insert(0, str(DOCS))
    try:
        api_pages = importlib.import_module("api_pages")
    finally:
        sys.path.remove(str(DOCS))
    pages = api_pages.pages()
    for module, *_ in api_pages.MODULES:
        text = pages[f"api/{module}.md"]
        for name in api_pages.public_names(module):
            assert f'heading: "{module}.{name}"' in text or f"## `{module}.{name}`" in text, (module, name)
    # the modules promised in the reference are all there
    assert {"circuits", "circuits.interp", "circuits.models", "circuits.testing", "rewrites"} <= {
        m for m, *_ in api_pages.MODULES}


def test_docs_build_strict(tmp_path):
    """`make docs`'s build: strict, so a broken internal link or reference fails it; nothing fetched."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    pytest.importorskip("mkdocs_jupyter")
    site = tmp_path / "site"
    # run from a scratch directory (mkdocs-jupyter keeps a cache in .cache/ of the working directory)
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
                          "-d", str(site)], cwd=tmp_path, capture_output=True, text=True,
                         env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                              "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-4000:]
    html = "\n".join(p.read_text() for p in site.rglob("*.html"))
    assert "fonts.googleapis" not in html and "fonts.gstatic" not in html
    external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', html)
    assert not [u for u in external if "<link" not in u and not u.startswith("https://squidfunk")], external
    assert (site / "api" / "circuits.interp" / "index.html").exists()
    assert (site / "notebooks" / "03_features" / "index.html").exists()
