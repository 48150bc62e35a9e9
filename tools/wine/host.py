"""The Python packages the Linux side of these tools imports, checked (and,
in a virtual environment, installed) before any command starts.

cffi emits the core's C code from socknotify_loop/_build.py; ``build`` runs
the project's build backend for the wheel's metadata. Without this check a
fresh environment meets the second only after the core has compiled.
"""
from __future__ import annotations

import importlib.metadata
import re
import sys

from .config import log, run

#: requirement -> the distribution it names and the oldest version it takes
#: (cffi's floor is the build requirement pyproject.toml gives CPython)
HOST_REQUIREMENTS = {
    "cffi>=2.0": ("cffi", (2, 0)),
    "build": ("build", ()),
}


def _version_tuple(text: str) -> tuple:
    """The leading numeric release of a version string: "2.0.1" -> (2, 0, 1)."""
    match = re.match(r"\d+(\.\d+)*", text)
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def missing_host_packages(installed=None) -> list:
    """The requirements of HOST_REQUIREMENTS this Python does not meet.

    ``installed(name)`` returns a distribution's version or raises
    ``importlib.metadata.PackageNotFoundError`` (the default looks it up).
    """
    installed = installed or importlib.metadata.version
    missing = []
    for requirement, (name, oldest) in HOST_REQUIREMENTS.items():
        try:
            version = installed(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement)
            continue
        if _version_tuple(version) < oldest:
            missing.append(requirement)
    return missing


def in_virtualenv() -> bool:
    """Whether this Python runs in a virtual environment (venv, virtualenv)."""
    return sys.prefix != getattr(sys, "base_prefix", sys.prefix)


def ensure_host_packages() -> None:
    """Install what HOST_REQUIREMENTS lacks into this Python when it is a
    virtual environment; anywhere else (a system Python, whose packages
    are the system's) stop before any work, giving the command to run."""
    missing = missing_host_packages()
    if not missing:
        return
    if not in_virtualenv():
        raise SystemExit(
            "python -m tools.wine needs on the Linux side: " + ", ".join(missing) +
            f". Install them first ({sys.executable} -m pip install " +
            " ".join(f"'{r}'" for r in missing) + "), or run the tool from a virtual "
            "environment, where it installs them itself.")
    log("the Linux side needs " + ", ".join(missing) + ": installing into this environment")
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         *missing])
    still = missing_host_packages()
    if still:
        raise SystemExit("pip did not install " + ", ".join(still))
