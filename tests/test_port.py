"""Behaviour of the low-level Port, on every backend this machine has."""
from __future__ import annotations

import errno
import os
import socket
import sys
import tempfile
import threading
import time

import pytest
from _sockets import nonblocking_pair, refusing_address

from socknotify_loop import port as port_module
from socknotify_loop.port import (
    EVENT_ERR,
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_OUT,
    EVENT_REMOVE,
    OP_DISABLE,
    OP_REMOVE,
    TRIGGER_EDGE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
)

BACKENDS = port_module.available_backends()
AVAILABLE = [name for name, (ok, _) in BACKENDS.items() if ok]
ONESHOT = TRIGGER_LEVEL | TRIGGER_ONESHOT
PERSISTENT = TRIGGER_LEVEL | TRIGGER_PERSISTENT


@pytest.fixture
def port(backend):
    """A Port on each backend in turn (``backend``: tests/conftest.py)."""
    p = Port(backend)
    yield p
    p.close()


def wait_for(port, key, timeout=2.0, regs=()):
    """Process until a notification for key arrives; returns its events."""
    deadline = time.monotonic() + timeout
    regs = list(regs)
    while time.monotonic() < deadline:
        for k, events in port.process(regs, timeout=0.1):
            if k == key:
                return events
        regs = []
    return None


def test_backend_name(port):
    assert port.backend in ("epoll", "psn", "afd", "strict")
    assert repr(port).startswith("<Port backend=")


def test_oneshot_fires_once_until_reenabled(port):
    a, b = nonblocking_pair()
    with a, b:
        b.send(b"x")
        assert wait_for(port, 1, regs=[Registration(a, 1, EVENT_IN)]) & EVENT_IN
        # Disarmed: the data is still unread, yet nothing comes.
        assert port.process(timeout=0.1) == []
        # Re-enabled: level-triggered, so it fires again at once.
        assert wait_for(port, 1, regs=[Registration(a, 1, EVENT_IN)]) & EVENT_IN


def test_level_refires_while_unread_and_stops_when_drained(port):
    a, b = nonblocking_pair()
    with a, b:
        b.send(b"hello")
        for _ in range(3):
            assert wait_for(port, 2, regs=[Registration(a, 2, EVENT_IN)]) & EVENT_IN
        assert a.recv(100) == b"hello"
        assert port.process([Registration(a, 2, EVENT_IN)], timeout=0.1) == []


def test_persistent_keeps_firing(port):
    a, b = nonblocking_pair()
    with a, b:
        b.send(b"x")
        reg = Registration(a, 3, EVENT_IN, trigger=PERSISTENT)
        seen = 0
        deadline = time.monotonic() + 3
        regs = [reg]
        while seen < 3 and time.monotonic() < deadline:
            seen += sum(1 for k, ev in port.process(regs, timeout=0.1) if k == 3)
            regs = []
        assert seen >= 3


def test_edge_triggered_or_refused(port):
    a, b = nonblocking_pair()
    with a, b:
        reg = Registration(a, 4, EVENT_IN, trigger=TRIGGER_EDGE | TRIGGER_PERSISTENT)
        if not port.supports(TRIGGER_EDGE):
            with pytest.raises(OSError):
                port.process([reg], timeout=0)
            assert reg.result != 0
            return
        port.process([reg], timeout=0)
        b.send(b"1")
        assert wait_for(port, 4) & EVENT_IN
        # No new edge while the data sits unread.
        assert port.process(timeout=0.1) == []
        # Microsoft's article: the reader "must keep receiving until it
        # receives WSAEWOULDBLOCK", or it cannot be sure a rising edge will
        # be observed. So: drain, and only then expect the next edge
        # (epoll would also report new data on an undrained socket; the
        # documented API need not).
        assert a.recv(10) == b"1"
        with pytest.raises(BlockingIOError):
            a.recv(10)
        assert port.process(timeout=0.1) == []
        b.send(b"2")
        assert wait_for(port, 4) & EVENT_IN


def test_writable_and_out_filter(port):
    a, b = nonblocking_pair()
    with a, b:
        assert wait_for(port, 5, regs=[Registration(a, 5, EVENT_OUT)]) & EVENT_OUT


