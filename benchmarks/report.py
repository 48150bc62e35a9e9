"""docs/benchmarks.md from a results file: tables, targets, plots.

    python -m benchmarks.report benchmarks/results/<file>.json   # re-render

Every comparison on the page is a ratio between loops measured in the same
run on the same platform (runner.py pairs them per round); Wine figures are
compared with Wine figures only. The targets and whether they are met come
from targets.py (thresholds: targets.json).
"""
from __future__ import annotations

import json
import os
import sys

from . import targets
from .loops import CONTROLS, OURS, REFERENCES
from .present import (
    CASE_LABELS,
    control_band,
    first_summary,
    fmt_bytes,
    fmt_ratio,
    fmt_stats,
    inner_band,
    label,
)
from .runner import (
    IDLE_SIZES,
    MEMORY_CASES,
    ROOT,
    TIMED_CASES,
    measured_idle_sizes,
    paired_ratios,
    stats,
)

DOC = os.path.join(ROOT, "docs", "benchmarks.md")
#: a run made natively on Windows has its own page: it does not replace the
#: Linux + Wine one
DOC_WINDOWS = os.path.join(ROOT, "docs", "benchmarks-windows.md")
IMG = os.path.join(ROOT, "docs", "img")

CASES_TEXT = [
    ("Client and server run in the one process, on the loop under test, over TCP (UDP for "
     "the datagram case) on 127.0.0.1. A rate is counted over a measured window after a "
     "warm-up (the clock starts once every client is connected)."),
    "",
    ("- **ping-pong** (streams, raw Protocol, sock_sendall/sock_recv): one connection, the "
     "client sends 100 bytes and waits for the 100-byte echo; round trips per second."),
    "- **50 connections**: 50 stream ping-pongs at once; their round trips added up.",
    "- **1 MiB messages**: stream echo of 1 MiB messages; MiB echoed per second.",
    "- **UDP**: 100-byte datagram ping-pong (a lost datagram is resent after 50 ms).",
    "- **churn**: connect, one 100-byte exchange, close (server closes first); per second.",
    ("- **idle N**: stream ping-pong on one connection while N other connected sockets are "
     "registered with the loop, each with a stream reader waiting (their peers stay open "
     "and silent in a child process, so 10,000 idle connections fit the 20,000-descriptor "
     "limit). Under Wine the rounds stop at 5,000 idle (10,000 pairs took 20 s to open "
     "there and ran out of wineserver descriptors at 9,903), and Wine's idle scaling is "
     "shown, not judged (see below). WindowsSelectorEventLoop's failure past 512 sockets "
     "is a result."),
    ("- **memory**: 5000 connected sockets registered (streams + a waiting reader task, or "
     "`add_reader` alone), in a fresh process; the growth divided by 5000."),
    "- trio runs the cases it can express (no Protocol, sock_* or add_reader); '-' elsewhere.",
]
WINE_AFD_COST = (
    "Why AFD timings under Wine say nothing about Windows: Wine's wineserver re-scans "
    "every pending AFD poll on each socket event. Measured while developing these "
    "benchmarks (Wine 8.0): its `sock_poll_event` ran about 166 times per streams round "
    "trip for the AFD loop against 2 for ProactorEventLoop (Wine's server/sock.c walks "
    "one global poll list in `complete_async_polls` and `sock_get_poll_events`), and its "
    "CPU per round trip grows with idle sockets (85 µs at 0 idle, 1,170 µs at 3,000). "
    "On real Windows each NT call is one kernel transition and AFD keeps polls per "
    "endpoint. Under Wine, timings compare loops with each other only; count calls "
    "(the kernel-call table) to compare designs for Windows.")
WINE_IDLE_NOTE = (
    "Under Wine, a loop built on IOCTL_AFD_POLL (ours, afd) pays for every pending poll "
    "on every socket event: wineserver keeps all pending AFD polls in one global list "
    "(`poll_list` in Wine's server/sock.c) and `complete_async_polls` walks it whenever "
    "any socket signals. Proactor and winloop keep overlapped reads, which Wine queues "
    "per socket. This is a cost of Wine's AFD emulation, so this row says nothing about "
    "idle scaling on real Windows (measure there before drawing a conclusion).")
