"""The project's targets, checked against a results file.

The thresholds live in ``targets.json`` beside this file (one place, read
here only); this module holds how each is measured: a row per target with
the figure and whether it is met, for run.py's summary lines and the
page's table (report.py).
"""
from __future__ import annotations

import json
import os

from .kernel_calls import CASES as KERNEL_CALL_CASES
from .loops import CONTROLS, OURS, REFERENCES
from .present import (
    PLATFORM_NAMES,
    control_band,
    fmt_bytes,
    fmt_ratio,
    fmt_stats,
    inner_band,
    label,
)
from .runner import IDLE_SIZES, TIMED_CASES

TARGETS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets.json")


def load(path: str = TARGETS_FILE) -> dict[str, dict]:
    """targets.json: {target: {threshold..., "why": text}}."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def rows(results: dict, goals: dict[str, dict] | None = None) -> list[dict]:
    """Each target with its measured figure and whether it is met:
    [{"platform", "target", "figure", "met"}]."""
    goals = goals or load()
    answer: list[dict] = []
    for name in ("linux", "wine", "windows"):
        section = results.get(name)
        if not section:
            continue
        platform = PLATFORM_NAMES[name]
        if name == "windows" and results["meta"].get("wine"):
            platform = "Windows (inside Wine)"
        ours_loops = section.get("ours", [])
        if not ours_loops and any(n in OURS for n in section.get("requested", [])):
            answer.append({"platform": platform, "target": "our loop measured",
                           "figure": "our loop was not available", "met": False})
        for ours in ours_loops:
            answer += _ratio_rows(section, ours, name, platform, goals)
            if name in goals["idle_scaling"]["platforms"]:
                answer += _idle_rows(section, ours, platform, goals)
        answer += _instruction_rows(section, platform, goals)
        answer += kernel_call_rows(section.get("kernel_calls"), platform, goals)
        answer += _memory_rows(section, platform)
    return answer


def lines(results: dict) -> list[str]:
    """One line per target, then the count met."""
    found = rows(results)
    text = [f"{'met' if r['met'] else 'NOT met'}: {r['platform']}: {r['target']}: {r['figure']}"
            for r in found]
    text.append(f"targets met: {sum(r['met'] for r in found)}/{len(found)}")
    return text


def _ratio_rows(section: dict, ours: str, name: str, platform: str,
                goals: dict) -> list[dict]:
    """Ours / each reference loop, per timed case."""
    found = []
    control = control_band(section)
    band = inner_band(control[2]) if control else None
    pingpong = goals["pingpong_ratio"]
    summary = section["summary"][ours]
    for ref in REFERENCES[name]:
        for case in TIMED_CASES:
            entry = summary.get(case)
            if not entry or ref not in entry["ratios"]:
                continue
            ratio = entry["ratios"][ref]
            mine = entry["loops"].get(ours, {})
            goal = (pingpong["min"] if name in pingpong["platforms"]
                    and case in pingpong["cases"] else goals["ratio_to_reference"]["min"])
            target = f"{label(ours)} / {label(ref)} >= {goal:.2f}x, {case}"
            if ratio["stats"]:
                s = ratio["stats"]
                figure = fmt_stats(s, fmt_ratio)
                if band and band[0] <= s["median"] < 1.0:
                    figure += (f" (a tie: inside this run's A/A band "
                               f"{band[0]:.2f}x-{band[1]:.2f}x)")
                found.append({"platform": platform, "target": target,
                              "figure": figure, "met": s["median"] >= goal})
            elif mine.get("error"):
                found.append({"platform": platform, "target": target,
                              "figure": f"ours failed: {mine['error']}", "met": False})
            elif ratio["peer_failed"]:
                found.append({"platform": platform, "target": target,
                              "figure": f"{label(ref)} failed: {ratio['peer_failed']}",
                              "met": True})
    return found


def _idle_rows(section: dict, ours: str, platform: str, goals: dict) -> list[dict]:
    """Rate with the most idle connections / rate with the fewest."""
    least = goals["idle_scaling"]["min"]
    scaling = section.get("idle_scaling", {}).get(ours)
    if not scaling:
        return []
    ok = scaling["ratio"] is not None and scaling["ratio"] >= least
    figure = (f"{scaling['ratio']:.2f}" if scaling["ratio"] is not None
              else f"failed: {scaling.get('error')}")
    return [{"platform": platform,
             "target": f"{label(ours)}: rate at {scaling.get('high', IDLE_SIZES[-1])} idle >= "
                       f"{least} x rate at {scaling.get('low', IDLE_SIZES[0])} idle",
             "figure": figure, "met": ok}]


def _instruction_rows(section: dict, platform: str, goals: dict) -> list[dict]:
    """Ours / asyncio, user-space instructions per round trip (callgrind)."""
    found = []
    goal = goals["instruction_share"]
    counts = section.get("instructions") or {}
    for case, per_loop in (counts.items() if isinstance(counts, dict) else ()):
        if not isinstance(per_loop, dict):
            continue
        theirs = (per_loop.get("asyncio") or {}).get("per_round_trip")
        for ours in section.get("ours", []):
            mine = (per_loop.get(ours) or {}).get("per_round_trip")
            if mine and theirs:
                share = mine / theirs
                if case in goal["cases"]:
                    bound, met = f"<= {goal['max']}", share <= goal["max"]
                else:
                    bound, met = f"< {goal['others_below']}", share < goal["others_below"]
                found.append({"platform": platform,
                              "target": f"{label(ours)} / asyncio user-space instructions "
                                        f"per round trip {bound}, {case}",
                              "figure": f"{share:.3f} ({mine:,.0f} / {theirs:,.0f})",
                              "met": met})
    return found


def _memory_rows(section: dict, platform: str) -> list[dict]:
    """Every loop's memory per idle connection measured (a figure, not a bound)."""
    memory = {r["loop"]: r for r in section.get("memory", []) if r.get("case") == "memory_streams"}
    if not memory:
        return []
    missing = [label(n) for n in section["usable"] if n not in CONTROLS and (
        n not in memory or ("value" not in memory[n] and "error" not in memory[n]))]
    return [{"platform": platform, "target": "memory per idle connection, each loop",
             "figure": "; ".join(f"{label(n)} {fmt_bytes(r.get('value'))}"
                                 if "value" in r else f"{label(n)} failed"
                                 for n, r in memory.items()),
             "met": not missing}]


