"""Behaviours users depend on, checked on the OS at hand (Linux natively,
Windows under Wine): thousands of readers, Ctrl+C, hostile sockets, and no
leaked handles."""
from __future__ import annotations

import asyncio
import gc
import os
import signal
import socket
import struct
import sys
import threading
import time

import pytest
from _platform import open_handles
from _sockets import refusing_address

import socknotify_loop

WINDOWS = sys.platform == "win32"


@pytest.fixture
def loop():
    loop = socknotify_loop.new_event_loop()
    yield loop
    loop.close()


def connected_pairs(count: int):
    """count connected TCP pairs over loopback, through one listener."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(min(count, 1024))
    address = listener.getsockname()
    pairs = []
    try:
        while len(pairs) < count:
            batch = []
            for _ in range(min(256, count - len(pairs))):
                client = socket.socket()
                client.connect(address)
                batch.append(client)
            for client in batch:
                server, _ = listener.accept()
                pairs.append((client, server))
    finally:
        listener.close()
    for a, b in pairs:
        a.setblocking(False)
        b.setblocking(False)
    return pairs


def test_loop_is_a_selector_event_loop_not_a_proactor(loop):
    assert isinstance(loop, asyncio.SelectorEventLoop)
    assert isinstance(loop, asyncio.AbstractEventLoop)
    proactor = getattr(asyncio, "ProactorEventLoop", None)
    if proactor is not None:
        assert not isinstance(loop, proactor)


def test_5000_sockets_with_add_reader_all_served(loop):
    """asyncio's WindowsSelectorEventLoop fails past 512 sockets."""
    if not WINDOWS:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 12000:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 12000), hard))
    pairs = connected_pairs(2500)
    sockets = [s for pair in pairs for s in pair]
    served = set()
    done = loop.create_future()

    def on_readable(sock):
        data = sock.recv(16)
        assert data == b"!"
        served.add(sock.fileno())
        loop.remove_reader(sock)
        if len(served) == len(sockets) and not done.done():
            done.set_result(None)

    try:
        for sock in sockets:
            loop.add_reader(sock, on_readable, sock)
        for a, b in pairs:
            a.send(b"!")
            b.send(b"!")
        loop.run_until_complete(asyncio.wait_for(done, 120))
        assert len(served) == 5000
    finally:
        for sock in sockets:
            loop.remove_reader(sock)
            sock.close()


def test_ctrl_c_interrupts_a_blocked_loop_promptly(loop):
    """SIGINT raised while the loop waits stops run_until_complete with
    KeyboardInterrupt within 100 ms."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")
    raised_at = []

    def raise_sigint():
        time.sleep(0.3)
        raised_at.append(time.monotonic())
        if WINDOWS:
            # What Ctrl+C does on Windows: the console runs the CRT's
            # SIGINT handler in a thread of its own.
            signal.raise_signal(signal.SIGINT)
        else:
            # A process-directed signal, delivered to the main thread.
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        thread = threading.Thread(target=raise_sigint)
        thread.start()
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.sleep(30))
        caught_at = time.monotonic()
        thread.join()
        assert caught_at - raised_at[0] < 0.1, caught_at - raised_at[0]
    finally:
        signal.signal(signal.SIGINT, previous)


def _reset_by_peer_pair():
    a, b = connected_pairs(1)[0]
    # SO_LINGER with a zero timeout: close() sends RST (WSAECONNRESET).
    b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    b.close()
    return a


def test_peer_reset_reports_error_without_crash(loop):
    sock = _reset_by_peer_pair()

    async def read():
        return await loop.sock_recv(sock, 100)

    try:
        with pytest.raises(ConnectionResetError):
            data = loop.run_until_complete(asyncio.wait_for(read(), 10))
            if data == b"":   # some stacks report the reset as EOF first
                raise ConnectionResetError
    finally:
        sock.close()


def test_refused_connect(loop):
    async def connect(address):
        await asyncio.open_connection(*address)

    with refusing_address() as address, pytest.raises(ConnectionRefusedError):
        loop.run_until_complete(asyncio.wait_for(connect(address), 30))


def test_socket_closed_while_registered_and_handle_reused(loop):
    """A reader's socket closed behind the loop's back, its handle value
    reused by a new socket: the old callback never runs for the new one."""
    calls = []
    for attempt in range(20):
        a, b = connected_pairs(1)[0]
        loop.add_reader(a, calls.append, ("old", attempt))
        b.send(b"x")
        loop.run_until_complete(asyncio.sleep(0.02))
        calls.clear()
        old_fd = a.fileno()
        loop.remove_reader(old_fd)   # asyncio's own order: unregister, then close
        a.close()
        b.close()
        c, d = connected_pairs(1)[0]
        try:
            if old_fd not in (c.fileno(), d.fileno()):
                continue
            reused = c if c.fileno() == old_fd else d
            loop.add_reader(reused, calls.append, ("new", attempt))
            loop.run_until_complete(asyncio.sleep(0.05))
            assert calls == []      # nothing was sent to the new socket
            (d if reused is c else c).send(b"y")
            loop.run_until_complete(asyncio.sleep(0.05))
            assert calls and all(tag == "new" for tag, _ in calls)
            loop.remove_reader(reused)
            return
        finally:
            c.close()
            d.close()
    pytest.skip("the OS never reused the handle value")


def test_closing_the_loop_releases_every_handle():
    def cycle():
        loop = socknotify_loop.new_event_loop()
        a, b = connected_pairs(1)[0]

        async def exchange():
            reader, writer = await asyncio.open_connection(sock=a)
            b.send(b"ping\n")
            assert await reader.readline() == b"ping\n"
            writer.close()
            await writer.wait_closed()

        loop.run_until_complete(exchange())
        b.close()
        loop.close()

    cycle()   # warm up lazy imports and caches
    gc.collect()
    before = open_handles()
    for _ in range(10):
        cycle()
    gc.collect()
    after = open_handles()
    assert after <= before, (before, after)
