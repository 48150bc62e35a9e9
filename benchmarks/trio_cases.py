"""The cases of cases.py that trio can express, written the trio way.

trio has no Protocol callbacks, no sock_* methods on a loop and no
add_reader, so those cases are absent for it (reported as "-"). Each
function here is the twin of the asyncio case of the same name: same
messages, same counting, same warm-up and measured window.
"""
from __future__ import annotations

import gc
import time
from functools import partial

import trio

from .cases import (
    BIG,
    HOST,
    PAYLOAD,
    _memory_reading,
    _per_connection,
    close_pairs,
    held_connections,
    release_held,
    socket_pairs,
)


class Counter:
    def __init__(self, limit=None):
        self.n = 0
        self.limit = limit
        self.done = trio.Event()

    def tick(self) -> bool:
        self.n += 1
        if self.limit is not None and self.n >= self.limit:
            self.done.set()
            return False
        return True


async def sample(counter, cfg, unit):
    if counter.limit is not None:
        start = time.perf_counter()
        await counter.done.wait()
        seconds = time.perf_counter() - start
        return {"value": counter.n / seconds, "unit": unit, "ops": counter.n, "seconds": seconds}
    await trio.sleep(cfg["warmup"])
    n0, t0 = counter.n, time.perf_counter()
    await trio.sleep(cfg["duration"])
    n1, t1 = counter.n, time.perf_counter()
    return {"value": (n1 - n0) / (t1 - t0), "unit": unit, "ops": n1 - n0, "seconds": t1 - t0}


async def _receive_exactly(stream, size):
    got = 0
    while got < size:
        data = await stream.receive_some(size - got)
        if not data:
            raise trio.BrokenResourceError("peer closed")
        got += len(data)


async def _streams_rate(cfg, clients, message, unit):
    size = len(message)

    async def echo(stream):
        try:
            while True:
                await _receive_exactly(stream, size)
                await stream.send_all(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    all_connected = trio.Event()
    pending = [clients]

    async def client(port, counter):
        stream = await trio.open_tcp_stream(HOST, port)
        pending[0] -= 1
        if pending[0] == 0:
            all_connected.set()   # the clock starts once every client is connected
        async with stream:
            while True:
                await stream.send_all(message)
                await _receive_exactly(stream, size)
                if not counter.tick():
                    return

    counter = Counter(cfg.get("count"))
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, echo, 0, host=HOST))
        port = listener.socket.getsockname()[1]
        for _ in range(clients):
            nursery.start_soon(client, port, counter)
        await all_connected.wait()
        result = await sample(counter, cfg, unit)
        nursery.cancel_scope.cancel()
    return result


async def pingpong_streams(cfg):
    return await _streams_rate(cfg, 1, PAYLOAD, "round trips/s")


async def concurrent_50(cfg):
    return await _streams_rate(cfg, 50, PAYLOAD, "round trips/s")


async def large_1mib(cfg):
    return await _streams_rate(cfg, 1, b"y" * BIG, "MiB/s")


async def udp_pingpong(cfg):
    server = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    client = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
    await server.bind((HOST, 0))
    await client.connect(server.getsockname())
    counter = Counter(cfg.get("count"))

    async def echo():
        while True:
            data, address = await server.recvfrom(2048)
            await server.sendto(data, address)

    async def ping():
        while True:
            await client.send(PAYLOAD)
            await client.recv(2048)
            if not counter.tick():
                return

    async def watchdog():
        # The same 50 ms resend as the asyncio case: one lost datagram
        # must not stall the ping-pong.
        while True:
            seen = counter.n
            await trio.sleep(0.05)
            if counter.n == seen:
                await client.send(PAYLOAD)

    with server, client:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(echo)
            nursery.start_soon(ping)
            nursery.start_soon(watchdog)
            result = await sample(counter, cfg, "round trips/s")
            nursery.cancel_scope.cancel()
    return result


async def churn(cfg):
    async def serve(stream):
        async with stream:
            try:
                await _receive_exactly(stream, len(PAYLOAD))
                await stream.send_all(PAYLOAD)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    counter = Counter(cfg.get("count"))

    async def client(port):
        while True:
            stream = await trio.open_tcp_stream(HOST, port)
            async with stream:
                await stream.send_all(PAYLOAD)
                await _receive_exactly(stream, len(PAYLOAD))
            if not counter.tick():
                return

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, serve, 0, host=HOST))
        nursery.start_soon(client, listener.socket.getsockname()[1])
        result = await sample(counter, cfg, "connections/s")
        nursery.cancel_scope.cancel()
    return result


async def _watch_idle(nursery, pairs):
    """One trio SocketStream per idle socket, a task blocked in receive_some."""
    streams = [trio.SocketStream(trio.socket.from_stdlib_socket(client)) for client, _ in pairs]
    for stream in streams:
        nursery.start_soon(stream.receive_some, 1)
    await trio.sleep(0.01)   # every task reaches its wait
    return streams


async def idle(cfg):
    pairs, holder = held_connections(cfg["idle"])
    try:
        async with trio.open_nursery() as nursery:
            await _watch_idle(nursery, pairs)
            result = await _streams_rate(cfg, 1, PAYLOAD, "round trips/s")
            nursery.cancel_scope.cancel()
        return result
    finally:
        release_held(pairs, holder)


async def memory_streams(cfg):
    import tracemalloc
    n = cfg["connections"]
    pairs = socket_pairs(n)
    try:
        async with trio.open_nursery() as nursery:
            gc.collect()
            tracemalloc.start()
            before = _memory_reading()
            await _watch_idle(nursery, pairs)
            await trio.sleep(0.03)
            gc.collect()
            after = _memory_reading()
            tracemalloc.stop()
            nursery.cancel_scope.cancel()
        return _per_connection(before, after, n)
    finally:
        close_pairs(pairs)


CASES = {
    "pingpong_streams": pingpong_streams,
    "concurrent_50": concurrent_50,
    "large_1mib": large_1mib,
    "udp_pingpong": udp_pingpong,
    "churn": churn,
    "idle": idle,
    "memory_streams": memory_streams,
}
