"""How few instructions can a Protocol round trip take on this port? (Linux)

The raw-Protocol ping-pong of cases.py, counted under callgrind (user-space
instructions per round trip, two run lengths subtracted, as
instructions.py counts), four ways:

- ``asyncio`` and ``ours``: asyncio's loop and socknotify_loop, run as the
  benchmark's worker runs a case (inside ``asyncio.wait_for``, so with one
  timer pending all along);
- ``floor``: the same two protocol classes on the same port, driven by the
  least Python that can drive them: the selector's loop view waited on
  directly, the registration's data called as the whole dispatch, and a
  transport that is ``recv`` then ``data_received``, and ``send``. No
  handles, no contexts, no ready queue, no error handling, no timers;
- ``floor-timer``: the floor with one timer pending, honoured the least a
  loop can: a poll first, a timed wait only when it found nothing, and
  one clock reading per iteration to see whether the timer is due.

Both floors make the same system calls as the loop (a wait, a receive and
a send per message). A loop that keeps asyncio's guarantees cannot go
below ``floor-timer`` in the benchmark's case; the gap between it and
``ours`` is what those guarantees and the transports' checks cost. Usage::

    python -m benchmarks.floor [--counts 1000 3000]

Runs valgrind eight times (about a minute) and prints the table.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KINDS = ("asyncio", "ours", "floor", "floor-timer")
SUMMARY = re.compile(r"^(?:summary|totals):\s+(\d+)", re.M)


class _Done:
    """The part of a future that cases.Counter uses, for a loop-less run."""

    def __init__(self) -> None:
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, _value: object) -> None:
        self._done = True


class _BareTransport:
    """The two calls the ping-pong's protocols make of a transport, and
    the read the loop calls: nothing checked, nothing buffered."""

    def __init__(self, sock, protocol) -> None:
        self._sock = sock
        self._protocol = protocol
        protocol.connection_made(self)

    def read(self) -> None:
        data = self._sock.recv(65536)
        if data:
            self._protocol.data_received(data)

    def write(self, data: bytes) -> None:
        self._sock.send(data)


def _floor(count: int, timer: bool) -> None:
    import selectors
    import socket

    from socknotify_loop.selector import NotifySelector

    from . import cases

    listener = socket.socket()
    listener.bind((cases.HOST, 0))
    listener.listen(1)
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    for sock in (client, server):
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    selector = NotifySelector()
    counter = cases.Counter(count, _Done())
    echo = _BareTransport(server, cases._EchoProtocol())
    selector.register(server, selectors.EVENT_READ, echo.read)
    ping = _BareTransport(client, cases._PingProtocol(counter))  # sends the first message
    selector.register(client, selectors.EVENT_READ, ping.read)
    selector.begin_run()
    try:
        _drive(selector.loop_view, counter, timer)
    finally:
        selector.end_run()
        selector.close()
        client.close()
        server.close()


def _drive(view, counter, timer: bool) -> None:
    from socknotify_loop.selector import ONE_PAIR, TAG_SHIFT

    keys = view.keys
    port = view.port
    done = counter.done
    monotonic = time.monotonic
    deadline = monotonic() + 3600.0
    poll, block, wait = view.poll, view.block, view.wait
    while not done._done:
        if view.pending:
            got = view.flush(0 if timer else -1)
        elif timer:
            got = poll(port)
            if not got:
                got = wait(port, (deadline - monotonic()) * 1000.0)
        else:
            got = block(port)
        if timer and deadline <= monotonic():
            raise RuntimeError("the floor's timer is an hour away")
        if got > 0 and got & ONE_PAIR:
            keys[got >> TAG_SHIFT].data()
        elif got:
            values = view.answer(got)
            for i in range(0, len(values), 2):
                keys[values[i]].data()


def _loop(kind: str, count: int) -> None:
    import asyncio

    from . import cases
    if kind == "ours":
        import socknotify_loop
        loop = socknotify_loop.new_event_loop()
    else:
        loop = asyncio.SelectorEventLoop()
    try:
        loop.run_until_complete(asyncio.wait_for(
            cases.pingpong_protocol({"count": count, "timeout": 600}), 600))
    finally:
        loop.close()


def run_one(kind: str, count: int) -> None:
    """``count`` round trips of one kind, in this process."""
    block = bytearray(4 << 20)   # raise glibc's mmap threshold (see worker.py)
    del block
    if kind.startswith("floor"):
        _floor(count, timer=kind == "floor-timer")
    else:
        _loop(kind, count)


def count_instructions(kind: str, counts: tuple[int, int], valgrind: str) -> float:
    """User-space instructions per round trip of one kind."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            out = os.path.join(tmp, f"callgrind-{n}.out")
            subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}",
                            sys.executable, "-m", "benchmarks.floor", "--one", kind, str(n)],
                           check=True, capture_output=True, env=env, cwd=ROOT)
            with open(out, encoding="utf-8", errors="replace") as f:
                match = SUMMARY.search(f.read())
            if not match:
                raise RuntimeError(f"no instruction total in {out}")
            totals.append(int(match.group(1)))
    return (totals[1] - totals[0]) / (counts[1] - counts[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs=2, default=(1000, 3000))
    parser.add_argument("--one", nargs=2, metavar=("KIND", "N"), help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.one:
        kind, n = options.one
        if kind not in KINDS:
            parser.error(f"unknown kind {kind!r}")
        run_one(kind, int(n))
        return
    valgrind = shutil.which("valgrind")
    if not valgrind:
        sys.exit("valgrind is not installed (apt-get install -y valgrind)")
    low, high = options.counts
    if not 0 < low < high:
        parser.error("--counts wants two lengths, the shorter first")
    per_trip = {kind: count_instructions(kind, (low, high), valgrind) for kind in KINDS}
    base = per_trip["asyncio"]
    print(f"Python {sys.version.split()[0]}, instructions per Protocol round trip:")
    for kind in KINDS:
        print(f"  {kind:12} {per_trip[kind]:9,.0f}  {per_trip[kind] / base:.3f} of asyncio")


if __name__ == "__main__":
    main()
