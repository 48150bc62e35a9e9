"""The peer loops of benchmarks/peers.txt, installed one at a time.

pip installs a requirements file all or nothing: one peer without a wheel
for this Python would stop the whole run. Here each missing peer is asked
of pip on its own (wheels only: a source build of a Rust or Zig loop is not
what users install), and what pip said is kept, so the results and the page
say why a peer is missing instead of leaving it out.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from typing import Callable, Dict, List

from .loops import PEER_MODULES, packages_of

PEERS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peers.txt")


def requirements(path: str = PEERS_FILE) -> Dict[str, str]:
    """{package: requirement line} of peers.txt."""
    answer = {}
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if line:
                answer[re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0].lower()] = line
    return answer


def pip_reason(output: str) -> str:
    """The line of pip's output that says why it failed."""
    lines = [line.strip() for line in output.splitlines() if line.strip()
             and not line.startswith("WARNING: Location")]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = errors[-1] if errors else (lines[-1] if lines else "no output")
    return chosen[:300]


def ensure(loop_names: List[str], log: Callable[[str], None],
           install: Callable[[str], subprocess.CompletedProcess] = None) -> Dict[str, dict]:
    """Install, one at a time, the peers the loops need and this Python
    lacks; {package: {"installed": requirement} or {"error": pip's reason}}
    for each one tried. Packages already importable are not touched."""
    install = install or _pip_install
    wanted = requirements()
    needed: List[str] = []
    for name in loop_names:
        for package in packages_of(name):
            if package in wanted and package not in needed:
                needed.append(package)
    outcome: Dict[str, dict] = {}
    for package in needed:
        if importlib.util.find_spec(PEER_MODULES.get(package, package)) is not None:
            continue
        requirement = wanted[package]
        log(f"installing {requirement} (wheels only)")
        proc = install(requirement)
        if proc.returncode == 0:
            outcome[package] = {"installed": requirement}
        else:
            reason = pip_reason((proc.stdout or "") + "\n" + (proc.stderr or ""))
            outcome[package] = {"error": f"pip install {requirement!r} failed: {reason}"}
            log(f"{package}: {outcome[package]['error']}")
    importlib.invalidate_caches()
    return outcome


def _pip_install(requirement: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", "--only-binary=:all:", requirement],
                          capture_output=True, text=True, check=False, timeout=600)
