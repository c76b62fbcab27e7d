"""Sphinx configuration of the pyro-multihop documentation (``make docs``; output in ``docs/_build/html``)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # document the checkout, not whatever copy is installed
os.environ.setdefault("MPLBACKEND", "Agg")

import pyro_multihop  # noqa: E402

project = "pyro-multihop"
author = "pyro-multihop contributors"
copyright = "pyro-multihop contributors"
release = pyro_multihop.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",  # knows the doctest directive of docstrings inherited from Pyro's distributions
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",  # Markdown pages (MyST) and the notebooks, rendered from their stored outputs
]

# Pages are MyST Markdown; notebooks are rendered as stored, never executed.
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
nb_execution_mode = "off"
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "_templates", "Thumbs.db", ".DS_Store", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]

# API reference: one page per public object, generated from the docstrings at build time.
autosummary_generate = True
autosummary_imported_members = False
# What pyro_multihop re-exports is documented once, under the name users import; module pages link to it.
autosummary_context = {"toplevel": list(pyro_multihop.__all__)}
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autoclass_content = "both"
autodoc_inherit_docstrings = False  # overrides of torch/pyro methods (expand, ...) would show their docstrings

intersphinx_mapping = {}  # no network at build time: links to torch/pyro docs are plain URLs

html_theme = "furo"
html_title = f"pyro-multihop {release}"
html_static_path = []
