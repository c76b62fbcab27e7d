"""The documentation site builds with warnings as errors, and holds what it promises.

The build is ``make docs``'s command (``sphinx-build -W --keep-going -b html docs ...``) into a temporary
folder, in a subprocess. Every page of docs/ must be in a toctree (Sphinx warns otherwise), every
docstring must be valid reStructuredText, and the notebooks are rendered from their stored outputs.
"""

import os
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BUILD_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("docs_html")
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "-d", str(out / ".doctrees"), str(DOCS), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, f"sphinx-build failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return out, result.stdout + result.stderr


def test_every_page_is_built(site):
    out, _ = site
    for page in DOCS.glob("*.md"):
        html = out / f"{page.stem}.html"
        assert html.is_file(), f"{page.name} was not built"
        assert len(html.read_text()) > 2000, f"{html.name} is nearly empty"


def test_api_reference_documents_the_public_api(site):
    import pyro_multihop

    out, _ = site
    for name in pyro_multihop.__all__:
        if inspect.ismodule(getattr(pyro_multihop, name)):  # a submodule (engine, datasets): its own page
            page = out / "generated" / f"pyro_multihop.{name}.html"
            assert page.is_file() and f'id="module-pyro_multihop.{name}"' in page.read_text(), f"no page for {name}"
            continue
        if not callable(getattr(pyro_multihop, name)):  # data (SVI_DEFAULTS): on its module's page, with its comment
            pages = "".join(page.read_text() for page in (out / "generated").glob("pyro_multihop.*.html"))
            assert re.search(rf'id="pyro_multihop\.[a-z_.]+\.{name}"', pages), f"pyro_multihop.{name} is not documented"
            continue
        page = out / "generated" / f"pyro_multihop.{name}.html"
        assert page.is_file(), f"no API page for pyro_multihop.{name}"
        assert f'id="pyro_multihop.{name}"' in page.read_text(), f"pyro_multihop.{name} is not documented on its page"
    chained = (out / "generated" / "pyro_multihop.ChainedAttention.html").read_text()
    assert 'id="pyro_multihop.ChainedAttention.posterior"' in chained, "methods are not documented"
    for module in ("data", "engine.log_space", "gate_ops", "models.tied", "guides.annealing", "em.closed_form", "train", "cli"):
        assert (out / "generated" / f"pyro_multihop.{module}.html").is_file(), f"no page for pyro_multihop.{module}"


def test_notebooks_are_rendered_from_stored_outputs(site):
    out, log = site
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    for notebook in notebooks:
        html = (out / "notebooks" / f"{notebook.stem}.html").read_text()
        assert "<img" in html, f"{notebook.name}: no stored figure was rendered"
    assert not re.search(r"[Ee]xecuting notebook", log), "a notebook was executed during the build"


def test_benchmark_tables_are_included(site):
    out, _ = site
    html = (out / "benchmarks.html").read_text()
    tables = len(list((ROOT / "benchmarks" / "results").glob("*.md")))
    assert html.count("<table") >= tables, f"benchmarks.html has {html.count('<table')} tables for {tables} result files"
    assert "ChainedEM" in html and "plain-adam" in html


def test_readme_links_into_the_docs_resolve():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)#]+)", readme)
    assert links, "the README links to no docs page"
    for link in links:
        assert (ROOT / link).is_file(), f"README links to {link}, which does not exist"
    assert len(readme.splitlines()) <= 200, "the README is meant to be a short front page"