#: What each peer is and where it runs, read from the peers' own packages
#: (their wheels' metadata on the package index and their Python sources),
#: not measured: the measured rows are in the tables below.
PEERS_TEXT = [
    ("The loops users compare this one with. Each is measured where it installs; one "
     "that does not install here (no wheel for this Python or this system) is listed "
     "under \"Machine and run\" with pip's reason, not left out. What each offers on "
     "Windows is read from its own package, and not measured here:"),
    "",
    "| peer | what it is | Windows | `add_reader` on Windows | subprocesses | Pythons |",
    "| --- | --- | --- | --- | --- | --- |",
    ("| uvloop | asyncio's loop on libuv (Cython) | no wheels (winloop is its Windows fork) "
     "| - | yes (Linux, macOS) | CPython |"),
    ("| winloop | uvloop's Windows fork on libuv | wheels (measured in the Wine section) | yes, "
     "through libuv's poll handles (`winloop/loop.pyx`) | yes (`subprocess_exec` in "
     "`winloop/loop.pyx`) | CPython |"),
    ("| zuvloop | a loop on libuv written in Zig | `win_amd64` wheels | yes: its own "
     "self-pipe waits through `add_reader` on every system (`zuvloop/_base.py`) | yes, with a "
     "Windows branch of its own (`zuvloop/_process.py`) | CPython 3.14 and later only "
     "(its `Requires-Python`): measured in the CPython 3.14 and 3.15 section |"),
    ("| rloop | a loop written in Rust | no wheels; its classifiers name Linux and macOS "
     "| - | yes (a pidfd waited on with `add_reader`) | CPython 3.10+, PyPy; `start_tls`, "
     "`sendfile`, Unix sockets and `connect_accepted_socket` raise `NotImplementedError` "
     "(`rloop/loop.py`) |"),
    ("| veloxloop | a loop written in Rust | no wheels on the index (its classifier says "
     "\"OS Independent\") | - | not in its interface (`veloxloop/_veloxloop.pyi`) "
     "| CPython 3.11+ |"),
    ("| aiofastnet | not a loop: asyncio's transports and TLS in Cython/C, on any loop's "
     "`add_reader`/`add_writer` (`aiofastnet.loop_factory(base)`) | wheels | on "
     "`ProactorEventLoop` it falls back to asyncio's transports; on this loop it uses "
     "`add_reader` ([switching](switching.md#aiofastnet-compiled-transports)) | the base "
     "loop's (it hands Windows pipes back to the loop) | CPython 3.9-3.15, no PyPy |"),
    "",
    ("Whether a peer's own project runs CPython's asyncio test suites cannot be read from "
     "its package (none ships its tests in its wheel) and is not claimed here; this loop "
     "runs them on Linux and under Wine (`tests/conformance`)."),
]
HTTP_TEXT = (
    "An application on top: each loop serves HTTP on 127.0.0.1 from a server process "
    "pinned to one CPU while wrk, pinned to the other, keeps 50 connections busy "
    "(`benchmarks/httpbench.py`). uvicorn serves a small ASGI app answering every "
    "request with 13 bytes of plain text, aiohttp the same answer from a "
    "`web.Application`. Each figure is wrk's requests per second after a warm-up run; "
    "the ratio to asyncio is taken within a round and its median (min-max) reported. "
    "The A/A row (asyncio served again) is the noise of these rounds: a ratio inside it "
    "is a tie. A loop whose server failed, or for which wrk counted failed requests, "
    "shows the error instead of a rate.")

# -- tables ----------------------------------------------------------------------------

def control_line(section: dict) -> list[str]:
    """What the A/A control says about noise in this very run."""
    band = control_band(section)
    if not band:
        return []
    _control, reference, ratios = band
    low, high = inner_band(ratios)
    return [(f"Noise in this run: the A/A control ({label(reference)} measured again under "
            f"another name, in the same rounds) came out at {ratios[0]:.2f}x-{ratios[-1]:.2f}x "
            f"of {label(reference)} over {len(ratios)} paired figures, 80% of them within "
            f"{low:.2f}x-{high:.2f}x. A ratio inside that band is a tie."), ""]


