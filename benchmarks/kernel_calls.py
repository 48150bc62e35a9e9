"""Kernel calls per round trip, from the C core's own counters.

Our port counts every kernel call it makes (``Port.counters()``): ``waits``
(epoll_wait, or calls of the ProcessSocketNotifications function -- the
OS's on ``psn``, the IOCTL_AFD_POLL polyfill standing in for it on
``afd``), ``changes`` (epoll_ctl), ``wakes``/``drains``, and on ``afd`` the
polyfill's own NT calls: ``afd_polls`` (NtDeviceIoControlFile
IOCTL_AFD_POLL), ``afd_cancels`` (NtCancelIoFileEx), ``afd_dequeues``
(GetQueuedCompletionStatusEx) and ``afd_posts`` (PostQueuedCompletionStatus).
The worker also counts loop iterations (``_run_once`` calls) and the
registration changes the loop hands to each wait, so a figure can be put
per iteration: the port code's goal is exactly one call of the
ProcessSocketNotifications function per iteration, and on ``afd`` no more
NT calls per iteration than the polls it must (re)submit -- one
IOCTL_AFD_POLL per socket to re-arm -- plus one dequeue: whatever else it
calls (a second dequeue, a cancel, a post) is overhead of the polyfill.

Unlike strace (syscalls.py), this works wherever the worker runs: Linux,
Windows CPython under Wine, and Windows itself. Under Wine the ``afd`` port
is the very code a Windows 10 machine runs, and its ``waits`` are the calls
the ``psn`` port code would make to the OS's function on Windows 11.

Start-up is subtracted out as in counting.py: two runs with N1 and N2
round trips, (N2 reading - N1 reading) / (N2 - N1). Peers that run a
Python ``_run_once`` (asyncio's loops) get their iterations counted too;
uvloop, winloop and trio have no such method and are left out.
"""
from __future__ import annotations

from .loops import CONTROLS, OURS
from .runner import Platform, Progress, run_worker

CASES = ["pingpong_streams", "pingpong_protocol", "pingpong_sock"]
#: loops whose iterations are a Python _run_once the worker can count
COUNTABLE = {"asyncio", "proactor", "winselector", *OURS}
AFD_NT_CALLS = ("afd_polls", "afd_dequeues", "afd_cancels", "afd_posts")


def pairs(loops: list[str]) -> list[tuple]:
    """(case, loop) in the order they run."""
    return [(case, loop) for case in CASES for loop in loops
            if loop in COUNTABLE and loop not in CONTROLS]


def derive(result: dict) -> dict:
    """The per-iteration figures of one worker result (in place)."""
    iterations = result.get("iterations") or 0
    counters = result.get("counters")
    if counters is None:
        return result
    nt_calls = sum(counters.get(name, 0.0) for name in AFD_NT_CALLS)
    result["afd_nt_calls"] = nt_calls
    if iterations > 0:
        result["waits_per_iteration"] = counters.get("waits", 0.0) / iterations
        result["submitted_per_iteration"] = result.get("submitted", 0.0) / iterations
        result["afd_polls_per_iteration"] = counters.get("afd_polls", 0.0) / iterations
        result["afd_nt_calls_per_iteration"] = nt_calls / iterations
    return result


def count(platform: Platform, loops: list[str], counts: tuple, progress: Progress,
          timeout: float = 600) -> dict:
    """{"counts": [n1, n2], "cases": {case: {loop: result}}} per round trip.

    One worker process runs every (case, loop) pair: under Wine each
    process costs seconds of start-up.
    """
    todo = pairs(loops)
    answer: dict[str, object] = {"counts": list(counts), "cases": {}}
    if not todo:
        return answer
    measurements = [{"case": case, "loop": loop, "kernel_calls": list(counts)}
                    for case, loop in todo]

    def show(record):
        shown = record
        if "iterations" in record:
            waits = (record.get("counters") or {}).get("waits")
            shown = {"value": record["iterations"], "unit": "iterations/round trip"
                     + (f", {waits:.2f} waits" if waits is not None else "")}
        progress.step(f"{platform.name} kernel calls {record['case']} {record['loop']}", shown)

    records = run_worker(platform, "kernel-calls",
                         {"measurements": measurements, "cfg": {"timeout": timeout}},
                         timeout=120 + 60 * len(measurements), on_record=show)
    cases: dict[str, dict] = answer["cases"]  # type: ignore[assignment]
    for record in records:
        if "case" not in record:
            continue
        result = {k: v for k, v in record.items() if k not in ("case", "loop", "index",
                                                                 "kernel_calls", "wall")}
        cases.setdefault(record["case"], {})[record["loop"]] = derive(result)
    return answer


def main(argv=None) -> int:
    """``python -m benchmarks.kernel_calls``: the counts alone, on this
    machine (Linux, or Windows natively), printed as JSON; run.py takes
    them with every other figure (``--cases kernel_calls``)."""
    import argparse
    import json
    import sys

    from .loops import LINUX_LOOPS, WINDOWS_LOOPS
    from .platforms import ensure_inplace_build, linux_platform, windows_platform

    windows = sys.platform == "win32"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loops", default="",
                        help="comma-separated subset of: "
                             + ", ".join(WINDOWS_LOOPS if windows else LINUX_LOOPS))
    parser.add_argument("--counts", default="200,1200",
                        help="the two round-trip counts subtracted (default 200,1200)")
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to pin to (default 0)")
    parser.add_argument("--installed", action="store_true",
                        help="count the installed socknotify_loop, not the source tree")
    options = parser.parse_args(argv)
    low, high = (int(n) for n in options.counts.split(","))
    if not 0 < low < high:
        parser.error("--counts needs two round-trip counts, the first smaller")
    loops = [n for n in options.loops.split(",") if n] or (
        WINDOWS_LOOPS if windows else LINUX_LOOPS)
    unknown = sorted(set(loops) - set(WINDOWS_LOOPS + LINUX_LOOPS))
    if unknown:
        parser.error(f"unknown loops: {', '.join(unknown)}")

    def log(message: str) -> None:
        sys.stderr.write(f"[kernel_calls] {message}\n")

    if not options.installed and any(name in OURS for name in loops):
        ensure_inplace_build(log)
    make = windows_platform if windows else linux_platform
    platform = make(options.cpu, options.installed)
    progress = Progress(len(pairs(loops)))
    answer = count(platform, loops, (low, high), progress)
    print(json.dumps(answer, indent=1, sort_keys=True))
    failed = [f"{case} {loop}" for case, per in answer["cases"].items()
              for loop, result in per.items() if "error" in result]
    for what in failed:
        log(f"failed: {what}")
    return 1 if failed or not answer["cases"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
