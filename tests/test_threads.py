"""Threads, with and without the GIL: what free-threaded CPython (3.14t)
asks of the port, the selector and the loop.

CPython's guidance for asyncio on the free-threaded build is one event
loop per thread; Microsoft's article "Winsock socket state notifications"
adds the other shape, one port served by several threads. Both are
driven here, hard, by many threads at once:

- loops created, run and closed in many threads, each with its own port,
  round after round;
- one loop per thread serving one shared listening socket;
- a selector whose registrations come from other threads while one
  thread selects (every readiness reported once, to its own key; a key
  unregistered meanwhile never reported);
- ``call_soon_threadsafe`` from many threads into one running loop
  (nothing lost, nothing run twice);
- the Port API from several threads at once: one-shot registrations
  served by a pool of waiters, ``post`` from some threads while others
  wait, ``counters``/``registered`` read throughout, and ``close`` racing
  all of it.

On a GIL build the same tests run (faster, and with less overlap); on a
free-threaded one, tox's py314t env runs them with ``PYTHON_GIL=0``.
``test_gil_stays_off`` checks, in a child started *without* that
variable, that importing the package and running a loop leaves the GIL
off: the compiled core must declare itself safe without it (cffi 2.0 and
later do, for the modules they build), or CPython turns the GIL back on.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import sysconfig
import textwrap
import threading
import time
from typing import Awaitable, Callable, Dict, List, Optional, Set, Tuple

import pytest
from _platform import LINUX, WINE_CLOSE_RACE, running_under_wine
from _sockets import nonblocking_pair

from socknotify_loop import Loop
from socknotify_loop.port import (
    EVENT_IN,
    OP_ENABLE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    Port,
    Registration,
)
from socknotify_loop.selector import NotifySelector

FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
#: More work where threads really overlap; the GIL build gets a lighter
#: dose of the same (it checks the logic, not the memory model).
SCALE = 3 if FREE_THREADED else 1


def _run_threads(target, count: int, *args: object, timeout: float = 60.0) -> List[BaseException]:
    """Start ``count`` threads on ``target(index, *args)``, join them
    (bounded), and return what they raised."""
    errors: List[BaseException] = []
    lock = threading.Lock()

    def guarded(index: int) -> None:
        try:
            target(index, *args)
        except BaseException as exc:  # collected, re-raised by the test
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    alive = [thread.name for thread in threads if thread.is_alive()]
    assert not alive, f"threads still running after {timeout} s: {alive}"
    return errors


# -- the GIL ------------------------------------------------------------------------

@pytest.mark.skipif(not FREE_THREADED, reason="needs a free-threaded CPython build")
@pytest.mark.timeout(60)
def test_gil_stays_off() -> None:
    """Importing the package and running a loop in threads leaves the GIL
    disabled, with nothing forcing it (no PYTHON_GIL, no -X gil): an
    extension module that does not declare itself free-threading safe
    makes CPython enable the GIL at import, with a RuntimeWarning."""
    code = textwrap.dedent("""
        import asyncio, sys, threading, warnings
        warnings.simplefilter("error")
        import socknotify_loop
        from socknotify_loop import port   # the compiled core, loaded
        async def echo():
            loop = asyncio.get_running_loop()
            x, y = __import__("socket").socketpair()
            x.setblocking(False); y.setblocking(False)
            await loop.sock_sendall(x, b"ping")
            data = await loop.sock_recv(y, 4)
            x.close(); y.close()
            return data
        def run():
            assert socknotify_loop.run(echo()) == b"ping"
        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("gil", sys._is_gil_enabled())
    """)
    env = {name: value for name, value in os.environ.items() if name != "PYTHON_GIL"}
    # -P: not the current directory first on sys.path, which may be the
    # source tree (no compiled core there); the installed package it is.
    out = subprocess.run([sys.executable, "-P", "-X", "faulthandler", "-c", code], env=env,
                         capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["gil", "False"], out.stdout + out.stderr


# -- one loop per thread -------------------------------------------------------------

#: A stream server's per-connection callback (asyncio.start_server's).
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def _serve_until_stopped(listener: socket.socket, handle: Handler, stop: threading.Event,
                         ready: Optional[threading.Barrier] = None) -> None:
    """In this thread, a new Loop serves ``listener`` with ``handle``
    (asyncio.start_server), waits at ``ready`` once it listens (when
    given), and runs until ``stop`` is set; then the loop is closed."""
    async def main() -> None:
        async with await asyncio.start_server(handle, sock=listener):
            if ready is not None:
                ready.wait(10)
            while not stop.is_set():
                await asyncio.sleep(0.01)

    loop = Loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


async def _ping_pong(rounds: int) -> int:
    """Round trips over a socket pair on the running loop, with a timer
    and a call_soon in between; returns how many came back intact."""
    loop = asyncio.get_running_loop()
    a, b = nonblocking_pair()
    done = 0
    try:
        for i in range(rounds):
            payload = b"%d:" % i + os.urandom(16)
            await loop.sock_sendall(a, payload)
            got = b""
            while len(got) < len(payload):
                got += await asyncio.wait_for(loop.sock_recv(b, 64), 10)
            await asyncio.sleep(0)
            if got == payload:
                done += 1
    finally:
        a.close()
        b.close()
    return done


@pytest.mark.timeout(120)
def test_loops_created_run_and_closed_in_many_threads() -> None:
    """Each thread makes its own loop (its own port), runs round trips on
    it, closes it; again and again, all threads at once."""
    threads, rounds, trips = 8, 4 * SCALE, 50

    def worker(index: int) -> None:
        for _ in range(rounds):
            loop = Loop()
            try:
                assert loop.run_until_complete(_ping_pong(trips)) == trips
            finally:
                loop.close()
            assert loop.is_closed()

    errors = _run_threads(worker, threads, timeout=100)
    assert not errors, errors


@pytest.mark.timeout(120)
def test_one_loop_per_thread_shares_a_listening_socket() -> None:
    """N loops in N threads accept from one listening socket (each its own
    registration of it on its own port); every client is served once."""
    loops_n, clients_n = 4, 40 * SCALE
    listener = socket.create_server(("127.0.0.1", 0), backlog=128)
    listener.setblocking(False)
    address = listener.getsockname()
    served: Dict[int, int] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def server(index: int) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            data = await reader.readline()
            writer.write(data.upper())
            await writer.drain()
            writer.close()
            with lock:
                served[index] = served.get(index, 0) + 1

        _serve_until_stopped(listener.dup(), handle, stop)

    def clients() -> None:
        for i in range(clients_n):
            with socket.create_connection(address, timeout=10) as conn:
                conn.sendall(b"hello %d\n" % i)
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = conn.recv(64)
                    assert chunk, "server closed without answering"
                    answer += chunk
                assert answer == b"HELLO %d\n" % i

    servers = threading.Thread(target=lambda: errors.extend(
        _run_threads(server, loops_n, timeout=100)), daemon=True)
    errors: List[BaseException] = []
    servers.start()
    try:
        client_errors = _run_threads(lambda i: clients(), 2, timeout=90)
    finally:
        stop.set()
        servers.join(100)
        listener.close()
    assert not client_errors, client_errors
    assert not errors, errors
    assert sum(served.values()) == 2 * clients_n


@pytest.mark.timeout(60)
def test_call_soon_threadsafe_from_many_threads() -> None:
    """Callbacks queued from many threads into one running loop: each runs
    exactly once, in the loop's thread."""
    senders, each = 8, 500 * SCALE
    loop = Loop()
    ran: List[Tuple[int, int]] = []
    loop_thread: List[int] = []
    finished = threading.Event()

    def record(sender: int, n: int) -> None:
        loop_thread.append(threading.get_ident())
        ran.append((sender, n))
        if len(ran) == senders * each:
            finished.set()

    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        def sender(index: int) -> None:
            for n in range(each):
                loop.call_soon_threadsafe(record, index, n)

        errors = _run_threads(sender, senders, timeout=50)
        assert not errors, errors
        assert finished.wait(30), f"{len(ran)} of {senders * each} callbacks ran"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
    assert sorted(ran) == [(s, n) for s in range(senders) for n in range(each)]
    assert set(loop_thread) == {runner.ident}