def test_hangup_on_peer_close(port):
    a, b = nonblocking_pair()
    with a:
        port.process([Registration(a, 6, EVENT_IN | EVENT_HANGUP)], timeout=0)
        b.close()
        events = wait_for(port, 6)
        assert events is not None and events & EVENT_HANGUP


def test_err_on_refused_connect(port):
    s = socket.socket()
    s.setblocking(False)
    with s, refusing_address() as address:
        try:
            s.connect(address)
        except (BlockingIOError, InterruptedError):
            pass
        except ConnectionRefusedError:
            pytest.skip("connect refused synchronously")
        events = wait_for(port, 7, timeout=10, regs=[Registration(s, 7, EVENT_IN | EVENT_OUT)])
        assert events is not None and events & EVENT_ERR
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0


def test_remove_after_op_remove(port):
    a, b = nonblocking_pair()
    with a, b:
        port.process([Registration(a, 8, EVENT_IN)], timeout=0)
        assert port.registered == 1
        events = wait_for(port, 8, regs=[Registration(a, 8, 0, OP_REMOVE)])
        assert events == EVENT_REMOVE
        assert port.registered == 0
        b.send(b"x")
        assert port.process(timeout=0.1) == []


def test_remove_of_unregistered_socket_raises(port):
    a, b = nonblocking_pair()
    with a, b:
        reg = Registration(a, 9, 0, OP_REMOVE)
        with pytest.raises(OSError) as info:
            port.process([reg], timeout=0)
        assert info.value.registration is reg
        assert reg.result != 0 and isinstance(reg.error, OSError)


def test_two_enables_of_one_registration_in_one_call(port):
    """A registration enabled twice in one call (asyncio's register() then
    modify() before the next select: connection_made adds a writer, the
    reader follows) is one registration with the last filter: both
    succeed, the socket's readiness comes once, under its key, and its
    REMOVE leaves nothing behind (no second registration the port lost
    track of, which the strict model's NO_ENABLE_WHILE_ARMED mode used to
    hand to the AFD fallback)."""
    a, b = nonblocking_pair()
    with a, b:
        first = Registration(a, 12, EVENT_IN)
        second = Registration(a, 12, EVENT_IN | EVENT_OUT)
        notes = port.process([first, second], timeout=2)
        assert first.result == 0 and second.result == 0
        assert notes == [(12, EVENT_OUT)]          # writable: the second filter
        assert port.registered == 1
        assert port.counters()["fallbacks"] == 0
        events = wait_for(port, 12, regs=[Registration(a, 12, 0, OP_REMOVE)])
        assert events == EVENT_REMOVE
        assert port.registered == 0
        b.send(b"x")
        assert port.process(timeout=0.2) == []


@pytest.mark.parametrize("op", [OP_REMOVE, OP_DISABLE])
def test_a_refused_remove_or_disable_does_not_block(port, op):
    """Port.process: "If any failed, the call does not block" -- a REMOVE
    or DISABLE refused (of a socket never registered here; of one closed
    since it was registered) as much as an ENABLE."""
    a, b = nonblocking_pair()
    with a, b:
        start = time.monotonic()
        with pytest.raises(OSError):
            port.process([Registration(a, 9, 0, op)], timeout=10)
        assert time.monotonic() - start < 5
    c, d = nonblocking_pair()
    port.process([Registration(c, 10, EVENT_IN, trigger=PERSISTENT)], timeout=0)
    fd = c.fileno()
    c.close()
    with d:
        start = time.monotonic()
        with pytest.raises(OSError):
            port.process([Registration(fd, 10, 0, op)], timeout=10)
        assert time.monotonic() - start < 5


