"""The orchestrator: plan interleaved rounds, run workers, summarise.

A *round* is one worker process that measures every (case, loop) once, the
loops of one case back to back (A B C, A B C, ... case after case). Each
round starts the loop order one place further along (A B C, then B C A,
...) so no loop always runs first, right after a case's set-up. Several
rounds are several processes: the process-to-process spread (about +-15%
on Linux, measured here) lands in the min/max instead of in one lucky or
unlucky figure, and the median is reported.

A ratio is taken per round (ours / peer inside one process, minutes apart
at most), then the median and min/max of those ratios over the rounds.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import pyperf

from .loops import CONTROLS

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
RAW = os.path.join(RESULTS, "raw")

#: cases trio can express (see trio_cases.py); the others are skipped for it
TRIO_CASES = {"pingpong_streams", "concurrent_50", "large_1mib", "udp_pingpong",
              "churn", "memory_streams"}
IDLE_SIZES = (100, 1000, 5000, 10000)
# Under Wine: opening 10,000 socket pairs in the Windows Python took 20 s and
# stopped at 9,903 ("too many open files", wineserver's descriptors), so the
# Wine rounds stop at 5,000 idle.
WINE_IDLE_MAX = 5000
TIMED_CASES = ["pingpong_streams", "pingpong_protocol", "pingpong_sock", "concurrent_50",
               "large_1mib", "udp_pingpong", "churn"] + [f"idle_{n}" for n in IDLE_SIZES]
MEMORY_CASES = ["memory_streams", "memory_add_reader"]


def supports(loop: str, case: str) -> bool:
    """Whether a loop can express a case at all (else it is left out, '-').
    The A/A control runs the timed cases only: it is there to show noise."""
    if loop in CONTROLS:
        return case in TIMED_CASES
    if loop == "trio":
        return case in TRIO_CASES or case.startswith("idle_")
    return True


@dataclass
class Platform:
    """Where workers run: Linux CPython, Windows CPython under Wine driven
    from Linux, or Windows CPython natively (run.py run on Windows)."""
    name: str                                   # "linux", "wine" or "windows"
    command: Callable[[str], List[str]]         # spec path -> argv
    env: Dict[str, str]
    pin: Optional[int] = None                   # the worker pins itself (Linux, Windows)
    before: Callable[[], None] = lambda: None   # e.g. no wineserver lingering
    after: Callable[[], None] = lambda: None
    on_start: Callable[[int], None] = lambda pid: None   # e.g. record placement
    cwd: Optional[str] = None
    notes: Dict[str, object] = field(default_factory=dict)


class Progress:
    """One line per measurement on stderr: where we are, what it gave."""

    def __init__(self, total: int):
        self.total = total
        self.done = 0
        self.start = time.monotonic()

    def add(self, extra: int) -> None:
        self.total += extra

    def step(self, label: str, record: dict) -> None:
        self.done += 1
        self.line(label, record)

    def line(self, label: str, record: dict) -> None:
        elapsed = int(time.monotonic() - self.start)
        if "value" in record:
            outcome = f"{record['value']:>12,.1f} {record.get('unit', '')}"
        elif "error" in record:
            outcome = f"failed: {record['error'][:70]}"
        else:
            outcome = record.get("skipped", "")
        total = max(self.total, self.done)
        sys.stderr.write(f"[{self.done:>3}/{total} {elapsed // 60:>2}:{elapsed % 60:02}] "
                         f"{label:<44} {outcome}\n")
        sys.stderr.flush()


def write_spec(platform: Platform, tag: str, spec: dict) -> str:
    os.makedirs(RAW, exist_ok=True)
    path = os.path.join(RAW, f"spec-{platform.name}-{tag}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(spec, f)
    return path


def run_worker(platform: Platform, tag: str, spec: dict, timeout: float,
               on_record: Callable[[dict], None] = lambda r: None,
               wrap: Callable[[List[str]], List[str]] = lambda argv: argv) -> List[dict]:
    """Run one worker process; return its records (and stream them).

    A worker that hangs past ``timeout`` or dies is killed (its own process
    group only); the measurements it did not report come back as errors,
    and the run goes on with the next worker.
    """
    spec = dict(spec, pin=platform.pin)
    path = write_spec(platform, tag, spec)
    argv = wrap(platform.command(path))
    platform.before()
    stderr_path = os.path.join(RAW, f"stderr-{platform.name}-{tag}.txt")
    records: List[dict] = []
    with open(stderr_path, "wb") as stderr_file:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=platform.env, cwd=platform.cwd,
                                start_new_session=True)
        # Windows Python under Wine needs pipes for its output; drain stderr
        # to a file in a thread so a chatty worker cannot block on it.
        drain = threading.Thread(target=lambda: stderr_file.write(proc.stderr.read()),
                                 daemon=True)
        drain.start()
        hung: List[bool] = []

        def on_timeout():
            hung.append(True)
            _kill(proc)
        timer = threading.Timer(timeout, on_timeout)
        timer.start()
        started = False
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("RESULT "):
                    continue
                record = json.loads(line[len("RESULT "):])
                if not started:
                    started = True
                    platform.on_start(proc.pid)
                records.append(record)
                on_record(record)
            proc.wait()
        finally:
            timer.cancel()
            _kill(proc)
            drain.join(10)
            platform.after()
    reported = {r["index"] for r in records if "index" in r}
    for index, m in enumerate(spec.get("measurements", [])):
        if index not in reported:
            record = dict(m, index=index, error=_death(proc, timeout, stderr_path, bool(hung)))
            records.append(record)
            on_record(record)
    return records


def _kill(proc: subprocess.Popen) -> None:
    """End a worker: its process group on POSIX (a tool such as strace and
    the worker under it), the process itself on Windows."""
    if proc.poll() is None:
        try:
            if hasattr(os, "killpg"):
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()          # TerminateProcess
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()


def _death(proc, timeout, stderr_path, hung: bool) -> str:
    if hung:
        return f"worker killed after {timeout:.0f} s (hung)"
    try:
        with open(stderr_path, "rb") as f:
            tail = f.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    except OSError:
        tail = []
    return f"worker exited {proc.returncode}" + (f": {tail[0][:200]}" if tail else "")


def describe(platform: Platform, loop_names: List[str]) -> dict:
    """Versions and availability of the loops, asked of the platform's Python."""
    records = run_worker(platform, "describe", {"describe": loop_names, "measurements": []},
                         timeout=180)
    info = {"loops": {}, "process": {}}
    for record in records:
        if "describe" in record:
            info["loops"][record.pop("describe")] = record
        elif "process" in record:
            info["process"] = record["process"]
    for name in loop_names:
        info["loops"].setdefault(name, {"available": False, "error": "no answer from worker"})
    return info


