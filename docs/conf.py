"""Sphinx configuration of the docs site, built from docs/.

    pip install -r docs/requirements.txt . && sphinx-build -W --keep-going docs docs/_build

The pages are Markdown (MyST); the home page is the README. The API
reference (api.md) is autodoc's rendering of the installed package's
docstrings, which are reStructuredText: the package must be importable
with its compiled core, i.e. installed (tox's lint env installs it), not
the source folder.
"""
from __future__ import annotations

import socknotify_loop

project = "socknotify_loop"
author = "the socknotify_loop authors"
copyright = "2026, the socknotify_loop authors"
release = version = socknotify_loop.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "requirements.txt"]

# Links to a heading (`benchmarks.md#linux`) resolve to its anchor.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The docstrings' signatures as written, without quoted annotations.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_preserve_defaults = True
python_use_unqualified_type_names = True

html_theme = "furo"
html_title = f"socknotify_loop {release}"
html_static_path: list = []
