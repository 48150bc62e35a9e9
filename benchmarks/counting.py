"""Exact work per 1000 round trips, measured by a tool wrapped around a worker.

Used by syscalls.py (strace) and instructions.py (callgrind). A worker runs
exactly N round trips under the tool. Start-up (imports, the loop's
creation, the connection) costs the same whatever N is, so two runs with N1
and N2 round trips are subtracted, (reading(N2) - reading(N1)) /
(N2 - N1) * 1000, which leaves the steady state only.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Tuple

from .loops import CONTROLS
from .runner import RAW, Platform, run_worker

# Every ping-pong case, and connection churn (a "round trip" there is one
# connection: connect, one exchange, close): each repeats the same work, so
# N of them subtract cleanly. trio expresses the streams case only.
CASES = ["pingpong_streams", "pingpong_protocol", "pingpong_sock", "udp_pingpong", "churn"]
TRIO_CASES = {"pingpong_streams"}


def pairs(loops: List[str]) -> List[Tuple[str, str]]:
    """(case, loop) in the order they run; trio has no raw Protocol, and
    the A/A control would count what asyncio's row already counts."""
    return [(case, loop) for case in CASES for loop in loops
            if loop not in CONTROLS and (loop != "trio" or case in TRIO_CASES)]


def per_thousand(platform: Platform, tool: str, case: str, loop: str, counts: tuple,
                 wrap: Callable[[List[str], str], List[str]],
                 read: Callable[[str], Dict[str, float]]) -> dict:
    """{name: amount per 1000 round trips} from two runs, or {"error": ...}.

    ``wrap(argv, out_path)`` puts the tool around the worker's command line;
    ``read(out_path)`` turns the tool's output file into {name: amount}.
    """
    low, high = counts
    readings = []
    for n in (low, high):
        out = os.path.join(RAW, f"{tool}-{case}-{loop}-{n}.txt")
        records = run_worker(platform, f"{tool}-{case}-{loop}-{n}",
                             {"measurements": [{"case": case, "loop": loop}],
                              "cfg": {"count": n, "timeout": 600}},
                             timeout=900, wrap=lambda argv, out=out: wrap(argv, out))
        record = records[-1] if records else {"error": "no result"}
        if "error" in record:
            return {"error": record["error"]}
        try:
            readings.append(read(out))
        except (OSError, RuntimeError) as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
    scale = 1000.0 / (high - low)
    names = set(readings[0]) | set(readings[1])
    return {name: (readings[1].get(name, 0) - readings[0].get(name, 0)) * scale
            for name in names}
