"""The packages installed into the Windows CPythons: one requirements file,
every package pinned with the SHA-256 of its win_amd64 wheels.

``tests/requirements-windows.txt`` (the extras of pyproject.toml as they
apply to Windows) and the pyperf pin of ``benchmarks/requirements.txt``
(benchmarks/run.py's native mode) are the source; ``python -m tools.wine
lock`` resolves them with pip for each Windows CPython of WINDOWS_PYTHONS,
as the installs do (win_amd64 wheels only), and writes LOCK. The installs
take LOCK in pip's hash-checking mode, which also refuses a dependency
LOCK does not pin, so a new dependency fails the install until LOCK is
written again.

pip resolves for the win_amd64 platform and the Python version it is
told, but evaluates the other environment markers for the machine it runs
on: dependencies only Windows declares (pytest's colorama, psycopg's
tzdata) are left out here, as the installs leave them out.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import tempfile

from .config import ROOT, log
from .python import WINDOWS_PYTHONS, pip_for_windows
from .signing import sha256_file

HERE = os.path.dirname(os.path.abspath(__file__))
#: the requirements file every install into a Windows CPython takes
LOCK = os.path.join(HERE, "requirements.txt")
#: what LOCK is resolved from
SOURCE = os.path.join(ROOT, "tests", "requirements-windows.txt")
BENCH_SOURCE = os.path.join(ROOT, "benchmarks", "requirements.txt")
BENCH_PACKAGES = ["pyperf"]
#: what benchmarks/run.py needs in the Windows CPython, with the
#: dependencies of each: the bench installs these entries of LOCK alone (the
#: whole file takes several times longer); hash-checking mode refuses the
#: install if one of them gains a dependency not listed here
BENCH_NEEDS = ["cffi", "pycparser", "pyperf", "psutil"]

HEADER = """\
# Written by `python -m tools.wine lock` (tools/wine/lock.py): do not edit.
# What tools/wine installs into the Windows CPythons it tests under Wine
# ({pythons}), in pip's hash-checking mode: tests/requirements-windows.txt
# and benchmarks/requirements.txt's pyperf, resolved for win_amd64, wheels
# only; each package pinned with the SHA-256 of its wheels for those Pythons.
"""


def normal_name(name: str) -> str:
    """A project name as packaging normalises it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(filename: str) -> tuple:
    """(normalised name, version) of a wheel's file name."""
    name, version = filename.split("-")[:2]
    return normal_name(name), version


def bench_lines() -> list:
    """benchmarks/requirements.txt's lines for BENCH_PACKAGES."""
    with open(BENCH_SOURCE, encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return [line for line in lines
            if re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0] in BENCH_PACKAGES]


def resolve(version: str, requirements: str, directory: str) -> dict:
    """{name: (version, sha256)} of the wheels pip picks for that Windows
    CPython, downloaded into ``directory``."""
    tag = WINDOWS_PYTHONS[version].tag
    subprocess.run([sys.executable, "-m", "pip", "download", "-q",
                    "--disable-pip-version-check", "--only-binary=:all:",
                    "--platform", "win_amd64", "--python-version", version,
                    "--implementation", "cp", "--abi", tag,
                    "-r", requirements, "-d", directory], check=True)
    found = {}
    for filename in sorted(os.listdir(directory)):
        if filename.endswith(".whl"):
            name, pinned = wheel_name_version(filename)
            found[name] = (pinned, sha256_file(os.path.join(directory, filename)))
    return found


def write_lock(path: str = LOCK) -> None:
    """Resolve the sources for every Windows CPython and write ``path``."""
    pins: dict = {}
    hashes: dict = collections.defaultdict(set)
    with tempfile.TemporaryDirectory() as scratch:
        requirements = os.path.join(scratch, "requirements.txt")
        with open(SOURCE, encoding="utf-8") as f:
            source = f.read()
        with open(requirements, "w", encoding="utf-8") as f:
            f.write(source.rstrip("\n") + "\n" + "\n".join(bench_lines()) + "\n")
        for version in sorted(WINDOWS_PYTHONS):
            log(f"resolving for the Windows CPython {version}")
            resolved = resolve(version, requirements, os.path.join(scratch, version))
            for name, (pinned, digest) in resolved.items():
                if pins.setdefault(name, pinned) != pinned:
                    raise SystemExit(f"{name}: {pins[name]} for one Windows CPython, {pinned} "
                                     "for another; one file pins one version")
                hashes[name].add(digest)
    lines = [HEADER.format(pythons=" and ".join(sorted(WINDOWS_PYTHONS)))]
    for name in sorted(pins):
        entry = [f"{name}=={pins[name]}"] + [f"    --hash=sha256:{digest}"
                                             for digest in sorted(hashes[name])]
        lines.append(" \\\n".join(entry) + "\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    log(f"wrote {path}: {len(pins)} packages")


def read_lock(path: str = LOCK) -> dict:
    """{normalised name: (version, [sha256, ...])} of LOCK's entries."""
    with open(path, encoding="utf-8") as f:
        text = f.read().replace("\\\n", " ")
    entries = {}
    for line in text.splitlines():
        match = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:\S+)*)\s*$",
                         line)
        if match:
            entries[normal_name(match.group(1))] = (
                match.group(2), re.findall(r"--hash=sha256:(\S+)", match.group(3)))
    return entries


def install_locked(version: str, names=None) -> None:
    """LOCK's packages (only ``names`` when given) into that Windows
    CPython, hashes checked."""
    if names is None:
        pip_for_windows(version, ["--require-hashes", "-r", LOCK])
        return
    entries = read_lock()
    with tempfile.TemporaryDirectory() as scratch:
        subset = os.path.join(scratch, "requirements.txt")
        with open(subset, "w", encoding="utf-8") as f:
            for name in names:
                pinned, hashes = entries[normal_name(name)]
                f.write(f"{name}=={pinned}"
                        + "".join(f" --hash=sha256:{digest}" for digest in hashes) + "\n")
        pip_for_windows(version, ["--require-hashes", "-r", subset])
