"""A run's figures as pyperf files, one per platform and loop, for pyperf's
own tools:

    python -m pyperf stats benchmarks/results/raw/<stamp>-pyperf/linux-socknotify.json
    python -m pyperf compare_to --table \\
        benchmarks/results/raw/<stamp>-pyperf/linux-asyncio.json \\
        benchmarks/results/raw/<stamp>-pyperf/linux-socknotify.json
    python -m benchmarks.pyperf_files benchmarks/results/<file>.json   # for a kept run

One benchmark per case. A run per round (each round is one worker process,
as a pyperf run is), whose value is the time of one operation (1 / the
rate: pyperf's figures are times, lower is better); the memory cases, bytes
per connection, in files of their own (``linux-asyncio-memory.json``), as
pyperf adds a file's values up into a duration. The metadata are pyperf's own description of
the machine, taken by run.py (machine.py), with the worker's Python for the
Wine and Windows sections.

``compare_to`` tests whether two loops differ beyond their spread over the
rounds; the paired ratio per round (runner.summarise), ours and a peer
timed minutes apart in one process, is what the page reports.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Dict, List, Tuple

import pyperf

from .runner import RAW, rounds_benchmark

SECTIONS = ("linux", "wine", "windows")


def suites(name: str, section: dict, machine: dict) -> Dict[str, pyperf.BenchmarkSuite]:
    """{"<platform>-<loop>": suite} for one section of a results file."""
    # The moment run.py started (date, uptime, load, its own memory) is not
    # when a round ran: pyperf would take it for the runs' start.
    common = {k: v for k, v in machine.items()
              if k not in ("date", "uptime", "load_avg_1min", "runnable_threads",
                           "mem_max_rss")}
    common["platform_section"] = name
    python = section.get("process", {}).get("python")
    if python:     # the workers' Python (under Wine: the Windows CPython)
        common["python_version"] = python
    figures: Dict[str, Dict[str, List[Tuple[float, str, str]]]] = {}
    for record in section.get("records", []):
        if record.get("value", 0) > 0:
            figures.setdefault(record["loop"], {}).setdefault(record["case"], []).append(
                (1.0 / record["value"], "second", f"1 / ({record.get('unit')})"))
    for record in section.get("memory", []):
        if record.get("value", 0) > 0:
            figures.setdefault(f"{record['loop']}-memory", {}).setdefault(
                record["case"], []).append((record["value"], "byte", str(record.get("unit"))))
    answer = {}
    for stem, per_case in figures.items():
        loop = stem[:-len("-memory")] if stem.endswith("-memory") else stem
        benchmarks = [rounds_benchmark(case, [v for v, _, _ in values], values[0][1],
                                       dict(common, loop=loop, figure=values[0][2]))
                      for case, values in per_case.items()]
        answer[f"{name}-{stem}"] = pyperf.BenchmarkSuite(benchmarks)
    return answer


def write(results: dict, folder: str) -> List[str]:
    """Every section's suites into ``folder``, replacing files of the same
    name; the paths written."""
    os.makedirs(folder, exist_ok=True)
    machine = results.get("meta", {}).get("pyperf", {})
    paths = []
    for name in SECTIONS:
        for stem, suite in suites(name, results.get(name) or {}, machine).items():
            path = os.path.join(folder, f"{stem}.json")
            suite.dump(path, replace=True)
            paths.append(path)
    return paths


def folder_for(results_path: str) -> str:
    """Where a results file's pyperf files go: beside the raw files."""
    stem = os.path.splitext(os.path.basename(results_path))[0]
    return os.path.join(RAW, f"{stem}-pyperf")


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        sys.stderr.write(f"usage: python -m benchmarks.pyperf_files RESULTS.json\n{__doc__}")
        return 2
    with open(argv[1], encoding="utf-8") as f:
        results = json.load(f)
    for path in write(results, folder_for(argv[1])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
