#!/usr/bin/env python3
"""One loop per thread against one loop per process: requests per second.

    python -m tools.chroot run --py 3.14t --fresh --with wrk -- \\
        python benchmarks/scaling.py                 # on free-threaded 3.14
    python benchmarks/scaling.py --workers 1,2 --rounds 3 --duration 8

CPython's guidance for asyncio on the free-threaded build is one event
loop per thread. This measures what that buys: a minimal HTTP/1.1
keep-alive server (an asyncio Protocol answering every request with the
same small response) served by N workers, each a :class:`Loop` with its
own port and its own ``SO_REUSEPORT`` listener on one port number (the
kernel spreads the connections), either as N threads of one process or as
N processes; wrk (``apt-get install wrk``) drives it over loopback with
keep-alive connections and reports requests per second.

Configurations, interleaved round by round (noise on these machines is
+-15% from one process to the next: compare within a round): threads and
processes for each worker count, then the threads again with the GIL
forced on (``PYTHON_GIL=1``), which is what the same program gets on a
GIL build. Each configuration's server is a fresh child process (or N of
them), started, warmed up, measured, stopped. Prints one line per
measurement and a table of medians (min-max), and one JSON line; with
``--markdown`` the table as Markdown too. Not a test: nothing fails on a
figure.

On a two-core machine wrk shares the cores with the server, so the
figures for 2 workers are bounded by the client too; the machine's load
and the placement are printed with them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import sysconfig
import threading
from typing import Dict, List, Optional

if __name__ == "__main__" and not __package__:
    # Run by path: the project root last on sys.path, so an installed
    # socknotify_loop comes before the source tree (which has no core).
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nContent-Type: text/plain\r\n"
            b"\r\nHello, world!")
END = b"\r\n\r\n"


class _Http(asyncio.Protocol):
    """Answers each request (headers only, no body: wrk's GET) with RESPONSE;
    pipelined requests in one read get their answers in one write."""

    def __init__(self) -> None:
        self._pending = b""
        self._transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        data = self._pending + data
        count = data.count(END)
        if count:
            self._pending = data[data.rfind(END) + len(END):]
            assert self._transport is not None
            self._transport.write(RESPONSE * count)
        else:
            self._pending = data


def _listener(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _serve_one(port: int, started: threading.Barrier, stop: threading.Event) -> None:
    """One worker: its own loop (its own port), its own listener."""
    from socknotify_loop import Loop

    loop = Loop()
    try:
        server = loop.run_until_complete(loop.create_server(_Http, sock=_listener(port)))

        async def until_stopped() -> None:
            while not stop.is_set():
                await asyncio.sleep(0.1)

        started.wait(30)
        loop.run_until_complete(until_stopped())
        server.close()
        loop.run_until_complete(server.wait_closed())
    finally:
        loop.close()


def serve(port: int, threads: int) -> None:
    """A server process: ``threads`` workers, one loop each; runs until
    stdin closes. Prints ``ready`` and the GIL's state once listening."""
    started = threading.Barrier(threads + 1)
    stop = threading.Event()
    workers = [threading.Thread(target=_serve_one, args=(port, started, stop), daemon=True)
               for _ in range(threads)]
    for worker in workers:
        worker.start()
    started.wait(30)
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    print(f"ready gil={int(gil)}", flush=True)
    sys.stdin.read()          # the parent closes our stdin to stop us
    stop.set()
    for worker in workers:
        worker.join(10)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class _Server:
    """A configuration's server: one child with N threads, or N children."""

    def __init__(self, kind: str, workers: int, gil: Optional[str]) -> None:
        self.port = _free_port()
        env = dict(os.environ)
        env.pop("PYTHON_GIL", None)
        if gil is not None:
            env["PYTHON_GIL"] = gil
        per_child, children = (workers, 1) if kind == "threads" else (1, workers)
        command = [sys.executable, os.path.abspath(__file__), "--serve", str(self.port),
                   "--threads", str(per_child)]
        self.children = [subprocess.Popen(command, env=env, stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True)
                         for _ in range(children)]
        self.gil = []
        for child in self.children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if not line.startswith("ready"):
                self.stop()
                raise RuntimeError(f"server child did not start: {line!r}")
            self.gil.append(line.endswith("gil=1"))

    def stop(self) -> None:
        for child in self.children:
            if child.stdin is not None:
                child.stdin.close()
        for child in self.children:
            try:
                child.wait(15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _wrk(port: int, seconds: int, connections: int, threads: int) -> float:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s",
         f"http://127.0.0.1:{port}/"], capture_output=True, text=True, check=True,
        timeout=seconds + 60).stdout
    found = re.search(r"Requests/sec:\s*([\d.]+)", out)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    if found is None:
        raise RuntimeError(f"no Requests/sec in wrk's output:\n{out}")
    if errors:
        raise RuntimeError(f"wrk reported errors:\n{out}")
    return float(found.group(1))


