"""The project's name and version, read from its files without importing it.

The version is written in one place, ``socknotify_loop/_version.py``
(setuptools reads it the same way, statically); the name in
``pyproject.toml``. Importing the package is not an option here: its
compiled core is what these tools build.
"""
from __future__ import annotations

import ast
import os
import re

from .config import PACKAGE, ROOT


def package_version() -> str:
    """``__version__`` of socknotify_loop/_version.py."""
    path = os.path.join(PACKAGE, "_version.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(target, "id", None) == "__version__" for target in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"{path} sets no __version__")


def project_name() -> str:
    """``[project] name`` of pyproject.toml."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: tomli, which `build` depends on there
        import tomli as tomllib  # type: ignore[no-redef]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["name"]


def wheel_stem() -> str:
    """``name-version`` as a wheel's file name spells them."""
    return f"{re.sub(r'[-_.]+', '_', project_name()).lower()}-{package_version()}"