def rate_table(section: dict, platform: str) -> list[str]:
    loops = section["usable"]
    summary = first_summary(section)
    ours_list = section.get("ours", [])
    refs = REFERENCES[platform]
    head = ["case", "unit"] + [label(n) for n in loops] + [
        f"{label(o)} / {label(r)}" for o in ours_list for r in refs]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case in TIMED_CASES:
        if case not in summary:
            continue
        entry = summary[case]
        unit = next((c["unit"] for c in entry["loops"].values() if c.get("unit")), "")
        cells = [CASE_LABELS.get(case, case), unit]
        for loop in loops:
            cell = entry["loops"].get(loop)
            if cell is None:
                cells.append("-")
            elif cell["stats"]:
                cells.append(fmt_stats(cell["stats"]))
            else:
                cells.append(f"failed: {cell['error']}" if cell["error"] else "-")
        for ours in ours_list:
            for ref in refs:
                ratio = section["summary"][ours][case]["ratios"].get(ref, {})
                if ratio.get("stats"):
                    s = ratio["stats"]
                    mark = "" if s["median"] >= 1.0 else " (below)"
                    cells.append(f"**{fmt_stats(s, fmt_ratio)}**{mark}")
                elif ratio.get("peer_failed"):
                    cells.append(f"{label(ref)} failed")
                else:
                    cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _verdict(median: float, band: tuple[float, float] | None) -> str:
    """Where a peer stands against ours, in the A/A band's terms."""
    low, high = band or (1.0, 1.0)
    if median > high:
        return "ahead"
    if median < low:
        return "behind"
    return "tie"


def peers_against_ours(section: dict, platform: str) -> list[str]:
    """Each other loop's rate over ours (the first of ours measured), paired
    within each round, per case; then one sentence per peer, written from
    those medians and the run's A/A band."""
    ours_list = [n for n in section.get("ours", []) if n in section.get("usable", [])]
    if not ours_list:
        return []
    ours = ours_list[0]
    summary = first_summary(section)
    peers = [n for n in section["usable"]
             if n not in OURS and n not in CONTROLS and n not in REFERENCES[platform]]
    if not peers:
        return []
    band_info = control_band(section)
    band = inner_band(band_info[2]) if band_info else None
    lines = [(f"Each peer's rate over that of {label(ours)}, taken within each round and "
              "its median (min-max) reported: above 1.00x the peer did more per second. '-': not "
              "measured, or one of the two failed (the table above says which)."), "",
             "| case | " + " | ".join(f"{label(p)} / {label(ours)}" for p in peers) + " |",
             "|" + " --- |" * (len(peers) + 1)]
    medians: dict = {p: {} for p in peers}
    for case in TIMED_CASES:
        cells = summary.get(case, {}).get("loops", {})
        if ours not in cells:
            continue
        row = [CASE_LABELS.get(case, case)]
        for peer in peers:
            figure = stats(paired_ratios((cells.get(peer) or {}).get("per_round", {}),
                                         cells[ours].get("per_round", {})))
            if figure is None:
                row.append("-")
                continue
            medians[peer][case] = figure["median"]
            row.append(fmt_stats(figure, fmt_ratio))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if band:
        lines += [(f"In words (a median inside the A/A band, {band[0]:.2f}x-{band[1]:.2f}x, "
                   "is a tie):"), ""]
    for peer in peers:
        if not medians[peer]:
            lines.append(f"- {label(peer)}: no case measured on both.")
            continue
        groups: dict = {"ahead": [], "tie": [], "behind": []}
        for median in medians[peer].values():
            groups[_verdict(median, band)].append(median)
        parts = []
        for verdict, words in (("ahead", "faster than this loop"), ("tie", "tied"),
                               ("behind", "slower")):
            found = sorted(groups[verdict])
            if found:
                span = (fmt_ratio(found[0]) if found[0] == found[-1]
                        else f"{fmt_ratio(found[0])}-{fmt_ratio(found[-1])}")
                cases = "case" if len(found) == 1 else "cases"
                parts.append(f"{words} in {len(found)} {cases} ({span} of its rate)")
        lines.append(f"- {label(peer)}: {', '.join(parts)} ({len(medians[peer])} "
                     "cases measured on both).")
    lines.append("")
    return lines


