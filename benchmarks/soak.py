#!/usr/bin/env python3
"""Soak run of socknotify_loop: many connections for a fixed time.

    python benchmarks/soak.py --seconds 30 --connections 10000

Not a timing benchmark: it looks for what only time and numbers expose.
``--connections`` clients (10,000 by default on Linux, 2,000 on Windows)
each hold one TCP loopback connection at a time to an echo server in the
same loop: connect, send random data in a few rounds with short pauses,
check every echoed byte, then end the connection with a graceful close or a
reset (SO_LINGER 0), and start over until the time is up. At the end every
socket is closed and the process's descriptors (Linux: /proc/self/fd;
Windows: GetProcessHandleCount) and resident memory are measured again.

Prints one JSON line (for scripts) and a short table. Exit status 1 if a
byte was wrong, an unexpected error occurred, or descriptors leaked. It
imports the installed package: install it first (``pip install .``).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import socket
import struct
import sys
import time

import socknotify_loop

WINDOWS = sys.platform == "win32"
CONNECT_CONCURRENCY = 256       # connects in flight at once (the listen backlog's share)
MAX_CHUNK = 16384


# -- process figures ------------------------------------------------------------


def open_descriptors() -> int:
    """Open descriptors (Linux) or handles (Windows) of this process."""
    if WINDOWS:
        import ctypes
        from ctypes import wintypes
        count = wintypes.DWORD()
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        # HANDLE-sized types: ctypes' default int would cut the pseudo
        # handle -1 to 32 bits, and the call would fail.
        kernel32.GetCurrentProcess.restype = wintypes.HANDLE
        kernel32.GetProcessHandleCount.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD)]
        if not kernel32.GetProcessHandleCount(kernel32.GetCurrentProcess(), ctypes.byref(count)):
            raise ctypes.WinError(ctypes.get_last_error())
        return count.value
    try:
        return len(os.listdir("/proc/self/fd"))
    except FileNotFoundError:    # not Linux: count what fstat accepts
        import resource
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        total = 0
        for fd in range(min(limit, 65536)):
            try:
                os.fstat(fd)
            except OSError:
                continue
            total += 1
        return total


def resident_bytes() -> int:
    """Resident set size in bytes: the benchmarks' own reading (cases.py,
    beside this file), working set on Windows."""
    from cases import rss_bytes
    return rss_bytes()


def raise_descriptor_limit(wanted: int) -> int:
    """Raise RLIMIT_NOFILE towards ``wanted``; returns the soft limit in force."""
    if WINDOWS:
        return wanted    # no such limit for sockets
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and wanted > hard:
        try:
            # Allowed as root (up to fs.nr_open); otherwise the hard limit holds.
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, wanted))
            hard = wanted
        except (ValueError, OSError):
            pass
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


# -- the run ----------------------------------------------------------------------


class Stats:
    def __init__(self) -> None:
        self.served = 0            # connections the server accepted
        self.sessions = 0          # client sessions completed and checked
        self.bytes_verified = 0
        self.mismatches = 0
        self.errors = 0            # unexpected exceptions
        self.error_samples: list = []
        self.connect_failures = 0
        self.resets = 0            # sessions ended with a reset
        self.server_resets_seen = 0
        self.open_now = 0
        self.peak_open = 0

    def error(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if len(self.error_samples) < 10:
            self.error_samples.append(f"{what}: {exc!r}")


class Echo(asyncio.Protocol):
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.stats.served += 1

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def connection_lost(self, exc) -> None:
        if exc is not None:
            # The client's resets, seen from here: expected.
            self.stats.server_resets_seen += 1


async def session(address, stats: Stats, rng: random.Random, connect_gate, deadline,
                  pause: float) -> None:
    async with connect_gate:
        try:
            reader, writer = await asyncio.open_connection(*address)
        except OSError as exc:
            stats.connect_failures += 1
            if len(stats.error_samples) < 10:
                stats.error_samples.append(f"connect: {exc!r}")
            await asyncio.sleep(0.05)
            return
    stats.open_now += 1
    stats.peak_open = max(stats.peak_open, stats.open_now)
    reset = rng.random() < 0.5
    try:
        for _ in range(rng.randint(1, 4)):
            payload = rng.randbytes(rng.randint(1, MAX_CHUNK))
            writer.write(payload)
            echoed = await reader.readexactly(len(payload))
            if echoed != payload:
                stats.mismatches += 1
            else:
                stats.bytes_verified += len(payload)
            if time.monotonic() > deadline:
                break
            # Idle between rounds: how long connections stay open, and so
            # how many are open at once.
            await asyncio.sleep(rng.uniform(0, pause))
        stats.sessions += 1
    except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
        stats.error("echo", exc)
    finally:
        stats.open_now -= 1
        if reset:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
            stats.resets += 1
        else:
            writer.close()
            try:
                await writer.wait_closed()
            except (ConnectionError, OSError):
                pass


async def client(address, stats, seed, connect_gate, deadline, pause) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        await session(address, stats, rng, connect_gate, deadline, pause)


async def soak(seconds: float, connections: int, seed: int, pause: float = 1.0) -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    server = await loop.create_server(lambda: Echo(stats), "127.0.0.1", 0, backlog=4096)
    address = server.sockets[0].getsockname()[:2]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    deadline = time.monotonic() + seconds
    tasks = [asyncio.ensure_future(client(address, stats, seed + n, gate, deadline, pause))
             for n in range(connections)]
    try:
        done = await asyncio.gather(*tasks, return_exceptions=True)
        for outcome in done:
            if isinstance(outcome, BaseException):
                stats.error("client", outcome)
    finally:
        server.close()
        await server.wait_closed()
    # Let the closing transports finish.
    await asyncio.sleep(0.2)
    return stats


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--connections", type=int, default=2000 if WINDOWS else 10000,
                        help="concurrent clients (default: 10000 on Linux, 2000 on Windows)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pause", type=float, default=1.0,
                        help="longest idle pause between a connection's rounds, s "
                             "(longer pauses keep more connections open at once)")
    options = parser.parse_args(argv)

    connections = options.connections
    # Two descriptors per connection (both ends live here) plus headroom.
    limit = raise_descriptor_limit(2 * connections + 256)
    note = ""
    if 2 * connections + 256 > limit:
        connections = max(1, (limit - 256) // 2)
        note = f"connections limited to {connections} by RLIMIT_NOFILE ({limit})"

    gc.collect()
    fds_before, rss_before = open_descriptors(), resident_bytes()
    loop = socknotify_loop.new_event_loop()
    backend = loop.backend
    started = time.monotonic()
    try:
        stats = loop.run_until_complete(soak(options.seconds, connections, options.seed,
                                             options.pause))
    finally:
        loop.close()
    elapsed = time.monotonic() - started
    gc.collect()
    fds_after, rss_after = open_descriptors(), resident_bytes()

    result = {
        "backend": backend, "platform": sys.platform, "python": sys.version.split()[0],
        "seconds": round(elapsed, 2), "connections": connections,
        "connections_served": stats.served, "sessions_completed": stats.sessions,
        "bytes_verified": stats.bytes_verified, "mismatches": stats.mismatches,
        "errors": stats.errors, "connect_failures": stats.connect_failures,
        "resets": stats.resets, "server_resets_seen": stats.server_resets_seen,
        "peak_open_connections": stats.peak_open,
        "fds_before": fds_before, "fds_after": fds_after,
        "rss_before": rss_before, "rss_after": rss_after,
        "error_samples": stats.error_samples, "note": note,
    }
    print(json.dumps(result))
    rows = [
        ("backend", backend), ("seconds", f"{elapsed:.1f}"),
        ("connections (concurrent clients)", connections),
        ("peak open connections", stats.peak_open),
        ("connections served", stats.served), ("sessions completed", stats.sessions),
        ("bytes verified", f"{stats.bytes_verified:,}"),
        ("mismatched echoes", stats.mismatches), ("unexpected errors", stats.errors),
        ("connect failures", stats.connect_failures),
        ("ended by reset", stats.resets),
        ("descriptors before / after", f"{fds_before} / {fds_after}"),
        ("RSS before / after (MiB)", f"{rss_before / 2**20:.1f} / {rss_after / 2**20:.1f}"),
    ]
    if note:
        rows.append(("note", note))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    leaked = fds_after - fds_before
    failed = stats.mismatches or stats.errors or leaked > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
