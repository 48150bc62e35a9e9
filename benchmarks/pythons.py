#!/usr/bin/env python3
"""The ping-pong figures on CPython 3.14 and 3.15, against that version's asyncio.

    python -m benchmarks.pythons                 # measure both, write the section
    python -m benchmarks.pythons --py 3.15       # one version
    python -m benchmarks.pythons --render benchmarks/results/pythons-*.json

The host has no CPython 3.14 or 3.15: tools/chroot.py's Debian sid chroot
does (the one tox's py314/py315 test in). For each version this installs
the project into that version's venv there (from a fresh copy of the
tracked files), with valgrind, and runs ``benchmarks/run.py`` on the
raw-Protocol and streams ping-pongs for asyncio, asyncio again (the A/A
control) and ours: short interleaved timing rounds, and user-space
instructions per round trip under callgrind for every ping-pong (500 and
3,000 round trips, subtracted: start-up cancels out). Each ratio is ours against the same version's
asyncio, measured in the same run; never across versions.

The results files land in benchmarks/results/pythons-<date>-<version>.json,
and the section "CPython 3.14 and 3.15" of docs/benchmarks.md (between its
markers, which report.py keeps when it rewrites the page) is written from
them.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import subprocess
import sys
from typing import List

from . import requirement

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- pythons: written by benchmarks/pythons.py -->"
END = "<!-- /pythons -->"
VERSIONS = ("3.14", "3.15")
CASES = ("pingpong_protocol", "pingpong_streams")
#: Counted under callgrind (benchmarks/counting.py counts every ping-pong).
COUNTED = CASES + ("udp_pingpong", "pingpong_sock")
LOOPS = "asyncio,asyncio-aa,socknotify"
#: the peers measured beside them, each where it installs (run.py's
#: peers.py installs them in the chroot's venv, one by one): zuvloop exists
#: for CPython 3.14 and later only, so this is where it is measured
PEER_LOOPS = "zuvloop,uvloop,aiofastnet-asyncio,aiofastnet-socknotify"


def measure(version: str, rounds: int, stamp: str) -> str:
    """Run benchmarks/run.py in the chroot on ``version``; the results file."""
    inside = f"/root/bench-{version}.json"
    bench = ["python", "benchmarks/run.py", "--no-wine", "--installed",
             "--loops", f"{LOOPS},{PEER_LOOPS}", "--cases", ",".join(CASES) + ",instructions",
             "--rounds", str(rounds), "--output", inside]
    # The chroot's venv has the test requirements; run.py needs pyperf too.
    script = f"pip install -q {shlex.quote(requirement('pyperf'))} && exec {shlex.join(bench)}"
    command = [sys.executable, "-m", "tools.chroot", "run", "--py", version, "--fresh",
               "--with", "valgrind", "--", "sh", "-c", script]
    print("$ " + " ".join(command), flush=True)
    subprocess.check_call(command, cwd=ROOT)
    tree = subprocess.run([sys.executable, "-m", "tools.chroot", "path"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout.strip()
    target = os.path.join(RESULTS, f"pythons-{stamp}-py{version.replace('.', '')}.json")
    shutil.copyfile(tree + inside, target)
    return target


def _instructions(linux: dict, case: str, loop: str) -> float:
    return float(linux["instructions"][case][loop]["per_round_trip"])


def _timing(linux: dict, case: str, peer: str) -> str:
    entry = linux.get("summary", {}).get("socknotify", {}).get(case, {})
    stats = entry.get("ratios", {}).get(peer, {}).get("stats")
    if not stats:
        return "not measured"
    return f"{stats['median']:.2f}x ({stats['min']:.2f}x-{stats['max']:.2f}x)"


def _control(linux: dict, case: str) -> str:
    """The A/A band: asyncio again against asyncio, round by round."""
    loops = linux.get("summary", {}).get("socknotify", {}).get(case, {}).get("loops", {})
    first = loops.get("asyncio", {}).get("per_round", {})
    again = loops.get("asyncio-aa", {}).get("per_round", {})
    ratios = [again[n] / first[n] for n in first if n in again and first[n]]
    if not ratios:
        return "-"
    return f"{min(ratios):.2f}x-{max(ratios):.2f}x"


def _peer_timing(linux: dict, case: str, peer: str) -> str:
    """The peer's rate over asyncio's, paired within each round."""
    loops = linux.get("summary", {}).get("socknotify", {}).get(case, {}).get("loops", {})
    mine = loops.get(peer, {}).get("per_round", {})
    theirs = loops.get("asyncio", {}).get("per_round", {})
    ratios = sorted(mine[n] / theirs[n] for n in mine if n in theirs and theirs[n])
    if not ratios:
        return "not measured"
    middle = ratios[len(ratios) // 2] if len(ratios) % 2 else (
        ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
    return f"{middle:.2f}x ({ratios[0]:.2f}x-{ratios[-1]:.2f}x)"


def peer_rows(version: str, linux: dict) -> List[str]:
    """One row per peer and counted case: its instructions per round trip
    against asyncio's and ours, its timing against asyncio; a peer that was
    unavailable on this version, once, with the reason."""
    rows = []
    for peer in PEER_LOOPS.split(","):
        info = linux.get("loops", {}).get(peer)
        if info is None:
            continue
        if not info.get("available"):
            rows.append(f"| {version} | {peer} | unavailable: {info.get('error')} | - | - | - |")
            continue
        for case in COUNTED:
            counted = linux.get("instructions", {}).get(case, {})
            if "per_round_trip" not in counted.get(peer, {}):
                continue
            theirs = _instructions(linux, case, peer)
            stock = _instructions(linux, case, "asyncio")
            ours = _instructions(linux, case, "socknotify")
            rows.append(f"| {version} | {peer}: {case} | {theirs:,.0f} | {theirs / stock:.3f} | "
                        f"{theirs / ours:.3f} | "
                        f"{_peer_timing(linux, case, peer) if case in CASES else 'not timed'} |")
    return rows


def section(paths: List[str]) -> List[str]:
    runs = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            runs.append((os.path.relpath(path, ROOT), json.load(f)))
    runs.sort(key=lambda run: tuple(int(x) for x in run[1]["meta"]["python"].split(".")[:2]))
    out = [BEGIN, "## CPython 3.14 and 3.15", "",
           "Measured by `python -m benchmarks.pythons` in the Debian sid chroot that "
           "tox's `py314` and `py315` test in (`tools/chroot.py`): each version's own "
           "asyncio against ours on the same version, same run. Instructions: "
           "user-space instructions per round trip under callgrind, two counts of round "
           "trips subtracted (the figure that does not move). Timings: interleaved "
           "rounds of 0.2 s warm-up and 0.8 s measured per figure, ours/asyncio "
           "throughput, median (min-max); the asyncio-again (A/A) band shows the noise "
           "of that run. On this 2-core machine that band is as wide as the differences "
           "measured, so the timings are indicative only; the instruction ratios settle "
           "the question.",
           "",
           "| Python | case | instructions, ours / asyncio | ratio | timing, ours / asyncio "
           "| A/A band |",
           "| --- | --- | --- | --- | --- | --- |"]
    for _, results in runs:
        linux = results["linux"]
        version = results["meta"]["python"]
        for case in COUNTED:
            ours = _instructions(linux, case, "socknotify")
            stock = _instructions(linux, case, "asyncio")
            timed = case in CASES
            out.append(f"| {version} | {case} | {ours:,.0f} / {stock:,.0f} | "
                       f"**{ours / stock:.3f}** | "
                       f"{_timing(linux, case, 'asyncio') if timed else 'not timed'} | "
                       f"{_control(linux, case) if timed else '-'} |")
    peers = [row for _, results in runs
             for row in peer_rows(results["meta"]["python"], results["linux"])]
    if peers:
        out += ["", "The peers on the same versions, in the same runs (zuvloop publishes for "
                "CPython 3.14 and later only, so it is measured here; a peer that did not "
                "install says why):", "",
                "| Python | peer: case | instructions per round trip | / asyncio | / ours "
                "| timing, peer / asyncio |",
                "| --- | --- | --- | --- | --- | --- |", *peers]
    out += ["", "Results files: " + ", ".join(f"`{name}`" for name, _ in runs) + ".",
            END]
    return out


def write(paths: List[str]) -> None:
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    block = "\n".join(section(paths))
    if BEGIN in text and END in text:
        head, _, rest = text.partition(BEGIN)
        _, _, tail = rest.partition(END)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    with open(DOC, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(DOC, ROOT)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--py", default=",".join(VERSIONS),
                        help="comma-separated, of " + ", ".join(VERSIONS))
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds (default 3)")
    parser.add_argument("--render", nargs="+", metavar="RESULTS",
                        help="only write the section from these results files")
    options = parser.parse_args(argv)
    if options.render:
        write(options.render)
        return 0
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    versions = [v for v in options.py.split(",") if v]
    unknown = sorted(set(versions) - set(VERSIONS))
    if unknown:
        parser.error(f"not in the chroot: {', '.join(unknown)}")
    write([measure(version, options.rounds, stamp) for version in versions])
    return 0


if __name__ == "__main__":
    sys.exit(main())