def plan_round(cases: List[str], loops: List[str], round_index: int) -> List[dict]:
    shift = round_index % len(loops) if loops else 0
    order = loops[shift:] + loops[:shift]
    return [{"case": case, "loop": loop}
            for case in cases for loop in order if supports(loop, case)]


def timed_rounds(platform: Platform, cases: List[str], loops: List[str], rounds: int,
                 cfg: dict, progress: Progress) -> List[dict]:
    """All rounds of the timed cases on one platform; records carry 'round'."""
    results = []
    for r in range(rounds):
        measurements = plan_round(cases, loops, r)
        per = cfg["warmup"] + cfg["duration"]
        timeout = 120 + len(measurements) * (per + cfg.get("setup_allowance", 5))

        def show(record, r=r):
            progress.step(f"{platform.name} round {r + 1}/{rounds} {record['case']} "
                          f"{record['loop']}", record)
        records = run_worker(platform, f"round{r + 1}",
                             {"measurements": measurements, "cfg": cfg}, timeout, show)
        for record in records:
            if "case" in record:
                record["round"] = r
                results.append(record)
    return results


def memory_runs(platform: Platform, loops: List[str], cfg: dict, progress: Progress,
                cases: List[str] = MEMORY_CASES) -> List[dict]:
    """Each memory figure in a fresh process: a process that already ran
    other cases has free memory in its heap that hides new allocations."""
    results = []
    for case in cases:
        for loop in loops:
            if not supports(loop, case):
                continue
            records = run_worker(platform, f"{case}-{loop}",
                                 {"measurements": [{"case": case, "loop": loop}], "cfg": cfg},
                                 timeout=300)
            for record in records:
                progress.step(f"{platform.name} {case} {loop}", record)
                results.append(record)
    return results


