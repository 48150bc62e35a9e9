#!/usr/bin/env python3
"""Benchmark socknotify_loop against its peers, Linux and Wine, in one run.

    python benchmarks/run.py            # everything, ~12 minutes on 2 cores
    python benchmarks/run.py --quick    # smoke run, 2-3 minutes (no callgrind)
    python benchmarks/run.py --quick --cases pingpong_streams --loops asyncio

Linux: asyncio's default loop, uvloop, trio and ours, each worker pinned to
one CPU. Wine: Windows CPython 3.11 with ProactorEventLoop,
WindowsSelectorEventLoop, winloop and ours on each backend Wine offers,
python.exe and wineserver pinned to the same CPU. Every timed case runs
in interleaved rounds (runner.py); figures are medians with min/max, and
every comparison is a ratio between loops of the same run on the same
platform, never Wine against Linux. On every platform the port's own
kernel-call counters give calls per round trip and per loop iteration
(kernel_calls.py).

Run on Windows (``sys.platform == "win32"``), the same command measures
natively: ProactorEventLoop, WindowsSelectorEventLoop, winloop when
installed and ours on each backend (``psn``, ``afd``; one the machine lacks
is reported unavailable with the core's reason), with the same cases,
rounds, results file and a page of its own. Ours is the source tree, built in place
first (``pip install -e .``, which needs a C compiler), or with
``--installed`` whatever ``import socknotify_loop`` finds.

Writes benchmarks/results/<date>.json (smoke and partial runs, raw strace
and callgrind files, worker stderr: benchmarks/results/raw/, not committed),
and for a full run (not --quick, no --cases or --loops filter; or with
--report) docs/benchmarks.md and docs/img/bench_*.png (natively on Windows:
docs/benchmarks-windows.md and docs/img/bench_windows_*.png).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __name__ == "__main__" and not __package__:
    # Run by path (``python benchmarks/run.py``): the package is imported
    # from the project root, put last on sys.path so that with --installed
    # an installed socknotify_loop still comes before the source tree.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.append(sys.path.pop(0))
    from benchmarks.run import main
    sys.exit(main())

from . import (
    counting,
    httpbench,
    instructions,
    kernel_calls,
    machine,
    peers,
    pyperf_files,
    report,
    runner,
    syscalls,
    targets,
)
from .loops import LINUX_LOOPS, OURS, REFERENCES, WINDOWS_LOOPS, packages_of, uses_our_package
from .platforms import ensure_inplace_build, linux_platform, windows_platform
from .runner import MEMORY_CASES, RESULTS, ROOT, TIMED_CASES, Platform, Progress

WINDOWS = sys.platform == "win32"
#: the untimed measurements, asked for by name with --cases
COUNTED = ["kernel_calls", "syscalls", "instructions"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="short smoke run (fewer rounds, shorter windows)")
    parser.add_argument("--cases", default="",
                        help="comma-separated subset of: " + ", ".join(
                            TIMED_CASES + MEMORY_CASES + COUNTED + list(httpbench.CASES)))
    parser.add_argument("--loops", default="",
                        help="comma-separated subset of: " + ", ".join(LINUX_LOOPS + WINDOWS_LOOPS))
    parser.add_argument("--rounds", type=int,
                        help="Linux (or native Windows) rounds (default 5, quick 3)")
    parser.add_argument("--wine-rounds", type=int, help="Wine rounds (default 3, quick 2)")
    parser.add_argument("--duration", type=float, help="measured seconds per figure")
    parser.add_argument("--warmup", type=float, help="warm-up seconds per figure")
    parser.add_argument("--http-seconds", type=int,
                        help="wrk's measured seconds per HTTP figure (default 10, quick 2)")
    parser.add_argument("--http-warmup", type=int,
                        help="wrk's warm-up seconds per HTTP figure (default 2, quick 1)")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to pin to (default 0)")
    parser.add_argument("--no-linux", action="store_true")
    parser.add_argument("--no-wine", action="store_true")
    parser.add_argument("--no-install", action="store_true",
                        help="do not pip-install missing peers of peers.txt (they are then "
                             "reported unavailable)")
    parser.add_argument("--installed", action="store_true",
                        help="measure the installed socknotify_loop, not the source tree "
                             "(no in-place build)")
    parser.add_argument("--report", action="store_true",
                        help="write docs/benchmarks.md and plots even for a quick or filtered run")
    parser.add_argument("--output", help="results file (default results/<date>.json)")
    options = parser.parse_args(argv)
    quick = options.quick
    options.rounds = options.rounds or (3 if quick else 5)
    options.wine_rounds = options.wine_rounds or (2 if quick else 3)
    options.duration = options.duration or (0.3 if quick else 0.8)
    options.warmup = options.warmup or (0.1 if quick else 0.2)
    options.http_seconds = options.http_seconds or (2 if quick else 10)
    options.http_warmup = options.http_warmup if options.http_warmup is not None else (
        1 if quick else 2)
    options.connections = 2000 if quick else 5000
    options.strace_counts = (500, 2500) if quick else (1000, 6000)
    options.callgrind_counts = (200, 1200) if quick else (500, 3000)
    options.kernel_counts = (200, 1200) if quick else (1000, 6000)
    options.case_list = [c for c in options.cases.split(",") if c] or None
    options.loop_list = [c for c in options.loops.split(",") if c] or None
    options.filtered = bool(options.case_list or options.loop_list)
    return options


def wanted(options, names):
    keep = options.case_list
    return [n for n in names if keep is None or n in keep]


def wanted_loops(options, names):
    keep = options.loop_list
    return [n for n in names if keep is None or n in keep]


def log(message: str) -> None:
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def available(info: dict, loops):
    return [name for name in loops if info["loops"].get(name, {}).get("available")]


def run_platform(platform: Platform, loops, cases, rounds, cfg, options, progress,
                 installs=None) -> dict:
    """Describe the loops, then the timed rounds, then the memory figures.
    ``installs``: peers.ensure()'s outcome; a loop whose package pip could
    not install says so instead of the import error."""
    info = runner.describe(platform, loops)
    for name in loops:
        entry = info["loops"][name]
        failed = [(installs or {}).get(p, {}).get("error") for p in packages_of(name)]
        failed = [reason for reason in failed if reason]
        if not entry.get("available") and failed:
            entry["error"] = failed[0]
    usable = available(info, loops)
    for name in loops:
        if name not in usable:
            log(f"{platform.name}: {name} unavailable: {info['loops'][name].get('error')}")
    timed = [c for c in cases if c in TIMED_CASES]
    memory_cases = [c for c in cases if c in MEMORY_CASES]
    progress.add(sum(len(runner.plan_round(timed, usable, r)) for r in range(rounds)))
    progress.add(sum(1 for c in memory_cases for name in usable if runner.supports(name, c)))
    records = runner.timed_rounds(platform, timed, usable, rounds, cfg, progress) if timed else []
    mem_cfg = {"connections": options.connections, "timeout": 240}
    mem = runner.memory_runs(platform, usable, mem_cfg, progress, memory_cases)
    return {"loops": info["loops"], "process": info["process"], "usable": usable,
            "peer_installs": installs or {},
            "requested": loops, "cfg": cfg, "rounds": rounds, "records": records,
            "memory": mem}


def summarise(section: dict, references) -> None:
    ours = [name for name in section["usable"] if name in OURS]
    section["ours"] = ours
    section["summary"] = {}
    for mine in ours:
        section["summary"][mine] = runner.summarise(section["records"], mine, references)
    if not ours:   # peers only: still tabulate them
        section["summary"]["-"] = runner.summarise(section["records"], "-", references)
    any_summary = next(iter(section["summary"].values()))
    section["idle_scaling"] = runner.idle_scaling(any_summary, section["usable"])


def run_linux(options, cfg, progress) -> dict | None:
    """Linux: timed rounds, memory, then the exact counters (strace, callgrind)."""
    loops = wanted_loops(options, LINUX_LOOPS)
    cases = wanted(options, TIMED_CASES + MEMORY_CASES)
    asked = set(options.case_list or [])
    want_syscalls = options.case_list is None or "syscalls" in asked
    want_kernel_calls = wants_kernel_calls(options)
    # callgrind costs ~2 minutes: left out of --quick unless asked for by name.
    want_instructions = (options.case_list is None and not options.quick) \
        or "instructions" in asked
    http_cases = wanted(options, list(httpbench.CASES))
    if not loops or not (cases or want_syscalls or want_instructions or want_kernel_calls
                         or http_cases):
        return None
    if any(uses_our_package(name) for name in loops) and not options.installed:
        ensure_inplace_build(log)
    installs = None if options.no_install else peers.ensure(loops, log)
    platform = linux_platform(options.cpu, options.installed)
    log(f"Linux: loops {', '.join(loops)}; {options.rounds} rounds, "
        f"{options.warmup}+{options.duration} s per figure, pinned to CPU {options.cpu}")
    section = run_platform(platform, loops, cases, options.rounds,
                           dict(cfg, setup_allowance=3), options, progress, installs)
    section["placement"] = f"worker pinned to CPU {options.cpu} (os.sched_setaffinity)"
    if want_syscalls:
        progress.add(len(counting.pairs(section["usable"])))
        try:
            section["syscalls"] = syscalls.count(platform, section["usable"],
                                                 options.strace_counts, progress)
        except RuntimeError as exc:
            section["syscalls"] = {"error": str(exc)}
    if want_instructions:
        progress.add(len(counting.pairs(section["usable"])))
        section["instructions"] = instructions.count(platform, section["usable"],
                                                     options.callgrind_counts, progress)
    if want_kernel_calls:
        count_kernel_calls(platform, section, options, progress)
    if http_cases:
        log(f"HTTP: {', '.join(http_cases)} under wrk, {options.rounds} rounds")
        section["http"] = httpbench.run(http_cases, section["usable"], options.rounds,
                                        platform.env, options.cpu, options.http_seconds,
                                        options.http_warmup, log, progress)
    summarise(section, REFERENCES["linux"])
    return section


def wants_kernel_calls(options) -> bool:
    return options.case_list is None or "kernel_calls" in options.case_list


def count_kernel_calls(platform: Platform, section: dict, options, progress) -> None:
    progress.add(len(kernel_calls.pairs(section["usable"])))
    section["kernel_calls"] = kernel_calls.count(platform, section["usable"],
                                                 options.kernel_counts, progress)


def run_wine(options, cfg, progress) -> dict | None:
    """Windows CPython under Wine: the same rounds and memory figures."""
    loops = wanted_loops(options, WINDOWS_LOOPS)
    cases = [c for c in wanted(options, TIMED_CASES + MEMORY_CASES)
             if not (c.startswith("idle_") and int(c[5:]) > runner.WINE_IDLE_MAX)]
    want_kernel_calls = wants_kernel_calls(options)
    if not loops or not (cases or want_kernel_calls):
        return None
    from . import wine_side  # only now: it checks for (and may apt-get) Wine and mingw
    log("Wine: preparing Windows CPython, winloop and our win_amd64 wheel")
    notes = wine_side.prepare(log)
    if "wheel_error" in notes:
        # Never measure whatever copy of the package the Windows Python may
        # have installed from an earlier run under our name.
        loops = [name for name in loops if name not in OURS]
        if not loops:
            return None
    platform = wine_side.platform(options.cpu)
    log(f"Wine: loops {', '.join(loops)}; {options.wine_rounds} rounds, "
        f"python.exe and wineserver pinned to CPU {options.cpu}")
    section = run_platform(platform, loops, cases, options.wine_rounds,
                           dict(cfg, setup_allowance=20), options, progress)
    seen = platform.notes["placement_seen"]
    section["placement"] = {
        "taskset": f"taskset -c {options.cpu} wine python.exe (wineserver inherits it)",
        "observed": seen[0] if seen else {},
        "consistent": all(s == seen[0] for s in seen) if seen else False,
    }
    section["wine_version"] = wine_side.wine_version()
    section["notes"] = notes
    if want_kernel_calls:
        count_kernel_calls(platform, section, options, progress)
    summarise(section, REFERENCES["wine"])
    return section


def run_windows(options, cfg, progress) -> dict | None:
    """Natively on Windows: the loops of the Wine section, the same cases
    and rounds, and the kernel-call counts; no strace or callgrind."""
    loops = wanted_loops(options, WINDOWS_LOOPS)
    cases = wanted(options, TIMED_CASES + MEMORY_CASES)
    want_kernel_calls = wants_kernel_calls(options)
    if not loops or not (cases or want_kernel_calls):
        return None
    if any(name in OURS for name in loops) and not options.installed:
        ensure_inplace_build(log)
    platform = windows_platform(options.cpu, options.installed)
    log(f"Windows: loops {', '.join(loops)}; {options.rounds} rounds, "
        f"{options.warmup}+{options.duration} s per figure, pinned to CPU {options.cpu}")
    section = run_platform(platform, loops, cases, options.rounds,
                           dict(cfg, setup_allowance=5), options, progress)
    section["placement"] = f"worker pinned to CPU {options.cpu} (SetProcessAffinityMask)"
    if want_kernel_calls:
        count_kernel_calls(platform, section, options, progress)
    summarise(section, REFERENCES["windows"])
    return section


def main(argv=None) -> int:
    options = parse_args(argv)
    started = time.monotonic()
    meta = machine.describe()
    meta["command"] = " ".join(["python", "benchmarks/run.py", *(argv or sys.argv[1:])])
    meta["options"] = {k: getattr(options, k) for k in (
        "quick", "rounds", "wine_rounds", "duration", "warmup", "connections", "cpu",
        "installed", "http_seconds", "http_warmup")}
    meta["options"]["kernel_counts"] = list(options.kernel_counts)
    meta["options"]["strace_counts"] = list(options.strace_counts)
    meta["options"]["callgrind_counts"] = list(options.callgrind_counts)
    results = {"meta": meta}
    cfg = {"warmup": options.warmup, "duration": options.duration, "timeout": 240}
    progress = Progress(0)

    if WINDOWS:
        # Natively on Windows: no Linux side, and no Wine in between.
        section = run_windows(options, cfg, progress)
        if section:
            results["windows"] = section
    if not options.no_linux and not WINDOWS:
        section = run_linux(options, cfg, progress)
        if section:
            results["linux"] = section
    if not options.no_wine and not WINDOWS:
        section = run_wine(options, cfg, progress)
        if section:
            results["wine"] = section

    meta["run_seconds"] = time.monotonic() - started
    meta["loadavg_end"] = machine.loadavg()
    os.makedirs(RESULTS, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    # Only full runs are kept beside the page; smoke and partial runs go with
    # the raw files (not committed).
    if options.quick or options.filtered:
        suffix = ("-quick" if options.quick else "") + ("-partial" if options.filtered else "")
        output = os.path.join(runner.RAW, f"{stamp}{suffix}.json")
    else:
        output = os.path.join(RESULTS, f"{stamp}.json")
    output = options.output or output
    with open(output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    log(f"results: {os.path.relpath(output, ROOT)} ({meta['run_seconds']:.0f} s)")

    folder = pyperf_files.folder_for(output)
    if pyperf_files.write(results, folder):
        log(f"pyperf files: {os.path.relpath(folder, ROOT)} (python -m pyperf compare_to ...)")

    for line in targets.lines(results):
        log(line)
    # The page shows full runs only, unless asked (a smoke run would replace it).
    if not (options.filtered or options.quick) or options.report:
        page = report.write(results, os.path.relpath(output, ROOT))
        log(f"report: {os.path.relpath(page, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
