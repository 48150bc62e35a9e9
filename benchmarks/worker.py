"""One benchmark process: run a list of measurements in order, print results.

    python benchmarks/worker.py SPEC.json

The orchestrator (runner.py) starts one worker per round, in Linux CPython
or in Windows CPython under Wine, and reads its stdout: one line
``RESULT {json}`` per measurement, in the order of the spec. A case that
raises is reported as ``{"error": "Type: message"}`` (WindowsSelectorEventLoop
past 512 sockets is a result, not a crash) and the worker goes on.

The spec (JSON): ``{"measurements": [{"case": ..., "loop": ...}, ...],
"cfg": {"warmup": s, "duration": s, "count": n|null, "connections": n,
"timeout": s}, "pin": cpu|null, "describe": [loop names]}``.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import cases
import loops


def prepare_process(pin):
    """Make this process a fair place to measure in.

    - Pin to one CPU (Linux; under Wine the orchestrator pins with taskset,
      wineserver included): client, server and loop share it, as they
      would in one real process, and migration noise goes away.
    - Raise RLIMIT_NOFILE: 5000 idle connections are 10000 descriptors.
    - Allocate and free one 4 MiB block, so glibc's dynamic mmap threshold
      rises above asyncio's 256 KiB read buffer now, instead of mmap/munmap
      on every read of the first case (benchmarking.md: 2-3x slow).
    """
    if pin is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {pin})
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, ValueError, OSError):
        pass
    block = bytearray(4 << 20)
    del block


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
        import trio_cases
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
            result = run_one(m["case"], m["loop"], spec["cfg"])
        except Exception as exc:
            result = {"error": describe_error(exc)}
        result.update(case=m["case"], loop=m["loop"], index=index,
                      wall=time.perf_counter() - started)
        emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