def kernel_call_rows(data: dict | None, platform: str,
                     goals: dict[str, dict] | None = None) -> list[dict]:
    """Targets met or not, from the kernel-call counts (kernel_calls.py).

    - ``psn`` and ``afd``: exactly one call of the ProcessSocketNotifications
      function (the OS's, or the polyfill) per loop iteration.
    - ``afd``: the polyfill's NT calls per iteration at most its re-arm
      polls (IOCTL_AFD_POLL) per iteration plus one dequeue.
    """
    goals = goals or load()
    waits = goals["waits_per_iteration"]
    nt_calls = goals["afd_nt_calls_per_iteration"]
    found: list[dict] = []
    if not data or "cases" not in data:
        return found
    for case in KERNEL_CALL_CASES:
        for loop, result in data["cases"].get(case, {}).items():
            if loop not in OURS:
                continue
            backend = result.get("backend") or loop.partition("-")[2]
            if "error" in result:
                if backend in ("psn", "afd", ""):
                    found.append({"platform": platform,
                                  "target": f"{label(loop)}: kernel calls counted, {case}",
                                  "figure": f"failed: {result['error']}", "met": False})
                continue
            if backend not in ("psn", "afd") or "waits_per_iteration" not in result:
                continue
            per = result["waits_per_iteration"]
            found.append({"platform": platform,
                          "target": f"{label(loop)}: one ProcessSocketNotifications-function "
                                    f"call per loop iteration, {case}",
                          "figure": f"{per:.3f} per iteration ({result['counters']['waits']:.2f} "
                                    f"per round trip, {result['iterations']:.2f} iterations)",
                          "met": abs(per - waits["equals"]) <= waits["tolerance"]})
            if backend == "afd":
                nt = result["afd_nt_calls_per_iteration"]
                bound = result["afd_polls_per_iteration"] + nt_calls["max_over_polls"]
                found.append({"platform": platform,
                              "target": f"{label(loop)}: AFD polyfill NT calls per iteration "
                                        f"<= re-arm polls + 1 dequeue, {case}",
                              "figure": f"{nt:.2f} vs {bound:.2f} "
                                        f"({result['afd_polls_per_iteration']:.2f} polls + 1)",
                              "met": nt <= bound + nt_calls["tolerance"]})
    return found
