"""The Windows side: Windows CPython 3.11 under Wine, driven from Linux.

Reuses tools/wine/ (``python -m tools.wine``) for everything it already
knows (the Windows Python, the mingw-built win_amd64 wheel, the Wine
environment) and adds what a benchmark needs on top:

- A Wine prefix of its own (``.wine-cache/bench-prefix``): wineserver is
  per prefix, so killing ours between rounds cannot kill a test run that
  uses the tools' prefix at the same time, and theirs cannot share our
  server (and its CPU).
- Our package from the wheel, unpacked into a private folder on
  PYTHONPATH, rather than installed into the shared Windows Python.
- Placement: python.exe and wineserver both on one CPU (``taskset``; the
  wineserver that ``wine`` starts inherits the affinity). On different
  CPUs a loop does ~0.5k round trips/s instead of ~2.5k (measured here),
  so the placement is read back from /proc and recorded, not assumed.
- ``wineserver -k; wineserver -w`` before and after every process, so no
  server lingers from the previous round.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from types import ModuleType

import psutil

from .runner import RAW, ROOT, Platform

#: the name tools/wine/ is imported under here (its modules import each
#: other relatively, so any name serves)
WINE_TOOLS = "socknotify_wine_tools"


def _wine_tools(module: str) -> ModuleType:
    """One module of tools/wine/, the package ``python -m tools.wine`` runs,
    imported from its folder, not as ``tools``: run by path, run.py puts the
    project root last on sys.path, where another distribution's top-level
    ``tools`` package would be found first."""
    if WINE_TOOLS not in sys.modules:
        folder = os.path.join(ROOT, "tools", "wine")
        spec = importlib.util.spec_from_file_location(
            WINE_TOOLS, os.path.join(folder, "__init__.py"),
            submodule_search_locations=[folder])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {folder}")
        package = importlib.util.module_from_spec(spec)
        sys.modules[WINE_TOOLS] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"{WINE_TOOLS}.{module}")


wine_apt = _wine_tools("apt")
wine_config = _wine_tools("config")
windows_cpython = _wine_tools("python")
wine_runtime = _wine_tools("runtime")
wine_wheel = _wine_tools("wheel")

PY = "3.11"
BENCH_PREFIX = os.path.join(wine_config.CACHE, "bench-prefix")
SITE = os.path.join(wine_config.CACHE, "bench-site")
RUNDIR = os.path.join(wine_config.CACHE, "bench-run")
PEER_PACKAGES = ["winloop==0.8.2", "cffi"]


def bench_env() -> dict[str, str]:
    env = wine_runtime.wine_env(PY)
    env["WINEPREFIX"] = BENCH_PREFIX
    env["PYTHONPATH"] = wine_runtime.windows_path(SITE)
    # Each loop names its backend (loops.py); none comes from the caller's
    # environment.
    env.pop("SOCKNOTIFY_BACKEND", None)
    return env


def stop_wineserver() -> None:
    """Kill our prefix's wineserver and wait until it is gone."""
    wine_runtime.stop_wineserver(PY, bench_env())


def windows_python(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the Windows Python once (set-up chores), output captured; bounded
    by ``timeout`` (tools/wine's runner, which waits for the process and
    not for the end of its output, held open by the prefix's services)."""
    try:
        return wine_runtime.wine_python(PY, args, check=False, timeout=timeout, cwd=RUNDIR,
                                        env=bench_env(), echo=False)
    finally:
        stop_wineserver()


def prepare(log) -> dict[str, object]:
    """Windows Python, peers and our wheel ready; returns notes for the report."""
    notes: dict[str, object] = {}
    wine_apt.ensure_apt_packages()
    windows_cpython.ensure_windows_python(PY)
    os.makedirs(RUNDIR, exist_ok=True)
    check = windows_python(["-c", "import winloop, cffi"])
    if check.returncode != 0:
        log("installing winloop and cffi into the Windows Python")
        windows_python(["-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "--no-warn-script-location", *PEER_PACKAGES])
    shutil.rmtree(SITE, ignore_errors=True)
    os.makedirs(SITE)
    try:
        # The build's compiler output goes to a log, not over the progress lines.
        with _output_to(os.path.join(RAW, "wine-wheel-build.log")):
            wheel = wine_wheel.build_wheel(PY)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(SITE)
        notes["wheel"] = os.path.basename(wheel)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 (the peers are still worth measuring)
        notes["wheel_error"] = f"{type(exc).__name__}: {exc}"
        log(f"our win_amd64 wheel did not build ({notes['wheel_error'][:200]}); "
            f"see benchmarks/results/raw/wine-wheel-build.log: peers only, ours not measured")
    return notes


@contextlib.contextmanager
def _output_to(path: str):
    """Send this process's stdout and stderr (file descriptors 1 and 2, so
    child processes too) to a file for the duration."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "wb") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def placement() -> dict[str, str]:
    """CPU affinity of our python.exe and wineserver (psutil, which pyperf
    brings), as lists of CPUs such as "0" or "0,1"."""
    found = {}
    for proc in psutil.process_iter(["name"]):
        name = proc.info["name"] or ""
        if not (name.startswith("wineserver") or name == "python.exe"):
            continue
        try:
            # Debian's server is wineserver64; ours is told apart by its prefix.
            if proc.environ().get("WINEPREFIX") == BENCH_PREFIX:
                found[name] = ",".join(str(c) for c in sorted(proc.cpu_affinity()))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def platform(cpu: int) -> Platform:
    """Workers as `taskset -c CPU wine python.exe worker.py SPEC`."""
    exe = os.path.join(windows_cpython.python_dir(PY), "python.exe")
    worker = wine_runtime.windows_path(os.path.join(os.path.dirname(__file__), "worker.py"))
    seen: list[dict[str, str]] = []

    def command(spec_path: str) -> list[str]:
        return ["taskset", "-c", str(cpu), wine_runtime.wine_binary(), exe, worker,
                wine_runtime.windows_path(spec_path)]

    result = Platform(name="wine", command=command, env=bench_env(), pin=None,
                      before=stop_wineserver, after=stop_wineserver,
                      on_start=lambda pid: seen.append(placement()), cwd=RUNDIR)
    result.notes["placement_seen"] = seen
    return result


def wine_version() -> str:
    try:
        return subprocess.run([wine_runtime.wine_binary(), "--version"], check=False,
                              capture_output=True, text=True, env=bench_env()).stdout.strip()
    except OSError as exc:
        return f"unknown ({exc})"
