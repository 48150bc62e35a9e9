"""User-space instructions per round trip, per loop (Linux, callgrind).

Timings move +-15% from one process to the next on these machines
(measured here); an instruction count under ``valgrind --tool=callgrind``
is repeatable to the instruction for the same work, so the ratio of ours
to asyncio here is the figure that does not move. It counts user space
only (the kernel's side is in syscalls.py), and nothing of cache misses or
waiting. Start-up is subtracted out (counting.py).
"""
from __future__ import annotations

import re
import shutil
from typing import Dict, List

from . import counting
from .runner import Platform, Progress

SUMMARY = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)


def read_total(path: str) -> Dict[str, float]:
    with open(path, encoding="utf-8", errors="replace") as f:
        match = SUMMARY.search(f.read())
    if not match:
        raise RuntimeError(f"no instruction total in {path}")
    return {"instructions": int(match.group(1))}


def count(platform: Platform, loops: List[str], counts: tuple, progress: Progress) -> dict:
    """{case: {loop: {"per_round_trip": n}}}."""
    valgrind = shutil.which("valgrind")
    if not valgrind:
        return {"error": "valgrind is not installed (apt-get install -y valgrind)"}
    answer: Dict[str, dict] = {}
    for case, loop in counting.pairs(loops):
        result = counting.per_thousand(
            platform, "callgrind", case, loop, counts,
            wrap=lambda argv, out: [valgrind, "--tool=callgrind", "--callgrind-out-file=" + out,
                                    *argv],
            read=read_total)
        if "error" not in result:
            result = {"per_round_trip": result["instructions"] / 1000.0}
        progress.step(f"callgrind {case} {loop}",
                      {"value": result["per_round_trip"], "unit": "instructions/round trip"}
                      if "per_round_trip" in result else result)
        answer.setdefault(case, {})[loop] = result
    return answer
