"""The application-level case: an HTTP server on each loop under wrk.

Two servers (httpserve.py): uvicorn serving a small ASGI app, and an
aiohttp application. For each server kind, round after round, every loop
in turn (the order rotated each round, as runner.py does) serves wrk's
requests: the server pinned to one CPU, wrk (Debian's ``wrk``, one thread,
50 connections) to another, a short warm-up run, then the measured one.
The figure is wrk's requests per second; each loop's ratio to asyncio is
taken within a round (the two servers minutes apart at most) and its median
and min/max reported, beside asyncio against itself (``asyncio-aa``), the
A/A band of the same rounds. A request wrk counts as an error (a socket
error or a non-2xx answer) makes the figure an error, not a rate.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

from .runner import HERE, RAW, ROOT, paired_ratios, stats

SERVER = os.path.join(HERE, "httpserve.py")
KINDS = ("uvicorn", "aiohttp")
CASES = tuple(f"http_{kind}" for kind in KINDS)
#: the module each server kind imports
MODULES = {"uvicorn": "uvicorn", "aiohttp": "aiohttp"}
CONNECTIONS = 50
READY_TIMEOUT = 30.0
#: loops that cannot serve an HTTP server of this kind (none known yet);
#: trio is not an asyncio loop
NOT_ASYNCIO = {"trio"}


def wrk_command(cpu: Optional[int], port: int, seconds: int, connections: int) -> List[str]:
    argv = [shutil.which("wrk") or "wrk", "-t1", f"-c{connections}", f"-d{seconds}s",
            f"http://127.0.0.1:{port}/"]
    taskset = shutil.which("taskset")
    return ([taskset, "-c", str(cpu)] + argv) if (cpu is not None and taskset) else argv


_RATE = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_SOCKET_ERRORS = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_REQUESTS = re.compile(r"^\s*(\d+) requests in", re.M)


def parse_wrk(output: str) -> dict:
    """{"value": requests/s, "requests": n} from wrk's report, or
    {"error": ...} when it found none or counted failed requests."""
    rate = _RATE.search(output)
    if not rate:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return {"error": f"wrk reported no rate: {tail[0][:200]}"}
    problems = []
    errors = _SOCKET_ERRORS.search(output)
    if errors and any(int(n) for n in errors.groups()):
        # a timeout is a request that took longer than wrk's 2 s: a loop
        # that stalls, not a rate
        problems.append("socket errors " + "/".join(errors.groups()) +
                        " (connect/read/write/timeout)")
    non_2xx = _NON_2XX.search(output)
    if non_2xx and int(non_2xx.group(1)):
        problems.append(f"{non_2xx.group(1)} non-2xx answers")
    if problems:
        return {"error": "wrk: " + "; ".join(problems)}
    requests = _REQUESTS.search(output)
    return {"value": float(rate.group(1)), "unit": "requests/s",
            "requests": int(requests.group(1)) if requests else None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(kind: str, loop: str, env: dict, pin: Optional[int]):
    """The server process and its port, once it printed READY; raises
    RuntimeError with its last words otherwise."""
    port = free_port()
    argv = [sys.executable, SERVER, kind, loop, str(port)] + ([str(pin)] if pin is not None
                                                            else [])
    os.makedirs(RAW, exist_ok=True)
    stderr = open(os.path.join(RAW, f"stderr-http-{kind}-{loop}.txt"), "wb")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=stderr, env=env, cwd=ROOT, start_new_session=True)
    stderr.close()
    deadline = time.monotonic() + READY_TIMEOUT
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(b"READY"):
            return proc, port, line.decode().split()[1]
        if not line and proc.poll() is not None:
            break
    stop_server(proc)
    with open(os.path.join(RAW, f"stderr-http-{kind}-{loop}.txt"), "rb") as f:
        tail = f.read().decode("utf-8", "replace").strip().splitlines()[-1:]
    raise RuntimeError(f"server did not start (exit {proc.returncode})"
                       + (f": {tail[0][:200]}" if tail else ""))


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


def measure(kind: str, loop: str, env: dict, pins, seconds: int, warmup: int,
            connections: int = CONNECTIONS,
            run: Callable = subprocess.run) -> dict:
    """One figure: start the server, warm up, measure, stop."""
    server_cpu, client_cpu = pins
    try:
        proc, port, served_by = start_server(kind, loop, env, server_cpu)
    except RuntimeError as exc:
        return {"error": str(exc)}
    try:
        if warmup:
            run(wrk_command(client_cpu, port, warmup, connections), capture_output=True,
                text=True, timeout=warmup + 60, check=False)
        done = run(wrk_command(client_cpu, port, seconds, connections), capture_output=True,
                   text=True, timeout=seconds + 60, check=False)
        record = parse_wrk(done.stdout + done.stderr)
        record["served_by"] = served_by
        return record
    except subprocess.TimeoutExpired:
        return {"error": "wrk did not finish"}
    finally:
        stop_server(proc)


def usable_for(kind: str, loops: List[str]) -> List[str]:
    return [name for name in loops if name not in NOT_ASYNCIO]


def run(cases: List[str], loops: List[str], rounds: int, env: dict, cpu: int,
        seconds: int, warmup: int, log: Callable[[str], None], progress=None) -> dict:
    """{"cases": {case: summary}, "settings": ..., or "error": ...}."""
    if not shutil.which("wrk"):
        return {"error": "wrk is not installed (apt-get install -y wrk)"}
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [cpu]
    client = next((c for c in cpus if c != cpu), None)
    pins = (cpu, client)
    answer: Dict[str, dict] = {"settings": {
        "wrk": f"wrk -t1 -c{CONNECTIONS}, {seconds} s measured after {warmup} s of warm-up",
        "placement": f"server pinned to CPU {cpu}, wrk to CPU {client}",
        "rounds": rounds}, "cases": {}}
    for case in cases:
        kind = case[len("http_"):]
        try:
            __import__(MODULES[kind])
        except ImportError as exc:
            answer["cases"][case] = {"error": f"{MODULES[kind]} is not installed ({exc})"}
            log(f"{case}: {answer['cases'][case]['error']}")
            continue
        names = usable_for(kind, loops)
        if progress is not None:
            progress.add(rounds * len(names))
        records = []
        for r in range(rounds):
            shift = r % len(names) if names else 0
            for loop in names[shift:] + names[:shift]:
                record = dict(measure(kind, loop, env, pins, seconds, warmup),
                              case=case, loop=loop, round=r)
                records.append(record)
                if progress is not None:
                    progress.step(f"http round {r + 1}/{rounds} {kind} {loop}", record)
        answer["cases"][case] = summarise(records, names)
        if kind == "uvicorn":
            answer["cases"][case]["http"] = _uvicorn_http()
    return answer


def _uvicorn_http() -> str:
    from .httpserve import uvicorn_http
    return uvicorn_http()


def summarise(records: List[dict], loops: List[str], reference: str = "asyncio") -> dict:
    """Per loop: requests/s over the rounds, and the per-round ratio to
    ``reference`` (median, min, max)."""
    per_loop: Dict[str, dict] = {name: {"values": {}, "errors": [], "served_by": None}
                                 for name in loops}
    for record in records:
        cell = per_loop.setdefault(record["loop"],
                                   {"values": {}, "errors": [], "served_by": None})
        if "value" in record:
            cell["values"][record["round"]] = record["value"]
            cell["served_by"] = record.get("served_by")
        else:
            cell["errors"].append(record.get("error", "no figure"))
    theirs = per_loop.get(reference, {}).get("values", {})
    out = {"loops": {}, "reference": reference}
    for name, cell in per_loop.items():
        mine = cell["values"]
        ratios = paired_ratios(mine, theirs)
        out["loops"][name] = {"stats": stats(list(mine.values())),
                              "ratio": stats(ratios) if name != reference else None,
                              "per_round": mine, "served_by": cell["served_by"],
                              "error": cell["errors"][0] if cell["errors"] else None}
    return out
