"""System calls per 1000 round trips, per loop (Linux, ``strace -c -f``).

What a readiness loop costs the kernel is mostly transitions: the wait
(epoll_wait), re-arming registrations (epoll_ctl), and the reads and
writes. Counting them shows what batching re-arms into the wait saves, and
where a backend still pays per re-arm (our epoll backend does one
epoll_ctl per re-arm: the figure says so). Start-up is subtracted out
(counting.py).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Dict, List

from . import counting
from .runner import Platform, Progress

LINE = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def ensure_strace() -> str:
    path = shutil.which("strace")
    if path:
        return path
    if os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-qq", "strace"],
                       env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"),
                       stdout=subprocess.DEVNULL)
    path = shutil.which("strace")
    if not path:
        raise RuntimeError("strace is not installed (apt-get install -y strace)")
    return path


def parse_summary(path: str) -> Dict[str, float]:
    """``strace -c`` table -> {syscall: calls}."""
    calls = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            match = LINE.match(line)
            if match and match.group(3) != "total":
                calls[match.group(3)] = int(match.group(1))
    return calls


def count(platform: Platform, loops: List[str], counts: tuple, progress: Progress) -> dict:
    """{case: {loop: {"total": n, "calls": {name: n}}}} per 1000 round trips."""
    strace = ensure_strace()
    answer: Dict[str, dict] = {}
    for case, loop in counting.pairs(loops):
        calls = counting.per_thousand(
            platform, "strace", case, loop, counts,
            wrap=lambda argv, out: [strace, "-f", "-c", "-o", out, "--", *argv],
            read=parse_summary)
        if "error" in calls:
            result = calls
        else:
            calls = {k: v for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v >= 0.5}
            result = {"total": sum(calls.values()), "calls": calls}
        progress.step(f"strace {case} {loop}",
                      {"value": result["total"], "unit": "syscalls/1000 round trips"}
                      if "total" in result else result)
        answer.setdefault(case, {})[loop] = result
    return answer
