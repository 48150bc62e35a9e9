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

``--child-holds-copies`` (Linux): every socket the run connects or
accepts is sent (``socket.send_fds`` over a Unix socket) to a helper child
process that keeps the copy until the end, as a forked child would: each
close of the loop's then leaves the file open elsewhere, so an epoll item
the loop failed to remove before closing would outlive its descriptor (an
orphan). A close does nothing on the wire while a copy lives, so in this
mode every session ends with ``shutdown(SHUT_WR)`` before its close or
abort (a "reset" session still aborts its transport, but its peer sees a
FIN), and the server answers the EOF with its own before closing its
side: the client's socket, closed by then, becomes readable behind the
loop's back. Half of the client
sessions then use the loop's socket calls instead of a stream
(``sock_connect``, ``sock_sendall``, ``sock_recv``) and close the socket
right after the last ``sock_recv``: the order in which a removal that
reaches the kernel too late leaves an orphan. A child holds as many
copies as its RLIMIT_NOFILE allows; further ones go to a new child. After
the run, with every copy still held and nothing registered, the loop
waits one idle second: it must make at most 10 waits and use under 0.2 s
of CPU. The children's count of copies received must equal the count
sent.

Prints one JSON line (for scripts) and a short table. Exit status 1 if a
byte was wrong, an unexpected error occurred, descriptors leaked, or (with
``--child-holds-copies``) a copy went missing or the idle second was not
idle. It imports the installed package: install it first
(``pip install .``).
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
import subprocess
import sys
import time

if __name__ == "__main__" and not __package__:
    # Run by path, as documented: the package is imported from the project
    # root, put last on sys.path, so the installed socknotify_loop (not the
    # source tree, which has no compiled core) is the one soaked.
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.append(sys.path.pop(0))
    from benchmarks.soak import main
    sys.exit(main())

import socknotify_loop

WINDOWS = sys.platform == "win32"
CONNECT_CONCURRENCY = 256       # connects in flight at once (the listen backlog's share)
MAX_CHUNK = 16384
# What an idle second may cost (the reliability tests' bound): asyncio's own
# loop makes one wait and uses well under 10 ms of CPU.
IDLE_WAITS_LIMIT = 10
IDLE_CPU_LIMIT = 0.2


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
    from .cases import rss_bytes
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


# -- copies held by child processes (--child-holds-copies) ------------------------

# The helper child: raises its descriptor limit to the hard one, says how
# many it may hold, keeps every descriptor it receives until its control
# socket closes, then says how many it received.
_HOLDER = r"""
import resource, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
ctl = socket.socket(fileno=int(sys.argv[1]))
ctl.sendall(b"%d" % hard)
held, truncated = [], 0
while True:
    msg, fds, flags, _ = socket.recv_fds(ctl, 16, 64)
    held.extend(fds)
    truncated += bool(flags & socket.MSG_CTRUNC)
    if not msg:
        break
ctl.sendall(b"%d %d" % (len(held), truncated))
"""