def http_table(section: dict) -> list[str]:
    """Requests per second under wrk, per server kind and loop, and the ratio
    to asyncio within each round."""
    data = section.get("http")
    if not data:
        return []
    if "error" in data:
        return [f"The HTTP case did not run: {data['error']}.", ""]
    settings = data.get("settings", {})
    lines = [HTTP_TEXT, "",
             f"Settings: {settings.get('wrk', '?')}; {settings.get('placement', '?')}; "
             f"rounds: {settings.get('rounds', '?')}.", ""]
    for case, entry in data.get("cases", {}).items():
        title = CASE_LABELS.get(case, case)
        if "error" in entry:
            lines += [f"{title}: not measured: {entry['error']}.", ""]
            continue
        if entry.get("http"):
            title += f" (uvicorn's `{entry['http']}` HTTP parser)"
        reference = entry.get("reference", "asyncio")
        lines += [f"**{title}**", "",
                  f"| loop | requests/s | / {label(reference)} |", "| --- | --- | --- |"]
        # The run's loop order (the results file keeps its keys sorted).
        order = [n for n in section.get("usable", []) if n in entry["loops"]]
        order += sorted(n for n in entry["loops"] if n not in order)
        for loop in order:
            cell = entry["loops"][loop]
            if cell.get("stats"):
                rate = fmt_stats(cell["stats"])
                ratio = (f"**{fmt_stats(cell['ratio'], fmt_ratio)}**" if cell.get("ratio")
                         else ("1.00x" if loop == reference else "-"))
            else:
                rate, ratio = f"failed: {cell.get('error') or 'no figure'}", "-"
            lines.append(f"| {label(loop)} | {rate} | {ratio} |")
        lines.append("")
    return lines


