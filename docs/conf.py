"""Sphinx configuration of the docs site, built from docs/.

    pip install -r docs/requirements.txt . && sphinx-build -W --keep-going docs docs/_build

The pages are Markdown (MyST); the home page is the README. The API
reference (api.md) is autodoc's rendering of the installed package's
docstrings, which are reStructuredText: the package must be importable
with its compiled core, i.e. installed (tox's lint env installs it), not
the source folder.
"""
from __future__ import annotations

import os

from sphinx import addnodes

import socknotify_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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



#: The repository-root files a page of this site is made of ({include}):
#: the README is the home page, CHANGELOG.md the changelog. Pages and the
#: README link to the files themselves, which a repository browser shows
#: (there the including page shows only its directive); on the site each
#: such link goes to the including page.
INCLUDED = {"README": "index", "CHANGELOG": "changelog"}


def link_included_files(app, doctree) -> None:
    for node in doctree.findall(addnodes.pending_xref):
        if node.get("reftype") != "myst":
            continue
        target = node["reftarget"]
        if node.get("refdomain") == "doc":
            # A page's `../CHANGELOG.md`: MyST has made it an absolute path
            # without its suffix.
            folder, name = os.path.split(target)
            if folder == ROOT and name in INCLUDED:
                node["reftarget"] = INCLUDED[name]
        elif app.env.docname == "index":
            # The README's own `CHANGELOG.md`, relative to the repository
            # root, which MyST cannot tell from a name to look up.
            path, _, anchor = target.partition("#")
            name, suffix = os.path.splitext(path)
            if suffix == ".md" and name in INCLUDED:
                node["refdomain"] = "doc"
                node["reftarget"] = INCLUDED[name]
                node["reftargetid"] = anchor or None


def setup(app):
    app.connect("doctree-read", link_included_files)