# -- a selector, registrations from other threads ------------------------------------

@pytest.mark.timeout(90)
def test_selector_registrations_from_other_threads() -> None:
    """One thread selects; others register socket pairs, make them
    readable, wait for the selecting thread to see them, modify and
    unregister them. Every readiness reaches its own key's data; a key is
    never reported readable before its socket had data (the mark of a
    slot's old owner's event reaching its new owner), nor by a select
    that started after its unregister() had returned."""
    if running_under_wine():
        pytest.skip(WINE_CLOSE_RACE)
    selector = NotifySelector()
    changers, rounds = 6, 60 * SCALE
    seen: Dict[int, threading.Event] = {}
    sent: Set[int] = set()
    gone: Dict[int, int] = {}     # token -> order of its unregister's return
    wrong: List[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def selecting() -> None:
        while not stop.is_set():
            with lock:
                gone_before = len(gone)
            for key, mask in selector.select(0.005):
                token = key.data
                with lock:
                    event = seen.get(token)
                    if gone.get(token, gone_before) < gone_before:
                        wrong.append(f"reported after its unregister returned: {token}")
                    if mask & 1 and key.events & 1 and token not in sent:
                        wrong.append(f"readable before any data: {token}")
                if event is None:
                    wrong.append(f"unknown data {token!r}")
                    continue
                if not mask & key.events:
                    wrong.append(f"mask {mask} outside {key.events}")
                event.set()

    def changing(index: int) -> None:
        for n in range(rounds):
            token = index * 1_000_000 + n
            a, b = nonblocking_pair()
            try:
                event = threading.Event()
                with lock:
                    seen[token] = event
                selector.register(a, 1, token)     # EVENT_READ
                with lock:
                    sent.add(token)
                b.send(b"x")
                assert event.wait(10), f"readiness of {token} never reported"
                event.clear()
                selector.modify(a, 2, token)       # EVENT_WRITE: writable at once
                assert event.wait(10), f"writability of {token} never reported"
                selector.unregister(a)
                with lock:
                    gone[token] = len(gone)
            finally:
                a.close()
                b.close()

    selector_thread = threading.Thread(target=selecting, daemon=True)
    selector_thread.start()
    try:
        errors = _run_threads(changing, changers, timeout=80)
    finally:
        stop.set()
        selector_thread.join(10)
        selector.close()
    assert not selector_thread.is_alive()
    assert not errors, errors
    assert not wrong, wrong[:10]


def _select_in_a_thread(selector: NotifySelector, timeout: float) -> Tuple[threading.Thread,
                                                                            List[object]]:
    """A thread blocked in ``selector.select(timeout)``, once its wait is on
    as far as the port's wait counter tells; and where its answer goes."""
    answer: List[object] = []
    waits = selector.port.counters()["waits"]
    thread = threading.Thread(target=lambda: answer.append(selector.select(timeout)),
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while selector.port.counters()["waits"] == waits and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)   # into the kernel's wait (if not, the test only gets easier)
    return thread, answer


@pytest.mark.timeout(90)
@pytest.mark.parametrize("change", ["register", "modify"])
def test_a_change_from_another_thread_reaches_a_waiting_select(backend: str,
                                                               change: str) -> None:
    """docs/threads.md: register, modify and unregister may be called from
    any thread while the loop waits, as with selectors.EpollSelector, where
    the kernel applies them to the waiting call. A thread blocked in a
    select of a minute, and a socket that is readable (or writable) at
    once registered (or modified to WRITE) from another thread: the select
    returns it, well before its minute is up."""
    selector = NotifySelector(backend)
    a, b = nonblocking_pair()
    try:
        if change == "modify":
            selector.register(a, 1, "a")   # EVENT_READ: nothing to read
            selector.select(0)
        else:
            b.send(b"x")
        thread, answer = _select_in_a_thread(selector, 60)
        if change == "modify":
            selector.modify(a, 2, "a")     # EVENT_WRITE: writable at once
        else:
            selector.register(a, 1, "a")
        thread.join(30)
        assert not thread.is_alive(), f"the select did not see the {change} in 30 s"
        expected = 2 if change == "modify" else 1
        assert [(key.data, mask) for key, mask in answer[0]] == [("a", expected)]  # type: ignore[attr-defined]
    finally:
        selector.close()
        a.close()
        b.close()


@pytest.mark.timeout(90)
def test_an_unregister_from_another_thread_reaches_a_waiting_select(backend: str) -> None:
    """The other half: a registration removed from another thread while a
    select waits is not reported by it, whatever happens to the socket
    after unregister() returned; a socket registered next is."""
    selector = NotifySelector(backend)
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    try:
        selector.register(a, 1, "a")
        selector.select(0)
        thread, answer = _select_in_a_thread(selector, 60)
        selector.unregister(a)
        b.send(b"x")
        d.send(b"x")
        selector.register(c, 1, "c")
        thread.join(30)
        assert not thread.is_alive(), "the select did not see the register in 30 s"
        assert [key.data for key, _ in answer[0]] == ["c"]  # type: ignore[attr-defined]
    finally:
        selector.close()
        for sock in (a, b, c, d):
            sock.close()


@pytest.mark.timeout(60)
def test_second_thread_select_is_refused_cleanly() -> None:
    """Two threads calling select() on one selector at once: one selects,
    the other gets RuntimeError at once, again and again, and nothing
    breaks (the select token is taken atomically, without the GIL too)."""
    selector = NotifySelector()
    a, b = nonblocking_pair()
    selector.register(a, 1, "a")
    b.send(b"x")
    outcomes: Dict[str, int] = {"ok": 0, "busy": 0}
    lock = threading.Lock()

    def hammer(index: int) -> None:
        for _ in range(300 * SCALE):
            try:
                ready = selector.select(0)
            except RuntimeError as exc:
                assert "another thread" in str(exc)
                with lock:
                    outcomes["busy"] += 1
            else:
                assert ready == [] or [key.data for key, _ in ready] == ["a"]
                with lock:
                    outcomes["ok"] += 1

    try:
        errors = _run_threads(hammer, 4, timeout=50)
    finally:
        selector.close()
        a.close()
        b.close()
    assert not errors, errors
    assert outcomes["ok"] > 0
    assert outcomes["ok"] + outcomes["busy"] == 4 * 300 * SCALE


# -- the Port API from several threads ----------------------------------------------

@pytest.mark.timeout(90)
def test_port_shared_by_waiter_threads(backend: str) -> None:
    """The article's many-threads shape: one port, a pool of threads each
    waiting in process() and re-arming what it received, in the same
    call; readiness keeps arriving from writer threads. Every byte is
    read exactly once, by one waiter, under its own key."""
    port = Port(backend)
    pairs = [nonblocking_pair() for _ in range(16)]
    per_pair = 40 * SCALE
    received: Dict[int, int] = {key: 0 for key in range(len(pairs))}
    lock = threading.Lock()
    stop_key = 1 << 40
    try:
        port.process([Registration(reader, key, EVENT_IN) for key, (reader, _) in
                      enumerate(pairs)], timeout=0)

        def waiter(index: int) -> None:
            rearm: List[Registration] = []
            while True:
                got = port.process(rearm, timeout=10)
                assert got, "a waiter starved for 10 s"
                rearm = []
                for key, _events in got:
                    if key == stop_key:
                        port.post(stop_key)   # pass the exit on
                        return
                    reader = pairs[key][0]
                    while True:
                        try:
                            data = reader.recv(4096)
                        except BlockingIOError:
                            break
                        with lock:
                            received[key] += len(data)
                    rearm.append(Registration(reader, key, EVENT_IN))

        def writer(index: int) -> None:
            for n in range(per_pair):
                for key in range(index, len(pairs), 4):
                    pairs[key][1].send(b"y")
                if n % 8 == 0:
                    time.sleep(0.001)

        waiters = threading.Thread(
            target=lambda: errors.extend(_run_threads(waiter, 4, timeout=80)), daemon=True)
        errors: List[BaseException] = []
        waiters.start()
        writer_errors = _run_threads(writer, 4, timeout=60)
        want = {key: per_pair for key in range(len(pairs))}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lock:
                if received == want:
                    break
            time.sleep(0.01)
        port.post(stop_key)
        waiters.join(60)
        assert not writer_errors, writer_errors
        assert not errors, errors
        assert received == want
    finally:
        port.close()
        for a, b in pairs:
            a.close()
            b.close()


@pytest.mark.timeout(90)
def test_port_api_from_several_threads_at_once(backend: str) -> None:
    """post() in some threads, process() in others, registrations made and
    removed, counters and registered read, all at once; then close()
    racing waiters. Each posted key arrives exactly once."""
    port = Port(backend)
    posters, each = 4, 400 * SCALE
    got_keys: List[int] = []
    lock = threading.Lock()
    done = threading.Event()
    total = posters * each

    def collect(notes: List[Tuple[int, int]]) -> None:
        # Any process() call may dequeue posted packets, a churner's too.
        keys = [key for key, events in notes if events == 0]
        if keys:
            with lock:
                got_keys.extend(keys)
                if len(got_keys) >= total:
                    done.set()

    def waiter(index: int) -> None:
        while not done.is_set():
            try:
                collect(port.process(timeout=0.05))
            except ValueError:      # closed under us, at the very end
                return

    def poster(index: int) -> None:
        for n in range(each):
            port.post(index * 100_000 + n)

    def churner(index: int) -> None:
        for n in range(100 * SCALE):
            a, b = nonblocking_pair()
            try:
                key = (1 << 32) + index * 100_000 + n
                collect(port.process([Registration(a, key, EVENT_IN)], timeout=0))
                port.counters()
                assert port.registered >= 0
                collect(port.process([Registration(a, key, 0, OP_REMOVE)], timeout=0))
            finally:
                a.close()
                b.close()

    pool = threading.Thread(target=lambda: errors.extend(_run_threads(waiter, 3, timeout=80)),
                            daemon=True)
    errors: List[BaseException] = []
    pool.start()
    try:
        other = _run_threads(lambda i: poster(i) if i < posters else churner(i - posters),
                             posters + 2, timeout=60)
        arrived = done.wait(30)
    finally:
        done.set()
        pool.join(30)
        port.close()
    assert not other, other
    assert not errors, errors
    assert arrived, f"{len(got_keys)} of {total} posted keys arrived"
    # Notifications of the churned registrations (key >= 2**32, events
    # != 0) are not counted; every posted key exactly once.
    assert sorted(got_keys) == sorted(i * 100_000 + n for i in range(posters)
                                      for n in range(each))


def _close_race_round() -> Port:
    """Six threads waiting, posting and registering on one port while a
    seventh closes it; returns the port once every thread has ended."""
    port = Port()
    started = threading.Barrier(7)

    def user(index: int) -> None:
        started.wait(10)
        a, b = nonblocking_pair()
        try:
            while True:
                try:
                    if index < 3:
                        port.process(timeout=5)
                    elif index < 5:
                        port.post(index)
                    else:
                        port.process([Registration(a, index, EVENT_IN, OP_ENABLE,
                                                   TRIGGER_LEVEL | TRIGGER_ONESHOT)],
                                     timeout=0)
                except ValueError:
                    return   # closed
        finally:
            a.close()
            b.close()

    def closer() -> None:
        started.wait(10)
        time.sleep(0.005)
        port.close()

    errors = _run_threads(lambda i: user(i) if i < 6 else closer(), 7, timeout=40)
    assert not errors, errors
    return port


@pytest.mark.timeout(60)
def test_close_races_waiters_and_posters() -> None:
    """close() while threads wait, post and register: every thread ends
    (woken, or refused with ValueError), none hangs or crashes."""
    for _ in range(10 * SCALE):
        assert _close_race_round().closed


@pytest.mark.skipif(not LINUX, reason="SO_REUSEPORT listeners: Linux only here")
@pytest.mark.timeout(60)
def test_one_loop_per_thread_with_reuseport_listeners() -> None:
    """Each thread's loop has its own SO_REUSEPORT listener on one port
    number; the kernel spreads the connections; all are served."""
    loops_n, clients_n = 3, 30 * SCALE
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    probe.bind(("127.0.0.1", 0))
    address = probe.getsockname()
    listeners = []
    for _ in range(loops_n):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(64)
        sock.setblocking(False)
        listeners.append(sock)
    probe.close()
    served = [0] * loops_n
    stop = threading.Event()
    ready = threading.Barrier(loops_n + 1)

    def server(index: int) -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(await reader.readline())
            await writer.drain()
            writer.close()
            served[index] += 1

        _serve_until_stopped(listeners[index], handle, stop, ready)

    errors: List[BaseException] = []
    pool = threading.Thread(target=lambda: errors.extend(
        _run_threads(server, loops_n, timeout=50)), daemon=True)
    pool.start()
    try:
        ready.wait(10)
        for i in range(clients_n):
            with socket.create_connection(address, timeout=10) as conn:
                conn.sendall(b"%d\n" % i)
                assert conn.makefile("rb").readline() == b"%d\n" % i
    finally:
        stop.set()
        pool.join(50)
    assert not errors, errors
    assert sum(served) == clients_n