class _Holder:
    """One child process holding copies of descriptors."""

    def __init__(self) -> None:
        self.ctl, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.child = subprocess.Popen([sys.executable, "-S", "-I", "-c", _HOLDER,
                                           str(theirs.fileno())], pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.ctl.settimeout(30)
        # Its own descriptors (three standard ones, the control socket)
        # and a margin.
        self.room = int(self.ctl.recv(64)) - 16
        self.sent = 0

    def finish(self) -> tuple[int, int]:
        """(copies received, messages whose descriptors were cut off)."""
        self.ctl.send(b"")      # an empty message: the end
        received, truncated = (int(n) for n in self.ctl.recv(64).split())
        self.ctl.close()
        self.child.wait(30)
        return received, truncated


class CopyHolders:
    """Children holding a copy of every socket passed to :meth:`hold`, as
    many children as their descriptor limits need."""

    def __init__(self) -> None:
        self.holders: list[_Holder] = []
        self.sent = 0

    def hold(self, sock) -> None:
        if not self.holders or self.holders[-1].sent >= self.holders[-1].room:
            self.holders.append(_Holder())
        holder = self.holders[-1]
        # The kernel takes its reference to the file in sendmsg: the copy
        # exists from here on, whatever the loop closes next.
        socket.send_fds(holder.ctl, [b"c"], [sock.fileno()])
        holder.sent += 1
        self.sent += 1

    def finish(self) -> tuple[int, int]:
        """Ends every child: (copies they received, truncated messages)."""
        received = truncated = 0
        for holder in self.holders:
            got, cut = holder.finish()
            received += got
            truncated += cut
        return received, truncated


def idle_second(loop) -> tuple[int, float]:
    """(waits, CPU seconds) the loop spends on one idle second."""
    port = loop._selector.port
    waits = port.counters()["waits"]
    cpu = time.process_time()
    loop.run_until_complete(asyncio.sleep(1.0))
    return port.counters()["waits"] - waits, time.process_time() - cpu


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
    def __init__(self, stats: Stats, holders: CopyHolders | None) -> None:
        self.stats = stats
        self.holders = holders

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.stats.served += 1
        if self.holders is not None:
            self.holders.hold(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        self.transport.write(data)

    def eof_received(self) -> None:
        if self.holders is not None:
            # Its close would send nothing (the child's copy lives): the
            # client's socket, closed by now, sees EOF -- readable, with
            # nobody left to read it.
            self.transport.write_eof()

    def connection_lost(self, exc) -> None:
        if exc is not None:
            # The client's resets, seen from here: expected.
            self.stats.server_resets_seen += 1


async def session(address, stats: Stats, rng: random.Random, connect_gate, deadline,
                  pause: float, holders: CopyHolders | None) -> None:
    async with connect_gate:
        try:
            reader, writer = await asyncio.open_connection(*address)
        except OSError as exc:
            stats.connect_failures += 1
            if len(stats.error_samples) < 10:
                stats.error_samples.append(f"connect: {exc!r}")
            await asyncio.sleep(0.05)
            return
    if holders is not None:
        holders.hold(writer.get_extra_info("socket"))
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
        if holders is not None:
            # A close does nothing on the wire while the child's copy
            # lives: say the end explicitly.
            sock = writer.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
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


async def sock_session(address, stats: Stats, rng: random.Random, connect_gate, deadline,
                       pause: float, holders: CopyHolders) -> None:
    """A session on the loop's socket calls, ending with
    ``data = await loop.sock_recv(s, n); s.close()`` (after a shutdown: a
    child holds a copy)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    async with connect_gate:
        try:
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            stats.connect_failures += 1
            if len(stats.error_samples) < 10:
                stats.error_samples.append(f"sock_connect: {exc!r}")
            await asyncio.sleep(0.05)
            return
    holders.hold(sock)
    stats.open_now += 1
    stats.peak_open = max(stats.peak_open, stats.open_now)
    try:
        for _ in range(rng.randint(1, 4)):
            payload = rng.randbytes(rng.randint(1, MAX_CHUNK))
            await loop.sock_sendall(sock, payload)
            echoed = bytearray()
            while len(echoed) < len(payload):
                data = await loop.sock_recv(sock, len(payload) - len(echoed))
                if not data:
                    raise ConnectionError("EOF before the whole echo")
                echoed += data
            if echoed != payload:
                stats.mismatches += 1
            else:
                stats.bytes_verified += len(payload)
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(rng.uniform(0, pause))
        stats.sessions += 1
    except (ConnectionError, OSError) as exc:
        stats.error("sock echo", exc)
    finally:
        stats.open_now -= 1
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        sock.close()


async def client(address, stats, seed, connect_gate, deadline, pause, holders) -> None:
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        if holders is not None and rng.random() < 0.5:
            await sock_session(address, stats, rng, connect_gate, deadline, pause, holders)
        else:
            await session(address, stats, rng, connect_gate, deadline, pause, holders)


async def soak(seconds: float, connections: int, seed: int, pause: float = 1.0,
               holders: CopyHolders | None = None) -> Stats:
    loop = asyncio.get_running_loop()
    stats = Stats()
    server = await loop.create_server(lambda: Echo(stats, holders), "127.0.0.1", 0,
                                      backlog=4096)
    address = server.sockets[0].getsockname()[:2]
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    deadline = time.monotonic() + seconds
    tasks = [asyncio.ensure_future(client(address, stats, seed + n, gate, deadline, pause,
                                          holders))
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
    parser.add_argument("--child-holds-copies", action="store_true",
                        help="Linux: child processes hold a copy of every connected and "
                             "accepted socket for the whole run; then check that the loop "
                             "stays idle")
    options = parser.parse_args(argv)
    if options.child_holds_copies and WINDOWS:
        parser.error("--child-holds-copies needs POSIX descriptor passing (Linux)")

    connections = options.connections
    # Two descriptors per connection (both ends live here) plus headroom.
    limit = raise_descriptor_limit(2 * connections + 256)
    note = ""
    if 2 * connections + 256 > limit:
        connections = max(1, (limit - 256) // 2)
        note = f"connections limited to {connections} by RLIMIT_NOFILE ({limit})"

    gc.collect()
    fds_before, rss_before = open_descriptors(), resident_bytes()
    holders = CopyHolders() if options.child_holds_copies else None
    loop = socknotify_loop.new_event_loop()
    backend = loop.backend
    started = time.monotonic()
    idle_waits, idle_cpu = None, None
    copies_received = copies_truncated = 0
    try:
        try:
            stats = loop.run_until_complete(soak(options.seconds, connections, options.seed,
                                                 options.pause, holders))
            elapsed = time.monotonic() - started
            if holders is not None:
                # Every copy still held, nothing registered: one idle second.
                idle_waits, idle_cpu = idle_second(loop)
        finally:
            loop.close()
    finally:
        if holders is not None:
            copies_received, copies_truncated = holders.finish()
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
    if holders is not None:
        result.update({
            "child_holds_copies": True, "holder_children": len(holders.holders),
            "copies_sent": holders.sent, "copies_received": copies_received,
            "copies_truncated": copies_truncated,
            "idle_second_waits": idle_waits, "idle_second_cpu": round(idle_cpu, 4),
        })
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
    if holders is not None:
        rows += [
            ("copies held by children (sent / received)",
             f"{holders.sent:,} / {copies_received:,} in {len(holders.holders)} child(ren)"),
            ("idle second: waits / CPU", f"{idle_waits} / {idle_cpu * 1000:.1f} ms"),
        ]
    if note:
        rows.append(("note", note))
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    leaked = fds_after - fds_before
    failed = stats.mismatches or stats.errors or leaked > 0
    if holders is not None:
        failed = (failed or copies_received != holders.sent or copies_truncated
                  or idle_waits > IDLE_WAITS_LIMIT or idle_cpu >= IDLE_CPU_LIMIT)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
