"""One benchmark process: run a list of measurements in order, print results.

    python benchmarks/worker.py SPEC.json

The orchestrator (runner.py) starts one worker per round, in Linux CPython
or in Windows CPython under Wine, and reads its stdout: one line
``RESULT {json}`` per measurement, in the order of the spec. A case that
raises is reported as ``{"error": "Type: message"}`` (WindowsSelectorEventLoop
past 512 sockets is a result, not a crash) and the worker goes on.

The spec (JSON): ``{"measurements": [{"case": ..., "loop": ...,
"kernel_calls": [n1, n2]|absent}, ...], "cfg": {"warmup": s, "duration": s,
"count": n|null, "connections": n, "timeout": s}, "pin": cpu|null,
"describe": [loop names]}``. A measurement with ``kernel_calls`` is not
timed: it counts loop iterations and the port's kernel calls (see
:func:`count_kernel_calls`).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

if __name__ == "__main__" and not __package__:
    # Run by path, as every worker is (``python benchmarks/worker.py SPEC``,
    # Windows CPython under Wine too): the package is imported from the
    # project root, put last on sys.path so that our package unpacked from
    # the wheel (PYTHONPATH) or installed still comes before the source tree.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.append(sys.path.pop(0))
    from benchmarks.worker import main
    sys.exit(main(sys.argv))

from . import cases, loops


def prepare_process(pin):
    """Make this process a fair place to measure in.

    - Pin to one CPU (Linux: sched_setaffinity; Windows:
      SetProcessAffinityMask; for a Linux-driven run under Wine the
      orchestrator pins with taskset, wineserver included): client, server
      and loop share it, as they would in one real process, and migration
      noise goes away.
    - Raise RLIMIT_NOFILE: the memory cases hold 5,000 socket pairs (10,000
      descriptors), the idle cases up to 10,000 connections.
    - Allocate and free one 4 MiB block, so glibc's dynamic mmap threshold
      rises above asyncio's 256 KiB read buffer now, instead of mmap/munmap
      on every read of the first case (measured: 2-3x slower).
    """
    if pin is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {pin})
    elif pin is not None and sys.platform == "win32":
        _pin_windows(pin)
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 65536:
            try:   # above the hard limit too where allowed (root)
                resource.setrlimit(resource.RLIMIT_NOFILE, (65536, max(hard, 65536)))
            except (ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    except (ImportError, ValueError, OSError):
        pass
    block = bytearray(4 << 20)
    del block


def _pin_windows(cpu: int) -> None:
    """SetProcessAffinityMask(GetCurrentProcess(), 1 << cpu); a refusal
    is reported on stderr, not fatal (the figures are still comparable
    with each other, only noisier)."""
    import ctypes
    from ctypes import wintypes
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.GetCurrentProcess.restype = wintypes.HANDLE
    kernel32.SetProcessAffinityMask.argtypes = [wintypes.HANDLE, ctypes.c_size_t]
    if not kernel32.SetProcessAffinityMask(kernel32.GetCurrentProcess(), 1 << cpu):
        sys.stderr.write(f"SetProcessAffinityMask(CPU {cpu}) failed: "
                         f"error {ctypes.get_last_error()}\n")


def case_and_cfg(name: str, base: dict):
    """``idle_1000`` is the idle case with 1000 idle connections."""
    cfg = dict(base)
    if name.startswith("idle_"):
        cfg["idle"] = int(name.split("_", 1)[1])
        return "idle", cfg
    return name, cfg


def run_one(case_name: str, loop_name: str, base_cfg: dict) -> dict:
    name, cfg = case_and_cfg(case_name, base_cfg)
    timeout = cfg.get("timeout", 120)
    if loop_name == "trio":
        import trio

        from . import trio_cases
        if name not in trio_cases.CASES:
            return {"skipped": "not expressible in trio"}

        async def bounded():
            with trio.fail_after(timeout):
                return await trio_cases.CASES[name](cfg)
        return trio.run(bounded)

    if name not in cases.CASES:
        raise ValueError(f"unknown case {case_name!r}")
    loop = loops.loop_factory(loop_name)()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(asyncio.wait_for(cases.CASES[name](cfg), timeout))
    finally:
        _close(loop)


def _counted_run(case_name: str, loop_name: str, count: int, timeout: float) -> dict:
    """Run ``count`` round trips of a case on a fresh loop; return how many
    loop iterations (``_run_once`` calls) it took, how many registration
    changes the loop handed to its waits, and the port's kernel-call
    counters (ours only), read before the loop is closed."""
    name, cfg = case_and_cfg(case_name, {"count": count, "timeout": timeout})
    loop = loops.loop_factory(loop_name)()
    iterations = [0]
    submitted = [0]
    run_once = loop._run_once

    def counted_run_once():
        iterations[0] += 1
        run_once()
    # run_forever looks _run_once up on the instance, so this counts every
    # iteration of this loop and of no other.
    loop._run_once = counted_run_once
    port = getattr(getattr(loop, "_selector", None), "port", None) \
        if loop_name in loops.OURS else None
    if port is not None:
        pack = port.pack_bound_changes

        def counted_pack(changes):
            submitted[0] += len(changes)
            pack(changes)
        # The changes a wait hands to the port (completion-port backends;
        # epoll applies each at once) are packed into its bound buffer.
        port.pack_bound_changes = counted_pack
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(asyncio.wait_for(cases.CASES[name](cfg), timeout))
        counters = port.counters() if port is not None else None
        backend = port.backend if port is not None else None
    finally:
        _close(loop)
    return {"iterations": iterations[0], "submitted": submitted[0], "counters": counters,
            "backend": backend}


def count_kernel_calls(case_name: str, loop_name: str, counts, timeout: float) -> dict:
    """Per round trip: loop iterations, and for ours the port's kernel calls
    by kind (``Port.counters()``) and the registration changes submitted.

    Two runs on fresh loops, ``counts[0]`` and ``counts[1]`` round trips;
    start-up and tear-down (imports, connect, close) cost the same in both,
    so (high - low) / (n2 - n1) is the steady state of one round trip.
    """
    low_n, high_n = counts
    low = _counted_run(case_name, loop_name, low_n, timeout)
    high = _counted_run(case_name, loop_name, high_n, timeout)
    span = float(high_n - low_n)
    result = {"round_trips": [low_n, high_n],
              "iterations": (high["iterations"] - low["iterations"]) / span}
    if high["counters"] is not None:
        result["backend"] = high["backend"]
        result["submitted"] = (high["submitted"] - low["submitted"]) / span
        result["counters"] = {name: (value - low["counters"].get(name, 0)) / span
                              for name, value in high["counters"].items()}
    return result


def _close(loop):
    """Close a loop even after it failed; leftovers are cancelled, not awaited
    forever (a loop whose select() raises cannot run them)."""
    try:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=5))
        loop.run_until_complete(loop.shutdown_asyncgens())
    except Exception:
        pass
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def describe_error(exc: BaseException) -> str:
    """'Type: message' of the first real error, not of its exception group."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


def emit(record: dict) -> None:
    sys.stdout.write("RESULT " + json.dumps(record) + "\n")
    sys.stdout.flush()


def main(argv) -> int:
    with open(argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    prepare_process(spec.get("pin"))
    for name in spec.get("describe", []):
        emit({"describe": name, **loops.describe(name)})
    if spec.get("describe"):
        emit({"process": {"pid": os.getpid(), "python": sys.version.split()[0],
                          "platform": sys.platform}})
    for index, m in enumerate(spec.get("measurements", [])):
        started = time.perf_counter()
        try:
            if m.get("kernel_calls"):
                result = count_kernel_calls(m["case"], m["loop"], m["kernel_calls"],
                                            spec["cfg"].get("timeout", 120))
            else:
                result = run_one(m["case"], m["loop"], spec["cfg"])
        except Exception as exc:
            result = {"error": describe_error(exc)}
        result.update(case=m["case"], loop=m["loop"], index=index,
                      wall=time.perf_counter() - started)
        emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
