"""benchmarks/run.py's native Windows mode, run by the Windows Python under
Wine: a smoke that it runs end to end (Wine's timings mean nothing)."""
from __future__ import annotations

import json
import os
import time

from .config import CACHE, ROOT, log
from .lock import BENCH_NEEDS, install_locked
from .python import install_sitecustomize, pip_for_windows
from .runtime import stop_wineserver, windows_path, wine_python

#: A short smoke of benchmarks/run.py's native Windows mode (well under two
#: minutes under Wine): every Windows loop, two cases, one round, and the
#: kernel-call counts.
BENCH_SMOKE_ARGS = ["--quick", "--rounds", "1", "--warmup", "0.05", "--duration", "0.2",
                    "--cases", "pingpong_streams,pingpong_protocol,kernel_calls",
                    "--loops", "proactor,winselector,winloop,socknotify-psn,socknotify-afd"]


def check_bench(path: str) -> list:
    """What is wrong with a native-mode results file ([] when nothing):
    the run must have measured on the Windows side, ours on afd included."""
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
    except (OSError, ValueError) as exc:
        return [f"no results file {path}: {exc}"]
    section = results.get("windows")
    if not section:
        return ["the results have no native 'windows' section"]
    problems = []
    loops = section.get("loops", {})
    for name in ("proactor", "winselector", "socknotify-afd"):
        if not loops.get(name, {}).get("available"):
            problems.append(f"{name} unavailable: {loops.get(name, {}).get('error')}")
    psn = loops.get("socknotify-psn", {})
    if not psn.get("available") and not psn.get("error"):
        problems.append("socknotify-psn neither measured nor reported unavailable with a reason")
    measured = {(r["case"], r["loop"]) for r in section.get("records", []) if "value" in r}
    for name in ("proactor", "socknotify-afd"):
        if ("pingpong_streams", name) not in measured:
            problems.append(f"no pingpong_streams figure for {name}")
    calls = (section.get("kernel_calls") or {}).get("cases", {}).get("pingpong_streams", {})
    afd = calls.get("socknotify-afd", {})
    if not (afd.get("counters") or {}).get("waits"):
        problems.append(f"no kernel-call counts for socknotify-afd: {afd.get('error', afd)}")
    return problems


def run_bench(version: str, wheel: str, run_args) -> int:
    """benchmarks/run.py run BY the Windows Python, so its native Windows
    mode is what runs (Wine only provides the Windows). Our package is the
    cross-built wheel installed into that Python (--installed: there is no
    C compiler on the Windows side for an in-place build). Returns 1 if the
    run failed or its results lack a figure the mode must produce."""
    # run.py needs pyperf in the Python that runs it: here the Windows one.
    # LOCK pins it (benchmarks/requirements.txt's version) beside the tests'.
    install_locked(version, BENCH_NEEDS)
    pip_for_windows(version, ["--no-deps", "--force-reinstall", wheel])
    install_sitecustomize(version)
    rundir = os.path.join(CACHE, "run")
    os.makedirs(rundir, exist_ok=True)
    output = os.path.join(CACHE, "bench-native.json")
    if os.path.exists(output):
        os.remove(output)
    args = list(run_args) or BENCH_SMOKE_ARGS
    start = time.monotonic()
    try:
        proc = wine_python(version, [windows_path(os.path.join(ROOT, "benchmarks", "run.py")),
                                     "--installed", "--output", windows_path(output), *args],
                           check=False, cwd=rundir, timeout=900)
    finally:
        stop_wineserver(version)
    log(f"benchmarks/run.py under Wine (Python {version}) exited {proc.returncode} "
        f"after {time.monotonic() - start:.0f} s")
    problems = [f"run.py exited {proc.returncode}"] if proc.returncode else []
    problems += check_bench(output)
    for problem in problems:
        log(f"bench: {problem}")
    if not problems:
        log(f"bench: native Windows mode ran; results in {output}")
    return 1 if problems else 0
