"""The benchmark cases, written once against the asyncio API.

Each case is a coroutine function ``case(cfg) -> dict`` run inside the loop
under test; it holds client and server in the one process and returns
``{"value": rate, "unit": ..., "ops": n, "seconds": t}`` (or, for the memory
cases, bytes per connection). The same file runs in Linux CPython and in
Windows CPython under Wine, so it imports nothing beyond the standard library.

How a rate is taken: the clients run flat out and bump a counter; the case
coroutine sleeps through a warm-up, reads the counter, sleeps for the
measured duration and reads it again. Every loop pays the same for this
(one timer per phase), and no case checks the clock per operation. With
``cfg["count"]`` set instead, the clients stop after exactly that many
operations: the system-call counter (syscalls.py) needs exact work, not time.
"""
from __future__ import annotations

import asyncio
import gc
import socket
import subprocess
import sys
import time

PAYLOAD = b"x" * 100          # a 100-byte message
BIG = 1 << 20                 # 1 MiB for the large-transfer case
HOST = "127.0.0.1"


class Counter:
    """Operations done so far; ``done`` resolves once ``limit`` are done."""

    def __init__(self, limit=None, future=None):
        self.n = 0
        self.limit = limit
        self.done = future

    def tick(self, k: int = 1) -> bool:
        """Count k operations; False once the count limit is reached."""
        self.n += k
        if self.limit is not None and self.n >= self.limit:
            if not self.done.done():
                self.done.set_result(None)
            return False
        return True


def new_counter(cfg) -> Counter:
    loop = asyncio.get_running_loop()
    return Counter(cfg.get("count"), loop.create_future())


async def sample(counter: Counter, cfg, unit: str) -> dict:
    """Let the clients run; return their rate over the measured window."""
    if counter.limit is not None:
        start = time.perf_counter()
        await counter.done
        seconds = time.perf_counter() - start
        return {"value": counter.n / seconds, "unit": unit,
                "ops": counter.n, "seconds": seconds}
    await asyncio.sleep(cfg["warmup"])
    n0, t0 = counter.n, time.perf_counter()
    await asyncio.sleep(cfg["duration"])
    n1, t1 = counter.n, time.perf_counter()
    return {"value": (n1 - n0) / (t1 - t0), "unit": unit,
            "ops": n1 - n0, "seconds": t1 - t0}


async def _cancel(tasks) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# -- streams ------------------------------------------------------------------

PAYLOAD_SIZE = len(PAYLOAD)


async def _echo_streams(reader, writer, size=PAYLOAD_SIZE):
    """Server side: echo fixed-size messages until the peer goes away."""
    try:
        while True:
            data = await reader.readexactly(size)
            writer.write(data)
            if size > 65536:
                await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass          # the client went away: the end of this connection's work
    finally:
        writer.close()


async def _stream_client(host, port, counter, message, connected):
    reader, writer = await asyncio.open_connection(host, port)
    connected()
    size = len(message)
    try:
        while True:
            writer.write(message)
            # A 100-byte ping-pong never fills the write buffer, so drain()
            # would only add an await per message; 1 MiB messages need it.
            if size > 65536:
                await writer.drain()
            await reader.readexactly(size)
            if not counter.tick():
                break
    finally:
        writer.close()


