"""Where the workers run when this Python drives them itself: Linux CPython,
or Windows CPython natively (the Wine side is wine_side.py), and the
in-place build that makes the source tree's package importable there."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from typing import Callable

from .runner import HERE, ROOT, Platform

WORKER = os.path.join(HERE, "worker.py")


def package_env(installed: bool) -> dict:
    """The workers' environment: our package from the source tree, unless
    ``installed`` (then whatever ``import socknotify_loop`` finds)."""
    env = dict(os.environ)
    if not installed:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    # Each loop names its backend (loops.py); a variable left in the caller's
    # environment must not change the default backend of plain "socknotify".
    env.pop("SOCKNOTIFY_BACKEND", None)
    return env


def linux_platform(cpu: int, installed: bool) -> Platform:
    """Linux CPython: this interpreter runs the workers, each pinning itself
    to ``cpu`` (os.sched_setaffinity)."""
    return Platform(name="linux", command=lambda spec: [sys.executable, WORKER, spec],
                    env=package_env(installed), pin=cpu, cwd=ROOT)


def windows_platform(cpu: int, installed: bool) -> Platform:
    """Windows CPython itself, natively: this very interpreter runs the
    workers, each pinning itself to ``cpu`` (SetProcessAffinityMask)."""
    return Platform(name="windows", command=lambda spec: [sys.executable, WORKER, spec],
                    env=package_env(installed), pin=cpu, cwd=ROOT)


def ensure_inplace_build(log: Callable[[str], None]) -> None:
    """``pip install -e .`` when the C core is missing or older than its
    sources, so the figures are those of the code in the tree. (The build
    runs in pip's isolated build environment: ``setup.py build_ext`` needs
    the setuptools pyproject.toml asks for, which this Python may lack.)"""
    package = os.path.join(ROOT, "socknotify_loop")
    built = glob.glob(os.path.join(package, "_socknotify*.pyd" if sys.platform == "win32"
                                   else "_socknotify*.so"))
    sources = glob.glob(os.path.join(package, "_core", "*.[ch]")) + [
        os.path.join(package, "_build.py")]
    newest = max(os.path.getmtime(p) for p in sources)
    if built and min(os.path.getmtime(p) for p in built) >= newest:
        return
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "-e", ROOT]
    log(f"building the C core in place ({' '.join(command[1:])})")
    proc = subprocess.run(command, check=False, cwd=ROOT, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        log("the in-place build failed; measuring the extension already there"
            + (f": {tail[0][:200]}" if tail else ""))
