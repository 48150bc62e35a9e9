"""The cp39-abi3-win_amd64 wheel: the package, the mingw-built core, and the
.dist-info the project's own build backend writes.

The metadata (METADATA, top_level.txt, licenses/) is not written here: the
build backend pyproject.toml names (setuptools) prepares it with its
``prepare_metadata_for_build_wheel`` hook, through the ``build`` package,
exactly as for the Linux wheel. Only WHEEL (the tag) and RECORD (the
hashes) are this file's.
"""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import tempfile
import zipfile

from .apt import ensure_apt_packages
from .compile import compile_extension
from .config import CACHE, DIST, PACKAGE, ROOT, log
from .project import wheel_stem
from .python import WINDOWS_PYTHONS, ensure_windows_python

# The core is compiled against the limited API and linked with python3.dll,
# like the Linux wheel (setup.py): one wheel for every Windows CPython from
# 3.9 on.
WHEEL_TAG = "cp39-abi3-win_amd64"
#: what the Linux wheel leaves out too (setup.py, pyproject.toml): the C
#: sources, the cffi builder, build and cache leftovers
SKIPPED_DIRS = ("__pycache__", "_core")
SKIPPED_FILES = ("_build.py",)
SKIPPED_SUFFIXES = (".so", ".pyd", ".pyc")


def wheel_path() -> str:
    """Where the wheel is written (dist/name-version-tag.whl)."""
    return os.path.join(DIST, f"{wheel_stem()}-{WHEEL_TAG}.whl")


def prepare_dist_info(outdir: str) -> str:
    """The project's .dist-info folder, made by its build backend in
    ``outdir``; returns its path. The backend runs in this Python when its
    requirements are installed here, else in an isolated environment that
    ``build`` fills from the package index."""
    try:
        import build
        import build.env
    except ImportError:
        raise SystemExit("the wheel's metadata comes from the project's build backend, "
                         "through the 'build' package: pip install build") from None
    builder = build.ProjectBuilder(ROOT)
    # check_dependency yields the unmet requirement chains of one requirement;
    # the backend's own requirements can be asked only once it is installed.
    unmet = [chain for req in builder.build_system_requires
             for chain in build.check_dependency(req)]
    if not unmet and not builder.check_dependencies("wheel"):
        log("metadata: the build backend, run in this Python")
        return builder.metadata_path(outdir)
    log("metadata: the build backend, run in an isolated environment")
    with build.env.DefaultIsolatedEnv() as env:
        builder = build.ProjectBuilder.from_isolated_env(env, ROOT)
        env.install(builder.build_system_requires)
        env.install(builder.get_requires_for_build("wheel"))
        return builder.metadata_path(outdir)


def package_files() -> dict:
    """{name in the wheel: bytes} of the package's pure-Python files."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(PACKAGE):
        dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
        for filename in filenames:
            if filename.endswith(SKIPPED_SUFFIXES) or filename in SKIPPED_FILES:
                continue
            path = os.path.join(dirpath, filename)
            arcname = os.path.relpath(path, ROOT).replace(os.sep, "/")
            with open(path, "rb") as f:
                files[arcname] = f.read()
    return files


def dist_info_files(dist_info: str) -> dict:
    """{name in the wheel: bytes} of the backend's .dist-info, less what a
    wheel writes itself (WHEEL, RECORD)."""
    name = os.path.basename(dist_info)
    files = {}
    for dirpath, _, filenames in os.walk(dist_info):
        for filename in filenames:
            path = os.path.join(dirpath, filename)
            relative = os.path.relpath(path, dist_info).replace(os.sep, "/")
            if relative in ("WHEEL", "RECORD"):
                continue
            with open(path, "rb") as f:
                files[f"{name}/{relative}"] = f.read()
    return files


def record_line(name: str, data: bytes) -> list:
    """One RECORD row: name, urlsafe-base64 sha256 without padding, size."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return [name, f"sha256={digest}", str(len(data))]


def build_wheel(version: str) -> str:
    """Compile the core for that Windows Python and write the wheel; returns
    its path."""
    ensure_apt_packages()
    ensure_windows_python(version)
    tag = WINDOWS_PYTHONS[version].tag
    # One build folder per Windows Python (whose headers it compiles with):
    # runs for two versions may overlap.
    workdir = os.path.join(CACHE, f"build-{tag}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    pyd = compile_extension(version, workdir)

    files = package_files()
    with open(pyd, "rb") as f:
        files[f"socknotify_loop/{os.path.basename(pyd)}"] = f.read()
    with tempfile.TemporaryDirectory(dir=workdir) as metadata_dir:
        dist_info = prepare_dist_info(metadata_dir)
        files.update(dist_info_files(dist_info))
    name = os.path.basename(dist_info)
    if name != f"{wheel_stem()}.dist-info":
        raise SystemExit(f"the build backend made {name}, not {wheel_stem()}.dist-info")
    # A test build (SOCKNOTIFY_TESTING=1: the strict model and its controls
    # compiled in) says so in its WHEEL file, where is_test_wheel() reads it.
    testing = os.environ.get("SOCKNOTIFY_TESTING") == "1"
    files[f"{name}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        f"Generator: socknotify_loop tools/wine{TEST_BUILD if testing else ''}\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {WHEEL_TAG}\n"
    ).encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arcname, data in files.items():
        writer.writerow(record_line(arcname, data))
    writer.writerow([f"{name}/RECORD", "", ""])
    files[f"{name}/RECORD"] = record.getvalue().encode()

    os.makedirs(DIST, exist_ok=True)
    wheel = wheel_path()
    # Written aside and renamed: both Windows Pythons' runs write this one
    # file and may overlap; a reader never sees it half written.
    partial = f"{wheel}.{tag}.part"
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
        for arcname, data in files.items():
            zf.writestr(arcname, data)
    os.replace(partial, wheel)
    log(f"wrote {wheel}")
    return wheel


#: What the WHEEL file's Generator line of a test build ends with.
TEST_BUILD = " (test build)"


def is_test_wheel(wheel: str) -> bool:
    """Whether ``wheel`` exists and is a test build (see build_wheel)."""
    if not os.path.exists(wheel):
        return False
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".dist-info/WHEEL"):
                return TEST_BUILD.encode() in zf.read(name)
    return False


def fresh_wheel(version: str) -> str:
    """dist's wheel if it is newer than every file of the package, else a new one."""
    wheel = wheel_path()
    if os.path.exists(wheel):
        built = os.path.getmtime(wheel)
        if all(os.path.getmtime(os.path.join(d, f)) <= built
               for d, _, names in os.walk(PACKAGE) for f in names
               if not f.endswith(SKIPPED_SUFFIXES)):
            return wheel
    return build_wheel(version)