def idle_table(section: dict) -> list[str]:
    summary = first_summary(section)
    sizes = measured_idle_sizes(summary) or list(IDLE_SIZES)
    head = ["loop"] + [f"{n} idle" for n in sizes] + [f"{sizes[-1]} / {sizes[0]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for loop in section["usable"]:
        cells = [label(loop)]
        for n in sizes:
            cell = summary.get(f"idle_{n}", {}).get("loops", {}).get(loop)
            if not cell:
                cells.append("-")
            elif cell["stats"]:
                cells.append(fmt_stats(cell["stats"]))
            else:
                cells.append(f"failed: {cell['error']}")
        scaling = section.get("idle_scaling", {}).get(loop, {})
        cells.append(f"{scaling['ratio']:.2f}" if scaling.get("ratio") is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def memory_table(section: dict) -> list[str]:
    by_case = {}
    for record in section.get("memory", []):
        by_case.setdefault(record["case"], {})[record["loop"]] = record
    if not by_case:
        return []
    loops = [n for n in section["usable"] if n not in CONTROLS]
    head = ["registered as"] + [label(n) for n in loops]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case in MEMORY_CASES:
        if case not in by_case:
            continue
        cells = [CASE_LABELS[case]]
        for loop in loops:
            r = by_case[case].get(loop)
            if r is None or "skipped" in (r or {}):
                cells.append("-")
            elif "value" in r:
                cells.append(f"{fmt_bytes(r['value'])} (heap {fmt_bytes(r.get('traced'))})")
            else:
                cells.append(f"failed: {r.get('error')}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def syscall_table(section: dict) -> list[str]:
    data = section.get("syscalls")
    if not data:
        return []
    if "error" in data:
        return [f"System calls were not counted: {data['error']}."]
    lines = []
    for case, per_loop in in_case_order(data):
        lines += [f"**{CASE_LABELS.get(case, case)}**", "",
                  "| loop | total per 1000 round trips | largest contributors |",
                  "| --- | --- | --- |"]
        for loop in [name for name in section["usable"] if name in per_loop]:
            result = per_loop[loop]
            if "error" in result:
                lines.append(f"| {label(loop)} | failed: {result['error']} | |")
                continue
            top = ", ".join(f"{name} {count:,.0f}" for name, count in
                            largest_first(result["calls"])[:6])
            lines.append(f"| {label(loop)} | {result['total']:,.0f} | {top} |")
        lines.append("")
    lines += syscall_differences(data)
    return lines


def in_case_order(data: dict):
    """(case, value) in the order of TIMED_CASES (the JSON file sorts keys)."""
    order = {case: i for i, case in enumerate(TIMED_CASES)}
    return sorted(data.items(), key=lambda kv: order.get(kv[0], len(order)))


def largest_first(calls: dict):
    return sorted(calls.items(), key=lambda kv: -kv[1])


def instruction_table(section: dict) -> list[str]:
    data = section.get("instructions")
    if not data:
        return []
    if "error" in data:
        return [f"Instructions were not counted: {data['error']}.", ""]
    loops = [n for n in section["usable"] if any(n in per for per in data.values())]
    head = ["case"] + [label(n) for n in loops] + ["ours / asyncio"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case, per_loop in in_case_order(data):
        cells = [CASE_LABELS.get(case, case)]
        for loop in loops:
            r = per_loop.get(loop)
            cells.append("-" if r is None else f"{r['per_round_trip']:,.0f}"
                         if "per_round_trip" in r else f"failed: {r['error']}")
        mine, theirs = per_loop.get("socknotify", {}), per_loop.get("asyncio", {})
        if "per_round_trip" in mine and "per_round_trip" in theirs:
            share = mine['per_round_trip'] / theirs['per_round_trip']
            cells.append(f"{share:.2f}x the instructions")
        else:
            cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def fmt_calls(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def kernel_call_table(section: dict) -> list[str]:
    """Per round trip and per loop iteration, from the port's own counters."""
    data = section.get("kernel_calls")
    if not data or not data.get("cases"):
        return []
    results = [r for per in data["cases"].values() for r in per.values()]
    backends = {r.get("backend") for r in results if r.get("counters")}
    head = ["case", "loop (backend)", "iterations / round trip", "waits / round trip",
            "waits / iteration"]
    if "epoll" in backends:
        head += ["epoll_ctl / round trip", "eventfd writes + reads / round trip"]
    if backends & {"afd", "psn"}:
        head += ["changes submitted by the loop / iteration"]
    if "afd" in backends:
        head += ["AFD polyfill NT calls / round trip (polls + dequeues + cancels + posts)",
                 "AFD polyfill NT calls / iteration"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for case, per_loop in in_case_order(data["cases"]):
        for loop in [n for n in section["usable"] if n in per_loop]:
            r = per_loop[loop]
            name = label(loop)
            if "error" in r:
                lines.append(f"| {CASE_LABELS.get(case, case)} | {name} | failed: {r['error']} |"
                             + " |" * (len(head) - 3))
                continue
            c = r.get("counters")
            cells = [CASE_LABELS.get(case, case), name, fmt_calls(r.get("iterations")),
                     fmt_calls(c and c.get("waits")), fmt_calls(r.get("waits_per_iteration"))]
            if "epoll" in backends:
                epoll = c is not None and r.get("backend") == "epoll"
                cells += [fmt_calls(c["changes"]) if epoll else "-",
                          fmt_calls(c["wakes"] + c["drains"]) if epoll else "-"]
            if backends & {"afd", "psn"}:
                cells.append(fmt_calls(r.get("submitted_per_iteration"))
                             if r.get("backend") in ("afd", "psn") else "-")
            if "afd" in backends:
                afd = c is not None and r.get("backend") == "afd"
                cells += [(f"{r['afd_nt_calls']:.2f} ({c['afd_polls']:.2f} + "
                           f"{c['afd_dequeues']:.2f} + {c['afd_cancels']:.2f} + "
                           f"{c['afd_posts']:.2f})") if afd else "-",
                          fmt_calls(r.get("afd_nt_calls_per_iteration")) if afd else "-"]
            lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


KERNEL_CALLS_TEXT = [
    ("Counted by the port itself (`Port.counters()`), not timed: a worker runs exactly N1 "
     "and then N2 round trips on fresh loops and the difference is divided by N2 - N1, so "
     "start-up cancels out. An iteration is one call of the loop's `_run_once` (counted for "
     "asyncio's loops too; uvloop, winloop and trio have none). `waits` are epoll_wait on "
     "`epoll` and calls of the ProcessSocketNotifications function on `psn` (the OS's) and "
     "`afd` (the IOCTL_AFD_POLL polyfill that stands in for it): so under Wine the afd row's "
     "waits are exactly the calls the psn port code makes to the OS on Windows 11, and its "
     "NT calls (NtDeviceIoControlFile IOCTL_AFD_POLL, GetQueuedCompletionStatusEx, "
     "NtCancelIoFileEx, PostQueuedCompletionStatus) are what the polyfill costs on Windows "
     "10. The goal: one ProcessSocketNotifications-function call per iteration, and on afd "
     "no more NT calls per iteration than the polls it must resubmit (one IOCTL_AFD_POLL "
     "per socket re-armed) plus one dequeue. An iteration that has callbacks ready still "
     "makes its call, with a zero timeout; one with a timer pending polls first and, if "
     "that finds nothing, makes a second call, the timed wait (so an idle loop's iteration "
     "can count two). \"Changes submitted\" are the registration "
     "changes the selector handed to that call, one per descriptor whose registration "
     "changed since the last (add_reader, remove_reader, ...); the "
     "re-arms of one-shot registrations are added by the C core inside the same call, and "
     "on afd each one that needs a new poll is an IOCTL_AFD_POLL. These counts leave out "
     "the loop's own send/recv."),
]
WINE_CALLS_BEFORE = (
    "For comparison, counted under Wine 8 before the port counted its own calls "
    "(`WINEDEBUG=+relay`, every `ntdll.Nt*` call of the process): per streams round trip "
    "the AFD loop made 10 NT calls -- 6 NtDeviceIoControlFile, some of them Wine's own "
    "send/recv, and 4 NtRemoveIoCompletionEx -- and ProactorEventLoop 12 "
    "(WindowsSelectorEventLoop 8). Those totals include the socket reads and writes, "
    "which the table above leaves out.")


def calls_then_and_now(section: dict) -> str:
    """The afd streams row made comparable with the earlier whole-process count."""
    cases = (section.get("kernel_calls") or {}).get("cases", {})
    r = cases.get("pingpong_streams", {}).get("socknotify-afd", {})
    if "afd_nt_calls" not in r:
        return ""
    return (f" Now: the polyfill's {r['afd_nt_calls']:.2f} NT calls per streams round trip "
            f"above, plus the round trip's 2 sends and 2 receives (each one "
            f"NtDeviceIoControlFile in Wine), make {r['afd_nt_calls'] + 4:.2f}.")


def syscall_differences(data: dict) -> list[str]:
    """Where ours differs from asyncio's default loop, call by call."""
    lines = []
    for case, per_loop in in_case_order(data):
        mine, theirs = per_loop.get("socknotify", {}), per_loop.get("asyncio", {})
        if "calls" not in mine or "calls" not in theirs:
            continue
        names = set(mine["calls"]) | set(theirs["calls"])
        diffs = sorted(((mine["calls"].get(n, 0) - theirs["calls"].get(n, 0), n) for n in names),
                       reverse=True)
        words = [f"{d:+,.0f} {n}" for d, n in diffs if abs(d) >= 50]
        if words:
            lines.append(f"- {CASE_LABELS.get(case, case)}: ours minus asyncio, per 1000 round "
                         f"trips: {', '.join(words)}.")
    if lines:
        lines = ["Differences (from the tables above):", ""] + lines + [
            "", ("On Linux each re-arm is one `epoll_ctl` (the selector's registrations "
            "are one-shot in the kernel, so that an item orphaned by a closed descriptor fires "
            "at most once: docs/design.md says why and what it costs), so a ping-pong makes "
            "two system calls per round trip more than asyncio's loop. System calls cannot be "
            "counted this way under Wine, where strace "
            "sees wineserver traffic, not Windows kernel transitions."), ""]
    return lines


# -- page ------------------------------------------------------------------------------

def machine_lines(results: dict) -> list[str]:
    meta = results["meta"]
    linux = results.get("linux", {})
    wine = results.get("wine", {})
    windows = results.get("windows", {})
    versions = {}
    for section in (linux, wine, windows):
        for name, info in section.get("loops", {}).items():
            if info.get("available"):
                extra = f", backend {info['backend']}" if info.get("backend") else ""
                versions[name] = f"{info.get('version')}{extra}"
            else:
                versions[name] = f"unavailable: {info.get('error')}"
    rows = [
        ("date", meta["date"]),
        ("command", f"`{meta['command']}`"),
        ("run time", f"{meta['run_seconds'] / 60:.1f} min"),
        ("CPU", f"{meta['cpu']}, {meta['cpus']} CPUs (virtualised: {meta['virtualised']})"),
        ("OS, kernel", f"{meta['os']}, Linux {meta['kernel']}" if not windows
         else f"{meta['os']} {meta['kernel']}"),
        ("load average (1/5/15 min) at start / end",
         f"{meta['loadavg_start']} / {meta.get('loadavg_end', '?')}"),
    ]
    if windows:
        rows.append(("Windows Python", windows.get("process", {}).get("python", meta["python"])))
        if meta.get("wine"):
            rows.append(("run inside Wine", (f"yes, {meta['wine']}: these are not Windows "
                                            "figures")))
        rows.append(("Windows placement", windows.get("placement", "?")))
    else:
        rows.append(("Linux Python", linux.get("process", {}).get("python", meta["python"])))
    if wine:
        placement = wine.get("placement", {})
        rows += [("Wine", wine.get("wine_version", "?")),
                 ("Windows Python (under Wine)", wine.get("process", {}).get("python", "?")),
                 ("Wine placement", (f"{placement.get('taskset')}; observed affinity "
                  f"{placement.get('observed')}; same in every process: "
                  f"{placement.get('consistent')}"))]
    if linux:
        rows.append(("Linux placement", linux.get("placement", "?")))
    rows += [(f"{label(name)}", v) for name, v in versions.items()]
    o = meta["options"]
    kernel = o.get("kernel_counts", ["?", "?"])
    per_figure = (f"{o['warmup']} s warm-up + {o['duration']} s measured per figure; "
                  f"{o['connections']} connections for memory; kernel calls at "
                  f"{kernel[0]} and {kernel[1]} round trips")
    if windows:
        rows.append(("settings", f"Windows {o['rounds']} rounds; {per_figure}"))
    else:
        rows.append(("settings", (f"Linux {o['rounds']} rounds, Wine {o['wine_rounds']} "
                                 f"rounds; {per_figure}; strace at {o['strace_counts'][0]} "
                                 f"and {o['strace_counts'][1]} round trips, callgrind at "
                                 f"{o.get('callgrind_counts', ['?', '?'])[0]} and "
                                 f"{o.get('callgrind_counts', ['?', '?'])[1]}")))
    return ["| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows]


def write(results: dict, results_path: str) -> str:
    from . import plots
    os.makedirs(IMG, exist_ok=True)
    images = plots.render(results, IMG)
    rows = targets.rows(results)
    met = sum(r["met"] for r in rows)
    out = [
        "# Benchmarks",
        "",
        ("Generated by `python benchmarks/run.py` from "
        f"`{results_path}`; re-render with `python -m benchmarks.report {results_path}`."),
        "",
        "How to read it: every figure is the median over rounds, with the lowest and highest",
        "round in brackets. A round is one process that measures every loop once per case,",
        "the loops back to back and their order rotated each round; a ratio is taken inside",
        "each round (ours / peer, same process, seconds apart) and its median reported.",
        "Client and server live in one process pinned to one CPU. The same loop varies about",
        "+-15% from one process to the next on this machine, so a ratio within that band of",
        "1.0 is a tie, whatever side of 1.0 it falls. **Under Wine, timings compare loops",
        "with each other only:** every socket call goes through the user-space wineserver,",
        "so they say how the loops rank there, nothing about speed on real Windows, and",
        "least of all for an AFD-poll loop such as ours on afd.",
        "",
        WINE_AFD_COST,
        "",
        "## Machine and run",
        "",
        *machine_lines(results),
        "",
        f"## Targets ({met} of {len(rows)} met)",
        "",
        "| platform | target | figure (median, min-max over rounds) | met |",
        "| --- | --- | --- | --- |",
        *[f"| {r['platform']} | {r['target']} | {r['figure']} | {'yes' if r['met'] else '**no**'} |"
          for r in rows],
        "",
        ("Timing targets under Wine rank the loops inside Wine only (see above); the "
         "kernel-call targets are counts, and mean the same on every platform."),
        "",
    ]
    out += ["## Cases", "", *CASES_TEXT, ""]
    out += ["## The peers", "", *PEERS_TEXT, ""]
    windows_heading = "Windows (native)"
    if results["meta"].get("wine"):
        windows_heading += " -- run inside Wine, so these are Wine figures"
    for name, title, heading in (("linux", "Linux", "Linux"),
                                 ("wine", "Wine", "Wine (Windows CPython 3.11 under Wine)"),
                                 ("windows", "Windows", windows_heading)):
        section = results.get(name)
        if not section:
            continue
        rates = rate_table(section, name) if first_summary(section) else []
        out += [f"## {heading}", "", *control_line(section), *rates, ""]
        versus = peers_against_ours(section, name)
        if versus:
            out += [f"### Each peer against this loop, {title}", "", *versus]
        http = http_table(section)
        if http:
            out += [f"### HTTP servers under wrk, {title}", "", *http]
        if name in images.get("ratios", {}):
            out += [(f"![{title}: rate relative to {label(REFERENCES[name][0])}]"
                    f"(img/{images['ratios'][name]})"), ""]
        if any(f"idle_{n}" in first_summary(section) for n in IDLE_SIZES):
            out += [f"### Idle scaling, {title}", "",
                    ("One connection does stream ping-pong while N other connections sit "
                    "registered"), ("with the loop, each with a reader waiting. A loop whose "
                    "iteration costs"), ("O(registered) slows down; one whose cost is O(ready) "
                    "does not."), "", *idle_table(section), ""]
            if name == "wine" or (name == "windows" and results["meta"].get("wine")):
                out += [WINE_IDLE_NOTE, ""]
        mem = memory_table(section)
        if mem:
            out += [f"### Memory, {title}", "",
                    (f"Bytes per idle registered connection: RSS growth (tracemalloc's own "
                    f"bookkeeping removed) over {results['meta']['options']['connections']} "
                    "connections, in a fresh process per figure; in brackets the Python heap "
                    "alone (tracemalloc), which misses C allocations (libuv)."), "", *mem, ""]
        calls = kernel_call_table(section)
        if calls:
            out += [f"### Kernel calls per round trip, {title}", "", *KERNEL_CALLS_TEXT, "",
                    *calls]
            if name == "wine" or (name == "windows" and results["meta"].get("wine")):
                out += [WINE_CALLS_BEFORE + calls_then_and_now(section), ""]
            if images.get("calls", {}).get(name):
                out += [f"![kernel calls, {title}](img/{images['calls'][name]})", ""]
        ins = instruction_table(section)
        if ins:
            out += [f"### Instructions per round trip, {title}", "",
                    ("User-space instructions under `valgrind --tool=callgrind`, at two counts of "
                    "round trips, subtracted. Unlike the timings this does not move from run to "
                    "run, so it settles what a ratio near 1.0 cannot; it leaves out the kernel's "
                    "side (next table), cache misses and waiting."), "", *ins]
        sys_lines = syscall_table(section)
        if sys_lines:
            out += [f"### System calls per 1000 round trips, {title}", "",
                    ("`strace -c -f` on a worker doing exactly N round trips, at two N, "
                    "subtracted: start-up cancels out."), "", *sys_lines]
    if images.get("idle"):
        out += ["## Plots", "", f"![idle scaling](img/{images['idle']})", ""]
    if images.get("syscalls"):
        out += [f"![system calls](img/{images['syscalls']})", ""]
    if images.get("memory"):
        out += [f"![memory](img/{images['memory']})", ""]
    doc = DOC_WINDOWS if "windows" in results else DOC
    out += kept_sections(doc)
    with open(doc, "w", encoding="utf-8") as f:
        f.write("\n".join(out).rstrip() + "\n")
    return doc


#: Sections of the page that runs of their own write (between these
#: markers), carried over when a full run rewrites the page.
KEPT_REGISTRATION = ("<!-- registration: measured on its own, kept by report.py -->",
                     "<!-- /registration -->")
#: One loop per thread on free-threaded CPython (benchmarks/scaling.py).
KEPT_THREADS = ("<!-- threads: measured by benchmarks/scaling.py, kept by report.py -->",
                "<!-- /threads -->")


def kept_sections(doc: str) -> list:
    """The other Pythons' section (benchmarks/pythons.py writes it from
    runs of its own), the registration path's before/after figures and
    the one-loop-per-thread figures, carried over from the page being
    replaced."""
    from .pythons import BEGIN, END
    try:
        with open(doc, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    out: list = []
    for begin, end in ((BEGIN, END), KEPT_REGISTRATION, KEPT_THREADS):
        if begin in text and end in text:
            out += ["", *text[text.index(begin):text.index(end) + len(end)].splitlines()]
    return out


def main(argv) -> int:
    with open(argv[1], encoding="utf-8") as f:
        results = json.load(f)
    path = write(results, os.path.relpath(os.path.abspath(argv[1]), ROOT))
    print("\n".join(targets.lines(results)))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