async def _streams_rate(cfg, clients: int, message: bytes, unit: str):
    size = len(message)
    server = await asyncio.start_server(lambda r, w: _echo_streams(r, w, size), HOST, 0)
    port = server.sockets[0].getsockname()[1]
    counter = new_counter(cfg)
    # The clock starts once every client is connected: under Wine, 50
    # connects take longer than a short warm-up.
    all_connected = asyncio.get_running_loop().create_future()
    pending = [clients]

    def connected():
        pending[0] -= 1
        if pending[0] == 0:
            all_connected.set_result(None)

    tasks = [asyncio.ensure_future(_stream_client(HOST, port, counter, message, connected))
             for _ in range(clients)]
    try:
        await asyncio.wait([all_connected, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done() and task.exception():   # a client that could not connect
                raise task.exception()
        return await sample(counter, cfg, unit)
    finally:
        await _cancel(tasks)
        server.close()
        await server.wait_closed()


async def pingpong_streams(cfg):
    """One connection, 100-byte request/response with StreamReader/Writer."""
    return await _streams_rate(cfg, 1, PAYLOAD, "round trips/s")


async def concurrent_50(cfg):
    """Aggregate round trips of 50 connections doing stream ping-pong at once."""
    return await _streams_rate(cfg, 50, PAYLOAD, "round trips/s")


async def large_1mib(cfg):
    """1 MiB messages echoed over streams; MiB/s echoed (each way)."""
    return await _streams_rate(cfg, 1, b"y" * BIG, "MiB/s")


# -- raw protocol ---------------------------------------------------------------

class _EchoProtocol(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.transport.write(data)


class _PingProtocol(asyncio.Protocol):
    """Sends the next message once the whole previous one came back."""

    def __init__(self, counter):
        self.counter = counter
        self.pending = 0

    def connection_made(self, transport):
        self.transport = transport
        self.transport.write(PAYLOAD)

    def data_received(self, data):
        self.pending += len(data)
        if self.pending >= len(PAYLOAD):
            self.pending -= len(PAYLOAD)
            if self.counter.tick():
                self.transport.write(PAYLOAD)


async def pingpong_protocol(cfg):
    """One connection, 100-byte ping-pong with bare Protocol callbacks."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_EchoProtocol, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    counter = new_counter(cfg)
    transport, _ = await loop.create_connection(lambda: _PingProtocol(counter), HOST, port)
    try:
        return await sample(counter, cfg, "round trips/s")
    finally:
        transport.close()
        server.close()
        await server.wait_closed()


# -- sock_* methods --------------------------------------------------------------

def socket_pairs(n: int):
    """n connected TCP loopback pairs, made with plain blocking calls.

    Done outside any loop on purpose: the idle and memory cases want the
    sockets to exist before the loop is asked to watch them.
    """
    listener = socket.socket()
    listener.bind((HOST, 0))
    listener.listen(128)
    pairs = []
    try:
        for _ in range(n):
            client = socket.create_connection(listener.getsockname())
            server, _ = listener.accept()
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.setblocking(False)
            pairs.append((client, server))
    except BaseException:
        close_pairs(pairs)
        raise
    finally:
        listener.close()
    return pairs


def close_pairs(pairs) -> None:
    for pair in pairs:
        for s in pair:
            if s is not None:
                s.close()


# The far ends of the idle connections live in a child process: 10,000 idle
# connections are then 10,000 descriptors here, not 20,000 (this machine's
# hard RLIMIT_NOFILE is 20,000 and cannot be raised without root's
# CAP_SYS_RESOURCE).
_HOLDER = """
import socket, sys
listener = socket.socket()
listener.bind((sys.argv[1], 0))
listener.listen(4096)
print(listener.getsockname()[1], flush=True)
held = [listener.accept()[0] for _ in range(int(sys.argv[2]))]
print(len(held), flush=True)
sys.stdin.read()    # hold them until the parent closes our stdin
"""


def held_connections(n: int):
    """n connected TCP loopback sockets whose peers a child process holds
    open and silent; returns ``(pairs, holder)`` with pairs shaped as
    socket_pairs() makes them (the far end None). Close with
    release_held()."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, HOST, str(n)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    pairs = []
    try:
        port = int(holder.stdout.readline())
        for _ in range(n):
            client = socket.create_connection((HOST, port))
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            client.setblocking(False)
            pairs.append((client, None))
        if int(holder.stdout.readline()) != n:
            raise RuntimeError("the holder process did not accept every connection")
    except BaseException:
        release_held(pairs, holder)
        raise
    return pairs, holder


def release_held(pairs, holder) -> None:
    close_pairs(pairs)
    holder.stdin.close()
    try:
        holder.wait(30)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    holder.stdout.close()


async def _recv_exactly(loop, sock, size):
    got = 0
    while got < size:
        data = await loop.sock_recv(sock, size - got)
        if not data:
            raise ConnectionError("peer closed")
        got += len(data)


async def pingpong_sock(cfg):
    """One connection, 100-byte ping-pong with loop.sock_sendall/sock_recv."""
    loop = asyncio.get_running_loop()
    [(client, server)] = socket_pairs(1)
    counter = new_counter(cfg)

    async def serve():
        while True:
            await _recv_exactly(loop, server, len(PAYLOAD))
            await loop.sock_sendall(server, PAYLOAD)

    async def ping():
        while True:
            await loop.sock_sendall(client, PAYLOAD)
            await _recv_exactly(loop, client, len(PAYLOAD))
            if not counter.tick():
                break

    tasks = [asyncio.ensure_future(serve()), asyncio.ensure_future(ping())]
    try:
        return await sample(counter, cfg, "round trips/s")
    finally:
        await _cancel(tasks)
        close_pairs([(client, server)])


# -- UDP ------------------------------------------------------------------------

class _UdpEcho(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data, addr)


class _UdpPing(asyncio.DatagramProtocol):
    def __init__(self, counter):
        self.counter = counter

    def connection_made(self, transport):
        self.transport = transport
        transport.sendto(PAYLOAD)

    def datagram_received(self, data, addr):
        if self.counter.tick():
            self.transport.sendto(PAYLOAD)


async def udp_pingpong(cfg):
    """One UDP flow, 100-byte datagram ping-pong.

    Loopback rarely drops a datagram, but one loss would stall a ping-pong
    forever: a watchdog resends when nothing came back for 50 ms (at the
    slowest loop under Wine that is ~50 round trips, so it never fires on a
    merely slow loop).
    """
    loop = asyncio.get_running_loop()
    server, _ = await loop.create_datagram_endpoint(_UdpEcho, local_addr=(HOST, 0))
    address = server.get_extra_info("sockname")
    counter = new_counter(cfg)
    client, ping = await loop.create_datagram_endpoint(lambda: _UdpPing(counter),
                                                       remote_addr=address)

    async def watchdog():
        while True:
            seen = counter.n
            await asyncio.sleep(0.05)
            if counter.n == seen:
                client.sendto(PAYLOAD)

    dog = asyncio.ensure_future(watchdog())
    try:
        return await sample(counter, cfg, "round trips/s")
    finally:
        await _cancel([dog])
        client.close()
        server.close()


# -- connection churn -------------------------------------------------------------

async def _churn_server(reader, writer):
    try:
        data = await reader.readexactly(len(PAYLOAD))
        writer.write(data)
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def churn(cfg):
    """Connect, one 100-byte exchange, close: connections per second.

    The server closes first (as an HTTP/1.0 server would), so TIME_WAIT
    lands on the server's side of each 4-tuple, not on the client's pool of
    ephemeral ports.
    """
    server = await asyncio.start_server(_churn_server, HOST, 0)
    port = server.sockets[0].getsockname()[1]
    counter = new_counter(cfg)

    async def client():
        while True:
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(PAYLOAD)
            await reader.readexactly(len(PAYLOAD))
            writer.close()
            await writer.wait_closed()
            if not counter.tick():
                break

    task = asyncio.ensure_future(client())
    try:
        return await sample(counter, cfg, "connections/s")
    finally:
        await _cancel([task])
        server.close()
        await server.wait_closed()


# -- idle scaling ---------------------------------------------------------------------

async def _watch_idle(pairs, how: str):
    """Register one end of every pair with the loop, with a reader waiting.

    ``streams``: asyncio streams over the socket, a task blocked in read();
    ``add_reader``: a bare loop.add_reader callback (the selector's own cost).
    Returns an undo callable.
    """
    loop = asyncio.get_running_loop()
    if how == "add_reader":
        fds = [client.fileno() for client, _ in pairs]
        for fd in fds:
            loop.add_reader(fd, _never_called)

        def undo():
            for fd in fds:
                loop.remove_reader(fd)
        return undo, []

    writers, tasks = [], []
    try:
        for client, _ in pairs:
            reader, writer = await asyncio.open_connection(sock=client)
            writers.append(writer)
            tasks.append(asyncio.ensure_future(reader.read(1)))
    except BaseException:
        # A loop that cannot take them all (one that dup()s each socket
        # runs out of descriptors half way) gives back what it took, or the
        # next loops measured in this process would start without them.
        for task in tasks:
            task.cancel()
        for writer in writers:
            writer.close()
        await asyncio.sleep(0)
        raise

    def undo():
        for writer in writers:
            writer.close()
    return undo, tasks


def _never_called():
    raise AssertionError("an idle socket became readable")


async def idle(cfg):
    """Stream ping-pong on one connection while ``cfg['idle']`` others sit
    registered with the loop, each with a reader waiting.

    A selector whose iteration costs O(registered sockets) slows down here;
    one whose cost is O(ready sockets) does not.
    """
    pairs, holder = held_connections(cfg["idle"])
    undo, tasks = lambda: None, []
    try:
        undo, tasks = await _watch_idle(pairs, "streams")
        await asyncio.sleep(0)   # let every reader reach its wait
        return await _streams_rate(cfg, 1, PAYLOAD, "round trips/s")
    finally:
        await _cancel(tasks)
        undo()
        release_held(pairs, holder)


# -- memory ---------------------------------------------------------------------------

def rss_bytes() -> int:
    """Resident set size of this process (working set on Windows)."""
    if sys.platform == "win32":
        import ctypes
        from ctypes import wintypes

        class Counters(ctypes.Structure):
            _fields_ = [("cb", wintypes.DWORD), ("PageFaultCount", wintypes.DWORD)] + [
                (name, ctypes.c_size_t) for name in (
                    "PeakWorkingSetSize", "WorkingSetSize", "QuotaPeakPagedPoolUsage",
                    "QuotaPagedPoolUsage", "QuotaPeakNonPagedPoolUsage",
                    "QuotaNonPagedPoolUsage", "PagefileUsage", "PeakPagefileUsage")]

        counters = Counters()
        counters.cb = ctypes.sizeof(counters)
        kernel32 = ctypes.WinDLL("kernel32")
        kernel32.GetCurrentProcess.restype = wintypes.HANDLE
        psapi = ctypes.WinDLL("psapi")
        psapi.GetProcessMemoryInfo.argtypes = [wintypes.HANDLE, ctypes.c_void_p, wintypes.DWORD]
        if not psapi.GetProcessMemoryInfo(kernel32.GetCurrentProcess(),
                                          ctypes.byref(counters), counters.cb):
            raise OSError("GetProcessMemoryInfo failed")
        return counters.WorkingSetSize
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def _memory_reading():
    """(traced Python heap, RSS, tracemalloc's own bookkeeping) right now."""
    import tracemalloc
    return (tracemalloc.get_traced_memory()[0], rss_bytes(),
            tracemalloc.get_tracemalloc_memory())


def _per_connection(before, after, n: int) -> dict:
    """Deltas per connection; tracemalloc's own growth (its trace records)
    is taken out of the RSS figure, since no loop pays it in production."""
    traced, rss, bookkeeping = (b - a for a, b in zip(before, after))
    return {"value": (rss - bookkeeping) / n, "unit": "bytes/connection (RSS)",
            "traced": traced / n, "connections": n}


async def _memory(cfg, how: str):
    """Bytes per registered idle connection: RSS and tracemalloc deltas.

    The socket pairs exist before the first reading, so only what the loop
    (and, for ``streams``, the transport, protocol, reader and waiting task)
    adds is counted. tracemalloc sees Python-heap objects only (not libuv's
    C allocations in uvloop/winloop); RSS sees everything but rounds to
    pages, hence both, over thousands of connections.
    """
    import tracemalloc
    n = cfg["connections"]
    pairs = socket_pairs(n)
    undo, tasks = lambda: None, []
    try:
        await asyncio.sleep(0)
        gc.collect()
        tracemalloc.start()
        before = _memory_reading()
        undo, tasks = await _watch_idle(pairs, how)
        for _ in range(3):          # a few loop iterations with everything registered
            await asyncio.sleep(0.01)
        gc.collect()
        after = _memory_reading()
        tracemalloc.stop()
        return _per_connection(before, after, n)
    finally:
        await _cancel(tasks)
        undo()
        close_pairs(pairs)


async def memory_streams(cfg):
    """Memory per idle connection registered through asyncio streams."""
    return await _memory(cfg, "streams")


async def memory_add_reader(cfg):
    """Memory per idle socket registered with loop.add_reader."""
    return await _memory(cfg, "add_reader")


CASES = {
    "pingpong_streams": pingpong_streams,
    "pingpong_protocol": pingpong_protocol,
    "pingpong_sock": pingpong_sock,
    "concurrent_50": concurrent_50,
    "large_1mib": large_1mib,
    "udp_pingpong": udp_pingpong,
    "churn": churn,
    "idle": idle,
    "memory_streams": memory_streams,
    "memory_add_reader": memory_add_reader,
}