def _loadavg() -> str:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def measure(workers: List[int], rounds: int, duration: int, warmup: int,
            connections: int, wrk_threads: int, gil_contrast: bool) -> Dict[str, object]:
    configs = []
    for n in workers:
        configs += [("threads", n, None), ("processes", n, None)]
    if gil_contrast:
        configs += [("threads", n, "1") for n in workers if n > 1]
    figures: Dict[str, List[float]] = {}
    gil_seen: Dict[str, List[bool]] = {}
    for round_no in range(rounds):
        for kind, n, gil in configs:
            name = f"{n} {kind}" + (" (GIL on)" if gil == "1" else "")
            server = _Server(kind, n, gil)
            try:
                if warmup > 0:
                    _wrk(server.port, warmup, connections, wrk_threads)
                rps = _wrk(server.port, duration, connections, wrk_threads)
            finally:
                server.stop()
            figures.setdefault(name, []).append(rps)
            gil_seen.setdefault(name, []).extend(server.gil)
            print(f"round {round_no + 1}/{rounds}  {name:<20} {rps:10.0f} req/s  "
                  f"(load {_loadavg()})", file=sys.stderr, flush=True)
    return {"figures": figures, "gil": {k: any(v) for k, v in gil_seen.items()}}


def _table(result: Dict[str, object], markdown: bool) -> str:
    figures = result["figures"]
    gil = result["gil"]
    assert isinstance(figures, dict) and isinstance(gil, dict)
    base = {kind: statistics.median(figures[f"1 {kind}"])
            for kind in ("threads", "processes") if f"1 {kind}" in figures}
    rows = []
    for name, values in figures.items():
        median = statistics.median(values)
        kind = "processes" if "processes" in name else "threads"
        scale = median / base[kind] if kind in base else float("nan")
        rows.append((name, median, min(values), max(values), scale, gil[name]))
    if markdown:
        lines = ["| workers | requests/s (median) | min-max | vs 1 worker of its kind | GIL |",
                 "| --- | ---: | ---: | ---: | --- |"]
        lines += [f"| {n} | {m:,.0f} | {lo:,.0f}-{hi:,.0f} | {s:.2f}x | {'on' if g else 'off'} |"
                  for n, m, lo, hi, s, g in rows]
    else:
        lines = [f"{'workers':<20} {'req/s':>10} {'min':>10} {'max':>10} {'scale':>6}  GIL"]
        lines += [f"{n:<20} {m:10.0f} {lo:10.0f} {hi:10.0f} {s:5.2f}x  {'on' if g else 'off'}"
                  for n, m, lo, hi, s, g in rows]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2",
                        help="worker counts, comma-separated (default 1,2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=int, default=8, help="seconds measured (whole)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="seconds of load before each measurement (whole; 0: none)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument("--no-gil-contrast", action="store_true",
                        help="skip the threads with PYTHON_GIL=1")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.serve is not None:
        serve(options.serve, options.threads)
        return 0
    if shutil.which("wrk") is None:
        sys.exit("benchmarks/scaling.py needs wrk (apt-get install wrk)")
    workers = [int(n) for n in options.workers.split(",")]
    free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    print(f"Python {sys.version.split()[0]}{' free-threaded' if free_threaded else ''}, "
          f"{os.cpu_count()} CPUs, load {_loadavg()}", file=sys.stderr, flush=True)
    result = measure(workers, options.rounds, options.duration, options.warmup,
                     options.connections, options.wrk_threads,
                     free_threaded and not options.no_gil_contrast)
    result.update(python=sys.version.split()[0], free_threaded=free_threaded,
                  cpus=os.cpu_count(), load_after=_loadavg(),
                  settings=vars(options))
    print(json.dumps(result))
    print(_table(result, options.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
