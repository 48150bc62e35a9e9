"""Where the Wine tools keep things, and the two helpers every step uses."""
from __future__ import annotations

import importlib.util
import os
import subprocess
from types import ModuleType

#: the repository root (tools/wine/ is two levels below it)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: downloads, Windows Pythons, Wine prefixes and build folders (not committed)
CACHE = os.environ.get("SOCKNOTIFY_WINE_CACHE", os.path.join(ROOT, ".wine-cache"))
#: where the wheel is written, as `python -m build` would
DIST = os.path.join(ROOT, "dist")
#: the package's source folder, read (never imported: its core is not built here)
PACKAGE = os.path.join(ROOT, "socknotify_loop")


class Refused(SystemExit):
    """A download or a file that failed its check: the run stops here, with
    the message saying which file, and what was expected and found."""


def log(message: str) -> None:
    """One progress line on stdout, marked as ours."""
    print(f"[wine] {message}", flush=True)


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, logged first; a failure raises CalledProcessError."""
    log(" ".join(str(c) for c in cmd))
    return subprocess.run(cmd, check=True, **kwargs)


def load_file(name: str, path: str) -> ModuleType:
    """Import one Python file by its path, under ``name``.

    For the project files these tools share but cannot import as modules:
    ``socknotify_loop/_build.py`` (importing it through the package would
    load the package, whose compiled core is what is being built) and
    ``tests/servers.py`` (tests/ is not a package).
    """
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