# -- summaries ------------------------------------------------------------------------

def rounds_benchmark(name: str, values: List[float], unit: str = "integer",
                     metadata: Optional[dict] = None) -> pyperf.Benchmark:
    """One figure over the rounds as a pyperf benchmark: each round is one
    worker process, which is what pyperf calls a run (one value each)."""
    meta = dict(metadata or {}, name=name, unit=unit)
    return pyperf.Benchmark([pyperf.Run([v], metadata=meta, collect_metadata=False)
                             for v in values])


def stats(values: List[float]) -> Optional[dict]:
    """Median, mean and standard deviation (pyperf's), min, max, n of one
    figure over the rounds."""
    if not values:
        return None
    bench = rounds_benchmark("stats", values)
    return {"median": bench.median(), "mean": bench.mean(),
            "stdev": bench.stdev() if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "n": len(values)}


def paired_ratios(numerator: dict, denominator: dict) -> List[float]:
    """One loop's figure over another's, round by round ({round: value}
    each), for every round both measured: the pairing every ratio of the
    benchmarks uses."""
    return [numerator[r] / denominator[r] for r in numerator
            if r in denominator and denominator[r] > 0]


def summarise(records: List[dict], ours: str, references: List[str]) -> dict:
    """Per case and loop: median/min/max rate; per case: ratios of ours to
    each reference, paired within a round."""
    table: Dict[str, dict] = {}
    for record in records:
        cell = table.setdefault(record["case"], {}).setdefault(
            record["loop"], {"values": {}, "errors": [], "unit": None})
        if "value" in record and record["value"] > 0:
            cell["values"][record["round"]] = record["value"]
            cell["unit"] = record.get("unit")
        elif "value" in record:
            cell["errors"].append(f"no figure (value {record['value']})")
        elif "error" in record:
            cell["errors"].append(record["error"])
    summary = {}
    for case, per_loop in table.items():
        entry = {"loops": {}, "ratios": {}}
        for loop, cell in per_loop.items():
            entry["loops"][loop] = {"stats": stats(list(cell["values"].values())),
                                    "unit": cell["unit"],
                                    "error": cell["errors"][0] if cell["errors"] else None,
                                    "per_round": cell["values"]}
        mine = per_loop.get(ours, {}).get("values", {})
        for ref in references:
            theirs = per_loop.get(ref, {}).get("values", {})
            ratios = paired_ratios(mine, theirs)
            ref_errors = per_loop.get(ref, {}).get("errors", [])
            entry["ratios"][ref] = {
                "stats": stats(ratios),
                # a peer that cannot do the case at all: ours wins by default
                "peer_failed": ref_errors[0] if (ref_errors and not theirs) else None,
            }
        summary[case] = entry
    return summary


def measured_idle_sizes(summary: dict) -> List[int]:
    """The idle sizes a platform's summary has figures for (Wine stops at
    WINE_IDLE_MAX), smallest first."""
    return [n for n in IDLE_SIZES if f"idle_{n}" in summary]


def idle_scaling(summary: dict, loops: List[str]) -> dict:
    """rate at the most idle connections / rate at the fewest, per loop
    (median rates)."""
    measured = measured_idle_sizes(summary)
    if not measured:
        return {}
    low, high = f"idle_{measured[0]}", f"idle_{measured[-1]}"
    sizes = {"low": measured[0], "high": measured[-1]}
    answer = {}
    for loop in loops:
        a = summary.get(low, {}).get("loops", {}).get(loop, {})
        b = summary.get(high, {}).get("loops", {}).get(loop, {})
        if a.get("stats") and b.get("stats"):
            answer[loop] = {"ratio": b["stats"]["median"] / a["stats"]["median"], **sizes}
        elif a or b:
            answer[loop] = {"ratio": None, "error": b.get("error") or a.get("error"), **sizes}
    return answer
