"""How fast could any loop that keeps asyncio's transports be? (Linux)

The raw-Protocol ping-pong of cases.py, three ways, in interleaved rounds,
each in a fresh process pinned to one CPU:

- ``asyncio``: asyncio's own loop;
- ``ours``: socknotify_loop;
- ``ceiling``: asyncio's own transports and protocols, set up by asyncio's
  loop and then taken off it and driven by a bare ``select.epoll`` loop
  that calls each transport's ``_read_ready`` in a copied context: no
  ready queue, no handles, no timers, no clock. It makes the same system
  calls per round trip as both loops (two waits, two receives, two sends),
  so what separates it from asyncio is the whole of the loop's own cost.

A loop that keeps asyncio's transports cannot beat the ceiling; how far
each loop sits below it is its own cost. Usage::

    python -m benchmarks.ceiling [--rounds 5] [--seconds 2] [--cpu 0]

Prints round trips per second per round, then the medians and ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KINDS = ("asyncio", "ours", "ceiling")


def measure(kind: str, seconds: float) -> float:
    """Round trips per second of one kind, in this process."""
    import asyncio

    from . import cases
    block = bytearray(4 << 20)   # raise glibc's mmap threshold (see worker.py)
    del block
    if kind == "ours":
        import socknotify_loop
        loop = socknotify_loop.new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        if kind != "ceiling":
            result = loop.run_until_complete(
                cases.pingpong_protocol({"warmup": 0.3, "duration": seconds}))
            return float(result["value"])
        return _ceiling(loop, seconds)
    finally:
        loop.close()


def _ceiling(loop, seconds: float) -> float:
    """The ping-pong's transports, driven by a bare epoll loop."""
    import asyncio
    import contextvars
    import select
    import time

    from . import cases
    accepted = []

    class Echo(cases._EchoProtocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            accepted.append(transport)

    async def connect():
        server = await loop.create_server(Echo, cases.HOST, 0)
        port = server.sockets[0].getsockname()[1]
        counter = cases.Counter()
        client, _ = await loop.create_connection(
            lambda: cases._PingProtocol(counter), cases.HOST, port)
        while not accepted:
            await asyncio.sleep(0.001)
        return server, client, counter

    server, client, counter = loop.run_until_complete(connect())
    transports = (client, accepted[0])
    epoll = select.epoll()
    ready_of = {}
    for transport in transports:
        fd = transport._sock_fd
        loop._remove_reader(fd)          # asyncio's loop lets go of it
        epoll.register(fd, select.EPOLLIN)
        ready_of[fd] = transport._read_ready
    run = contextvars.copy_context().run
    poll = epoll.poll
    clock = time.perf_counter
    warm_until = clock() + 0.3
    while clock() < warm_until:
        for fd, _ in poll(-1):
            run(ready_of[fd])
    n0, t0 = counter.n, clock()
    end = t0 + seconds
    while True:
        for _ in range(1000):            # the clock, once per 1000 waits
            for fd, _ in poll(-1):
                run(ready_of[fd])
        if clock() >= end:
            break
    rate = (counter.n - n0) / (clock() - t0)
    epoll.close()
    for transport in transports:
        transport.abort()
    server.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--cpu", type=int, default=0)
    parser.add_argument("--one", choices=KINDS, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        print(json.dumps(measure(options.one, options.seconds)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    rates: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(options.rounds):
        order = KINDS[r % 3:] + KINDS[:r % 3]       # rotate who goes first
        for kind in order:
            out = subprocess.run(
                ["taskset", "-c", str(options.cpu), sys.executable, "-m", "benchmarks.ceiling",
                 "--one", kind, "--seconds", str(options.seconds)],
                check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout
            rates[kind].append(json.loads(out))
            print(f"round {r + 1}: {kind:8} {rates[kind][-1]:10,.0f} round trips/s")
    median = {kind: statistics.median(values) for kind, values in rates.items()}
    base = median["asyncio"]
    for kind in KINDS:
        print(f"{kind:8} median {median[kind]:10,.0f}  = {median[kind] / base:.2f}x asyncio")
    ours_cost = 1 / median["ours"] - 1 / median["ceiling"]
    asyncio_cost = 1 / base - 1 / median["ceiling"]
    print(f"loop's own time per round trip: ours {ours_cost * 1e6:.2f} us, "
          f"asyncio {asyncio_cost * 1e6:.2f} us ({ours_cost / asyncio_cost:.2f} of asyncio's)")


if __name__ == "__main__":
    main()
