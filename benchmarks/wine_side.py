"""The Windows side: Windows CPython 3.11 under Wine, driven from Linux.

Reuses tools/wine.py for everything it already knows (the Windows Python,
the mingw-built win_amd64 wheel, the Wine environment) and adds what a
benchmark needs on top:

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
import os
import shutil
import subprocess
import sys
import zipfile
from typing import Dict, List, Optional

from runner import RAW, ROOT, Platform

sys.path.insert(0, os.path.join(ROOT, "tools"))
import wine as wine_tools  # noqa: E402  (tools/wine.py)

PY = "3.11"
BENCH_PREFIX = os.path.join(wine_tools.CACHE, "bench-prefix")
SITE = os.path.join(wine_tools.CACHE, "bench-site")
RUNDIR = os.path.join(wine_tools.CACHE, "bench-run")
PEER_PACKAGES = ["winloop==0.8.2", "cffi"]


def bench_env() -> Dict[str, str]:
    env = wine_tools.wine_env()
    env["WINEPREFIX"] = BENCH_PREFIX
    env["PYTHONPATH"] = wine_tools.windows_path(SITE)
    env.pop("SOCKNOTIFY_BACKEND", None)    # the worker sets it per loop
    return env


def wineserver() -> str:
    return shutil.which("wineserver") or "/usr/lib/wine/wineserver64"


def stop_wineserver() -> None:
    """Kill our prefix's wineserver and wait until it is gone."""
    env = bench_env()
    subprocess.run([wineserver(), "-k"], env=env, stderr=subprocess.DEVNULL)
    subprocess.run([wineserver(), "-w"], env=env, stderr=subprocess.DEVNULL)


def windows_python(args: List[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """Run the Windows Python once (set-up chores), output captured."""
    exe = os.path.join(wine_tools.python_dir(PY), "python.exe")
    try:
        return subprocess.run([wine_tools.wine_binary(), exe, *args], env=bench_env(),
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, cwd=RUNDIR)
    finally:
        stop_wineserver()


def prepare(log) -> Dict[str, object]:
    """Windows Python, peers and our wheel ready; returns notes for the report."""
    notes: Dict[str, object] = {}
    wine_tools.ensure_apt_packages()
    wine_tools.ensure_windows_python(PY)
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
            wheel = wine_tools.cmd_wheel(PY)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(SITE)
        notes["wheel"] = os.path.basename(wheel)
    except (Exception, SystemExit) as exc:   # the peers are still worth measuring
        notes["wheel_error"] = f"{type(exc).__name__}: {exc}"
        log(f"our win_amd64 wheel did not build ({notes['wheel_error'][:200]}); "
            f"see benchmarks/results/raw/wine-wheel-build.log: peers only")
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


def _proc_status(pid: int) -> Dict[str, str]:
    fields = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
    except OSError:
        pass
    return fields


def _prefix_of(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"WINEPREFIX="):
                    return item[len(b"WINEPREFIX="):].decode()
    except OSError:
        pass
    return None


def placement() -> Dict[str, str]:
    """CPU affinity of our python.exe and wineserver, read from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        status = _proc_status(int(entry))
        name = status.get("Name", "")
        # Debian's server is wineserver64; ours is told apart by its prefix.
        if (name.startswith("wineserver") or name == "python.exe") \
                and _prefix_of(int(entry)) == BENCH_PREFIX:
            found[name] = status.get("Cpus_allowed_list", "?")
    return found


def platform(cpu: int) -> Platform:
    """Workers as `taskset -c CPU wine python.exe worker.py SPEC`."""
    exe = os.path.join(wine_tools.python_dir(PY), "python.exe")
    worker = wine_tools.windows_path(os.path.join(os.path.dirname(__file__), "worker.py"))
    seen: List[Dict[str, str]] = []

    def command(spec_path: str) -> List[str]:
        return ["taskset", "-c", str(cpu), wine_tools.wine_binary(), exe, worker,
                wine_tools.windows_path(spec_path)]

    result = Platform(name="wine", command=command, env=bench_env(), pin=None,
                      before=stop_wineserver, after=stop_wineserver,
                      on_start=lambda pid: seen.append(placement()), cwd=RUNDIR)
    result.notes["placement_seen"] = seen
    return result


def wine_version() -> str:
    try:
        return subprocess.run([wine_tools.wine_binary(), "--version"], capture_output=True,
                              text=True, env=bench_env()).stdout.strip()
    except OSError as exc:
        return f"unknown ({exc})"