def test_disable_then_enable(port):
    a, b = nonblocking_pair()
    with a, b:
        port.process([Registration(a, 10, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        port.process([Registration(a, 10, EVENT_IN, OP_DISABLE)], timeout=0)
        b.send(b"x")
        assert port.process(timeout=0.1) == []
        assert wait_for(port, 10, regs=[Registration(a, 10, EVENT_IN)]) & EVENT_IN


def test_post_wakes_waiter_in_another_thread(port):
    got = []
    waiter = threading.Thread(target=lambda: got.extend(port.process(timeout=10)))
    waiter.start()
    time.sleep(0.1)
    start = time.monotonic()
    port.post(1234)
    waiter.join(5)
    assert not waiter.is_alive()
    assert got == [(1234, 0)]
    assert time.monotonic() - start < 2


def test_several_threads_share_one_port_oneshot(port):
    """LEVEL|ONESHOT on one port: each readiness goes to exactly one thread."""
    pairs = [nonblocking_pair() for _ in range(20)]
    seen = []
    lock = threading.Lock()
    stop_key = 10_000

    def worker():
        while True:
            for key, _events in port.process(timeout=5):
                if key == stop_key:
                    port.post(stop_key)  # relay the exit to the next thread
                    return
                with lock:
                    seen.append(key)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    port.process([Registration(a, i, EVENT_IN) for i, (a, _) in enumerate(pairs)], timeout=0)
    for _, b in pairs:
        b.send(b"x")
    deadline = time.monotonic() + 5
    while len(seen) < len(pairs) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    port.post(stop_key)
    for t in threads:
        t.join(5)
    assert sorted(seen) == list(range(len(pairs)))
    for a, b in pairs:
        a.close()
        b.close()


@pytest.mark.parametrize("timeout", [0, -1])
def test_timeout_zero_or_negative_polls(port, timeout):
    start = time.monotonic()
    assert port.process(timeout=timeout) == []
    assert time.monotonic() - start < 0.5


def test_timeout_positive_waits_and_rounds_up(port):
    for timeout in (0.0001, 0.0105, 0.05):
        start = time.monotonic()
        assert port.process(timeout=timeout) == []
        elapsed = time.monotonic() - start
        # Rounded UP to whole milliseconds: never returns early (with the
        # clock's own granularity as slack).
        assert elapsed >= timeout - 0.002, (timeout, elapsed)


def test_timeout_none_waits_forever_until_post(port):
    def later():
        time.sleep(0.3)
        port.post(77)
    threading.Thread(target=later).start()
    start = time.monotonic()
    assert port.process(timeout=None) == [(77, 0)]
    assert time.monotonic() - start >= 0.25


def test_two_thousand_sockets_registered_at_once(port):
    pairs = [nonblocking_pair() for _ in range(1000)]
    try:
        socks = [s for p in pairs for s in p]
        regs = [Registration(s, i, EVENT_OUT) for i, s in enumerate(socks)]
        seen = set()
        deadline = time.monotonic() + 30
        first = True
        while len(seen) < len(socks) and time.monotonic() < deadline:
            for key, events in port.process(regs if first else (), timeout=1, max_events=512):
                assert events & EVENT_OUT
                seen.add(key)
            first = False
        assert all(reg.result == 0 for reg in regs)
        assert seen == set(range(len(socks)))
        assert port.registered == len(socks)
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_closed_and_reused_fd_gets_no_stale_notification(port):
    """A socket closed while a notification is queued for it; its handle
    value reused by a new registration: the old key never comes out."""
    for attempt in range(20):
        a, b = nonblocking_pair()
        b.send(b"x")
        port.process([Registration(a, 1000 + attempt, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        time.sleep(0.01)   # the readiness is now queued on the port
        old_fd = a.fileno()
        a.close()
        b.close()
        c, d = nonblocking_pair()
        with c, d:
            if c.fileno() != old_fd and d.fileno() != old_fd:
                continue
            reused = c if c.fileno() == old_fd else d
            new_key = 5000 + attempt
            notes = port.process([Registration(reused, new_key, EVENT_IN)], timeout=0.1)
            assert all(key != 1000 + attempt for key, _ in notes), notes
            # Nothing was sent to the new socket: it must not look readable.
            assert all(key != new_key for key, _ in notes), notes
            return
    pytest.skip("the OS never reused the handle value")


def test_notifications_survive_a_failed_registration(port):
    a, b = nonblocking_pair()
    with a, b:
        assert port.process([Registration(a, 11, EVENT_IN)], timeout=0) == []
        b.send(b"x")
        time.sleep(0.05)
        bad = Registration(b, 13, 0, OP_DISABLE)  # b was never registered: fails
        with pytest.raises(OSError):
            port.process([bad], timeout=0.5)
        assert bad.result != 0
        # The readiness of a dequeued by the failing call is not lost: the
        # next call hands it over (without waiting for the timeout).
        start = time.monotonic()
        assert port.process(timeout=5) == [(11, EVENT_IN)]
        assert time.monotonic() - start < 1


# -- bad input --------------------------------------------------------------

def test_closed_socket_object_is_value_error(port):
    a, b = nonblocking_pair()
    a.close()
    b.close()
    with pytest.raises(ValueError):
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)


def test_negative_fd_is_value_error(port):
    with pytest.raises(ValueError):
        port.process([Registration(-1, 1, EVENT_IN)], timeout=0)


def test_not_a_socket_raises_oserror(port):
    with tempfile.TemporaryFile() as f:
        with pytest.raises(OSError):
            port.process([Registration(f.fileno(), 1, EVENT_IN)], timeout=0)


def test_unopened_fd_raises_oserror(port):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    with pytest.raises(OSError):
        port.process([Registration(r, 1, EVENT_IN)], timeout=0)


@pytest.mark.parametrize("field, value", [
    ("events", 0x100), ("events", EVENT_ERR), ("op", 3), ("op", 9),
    ("trigger", 0x10), ("trigger", TRIGGER_ONESHOT | TRIGGER_PERSISTENT),
    ("trigger", TRIGGER_LEVEL | TRIGGER_EDGE), ("key", -1), ("key", 1 << 64), ("key", "k"),
])
def test_unknown_flags_are_value_errors(port, field, value):
    a, b = nonblocking_pair()
    with a, b:
        reg = Registration(a, 1, EVENT_IN)
        setattr(reg, field, value)
        with pytest.raises(ValueError):
            port.process([reg], timeout=0)
        assert port.registered == 0


def test_use_after_close_is_value_error(port):
    port.close()
    port.close()   # idempotent
    assert port.closed
    with pytest.raises(ValueError):
        port.process(timeout=0)
    with pytest.raises(ValueError):
        port.post(1)


def test_close_wakes_waiting_thread(port):
    result = []

    def wait():
        try:
            result.append(port.process(timeout=10))
        except ValueError as exc:
            result.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.1)
    port.close()
    t.join(5)
    assert not t.is_alive()
    assert result == [[]]


def test_context_manager():
    with Port() as p:
        assert not p.closed
    assert p.closed


def test_bad_post_key(port):
    with pytest.raises(ValueError):
        port.post(-5)


def test_unknown_backend_is_value_error():
    with pytest.raises(ValueError):
        Port("kqueue")


def test_unavailable_backend_is_clear_oserror():
    missing = [n for n, (ok, _) in port_module.available_backends().items() if not ok]
    if not missing:
        pytest.skip("every backend is available here")
    with pytest.raises(OSError, match="not available"):
        Port(missing[0])


def test_strict_backend_only_in_a_test_build():
    """A production build of the core (the wheels, ``pip install .``)
    carries no test code: no strict model, no controls; asking for the
    strict backend says how to get a build that has it."""
    if port_module.TEST_BUILD:
        assert hasattr(port_module.lib, "sn_model_control")
        return
    assert not hasattr(port_module.lib, "sn_model_control")
    assert not hasattr(port_module.lib, "SN_MODEL_REFUSE")
    available, why = BACKENDS["strict"]
    assert not available and "SOCKNOTIFY_TESTING=1" in why
    with pytest.raises(OSError, match="SOCKNOTIFY_TESTING=1") as raised:
        Port("strict")
    assert raised.value.errno == errno.ENOSYS
    with open(sys.modules["socknotify_loop._socknotify"].__file__, "rb") as f:
        assert b"SOCKNOTIFY_STRICT_MODES" not in f.read()   # sn_model.c's


def test_environment_variable_forces_backend(monkeypatch):
    monkeypatch.setenv("SOCKNOTIFY_BACKEND", AVAILABLE[-1])
    with Port() as p:
        assert p.backend == AVAILABLE[-1]
    monkeypatch.setenv("SOCKNOTIFY_BACKEND", "nonsense")
    with pytest.raises(ValueError):
        Port()


def test_max_events_limits_each_call(port):
    pairs = [nonblocking_pair() for _ in range(10)]
    try:
        port.process([Registration(a, i, EVENT_OUT, trigger=PERSISTENT)
                      for i, (a, _) in enumerate(pairs)], timeout=0)
        time.sleep(0.05)
        assert len(port.process(timeout=1, max_events=3)) <= 3
        with pytest.raises(ValueError):
            port.process(timeout=0, max_events=0)
    finally:
        for a, b in pairs:
            a.close()
            b.close()
