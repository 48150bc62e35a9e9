"""The compiled C core (``ffi``, ``lib``), or an ImportError that says why not.

The common way to get here without a compiled core is a source checkout:
``python -m socknotify_loop`` or ``python -c`` run from the repository root
put the current directory first on ``sys.path``, so Python imports the
source folder ``socknotify_loop/`` (which has no ``_socknotify`` module
until it is built in place) instead of any installed copy.
"""
from __future__ import annotations

import os

__all__ = ["ffi", "lib"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_CORE_NAME = __name__.rpartition(".")[0] + "._socknotify"


def _not_built_message() -> str:
    """Explain the missing core and the command that fixes it."""
    root = os.path.dirname(_PACKAGE_DIR)
    if os.path.exists(os.path.join(root, "pyproject.toml")):
        # A source tree: build the core where it is imported from.
        return (f"socknotify_loop's C core is not built in {_PACKAGE_DIR}: "
                f"run `pip install -e .` in {root} to build it in place, or run "
                f"Python from another directory to import an installed copy "
                f"(`pip install .` installs one; from {root}, `python -m` and "
                f"`python -c` import this source folder instead).")
    # Not `pip install --force-reinstall socknotify_loop`: the package is not
    # on PyPI yet, so pip could not find it by name.
    return (f"socknotify_loop's C core (_socknotify) is missing from {_PACKAGE_DIR}: "
            "the installation is incomplete; reinstall it from the wheel file or "
            "the checkout it came from with "
            "`pip install --force-reinstall --no-deps <wheel file or checkout folder>`.")


try:
    from ._socknotify import ffi, lib
except ModuleNotFoundError as exc:
    if exc.name != _CORE_NAME:
        raise   # something the core itself imports is missing (e.g. cffi)
    raise ImportError(_not_built_message(), name=_CORE_NAME, path=_PACKAGE_DIR) from None
