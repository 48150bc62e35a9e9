"""Lazy re-arms on epoll: the selector's one-shot registrations are level
and persistent in the kernel, the port keeps the one-shot rule, and an
item that outlives its descriptor is dropped by rebuilding the interest
set. These tests pin the three promises: no epoll_ctl in the steady
state, the same readiness as selectors.EpollSelector, and no spin on an
orphaned item, whoever keeps its file open; and the unregister that waits
for the next select, so that an unregister and a register of the same
descriptor in one iteration cost one epoll_ctl."""
from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import threading
import time

import pytest

from socknotify_loop.port import EVENT_IN, Registration
from socknotify_loop.selector import NotifySelector

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="epoll only"),
    pytest.mark.timeout(30),
]

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
IDLE_CPU_LIMIT = 0.2


def pair():
    a, b = socket.socketpair()
    a.setblocking(False)
    b.setblocking(False)
    return a, b


def pair_on_number(number):
    """A connected pair whose first socket has descriptor ``number`` (just
    closed by the caller): the kernel's next number, or moved there."""
    sock, peer = pair()
    if sock.fileno() != number:
        os.dup2(sock.fileno(), number)
        sock.close()
        sock = socket.socket(fileno=number)
        sock.setblocking(False)
    return sock, peer


def ready(sel, timeout=0.0):
    return sorted((key.data, mask) for key, mask in sel.select(timeout))


def reported_twice(sel, a, b, data=b"unread"):
    """``a`` registered as "a" with input pending, reported by two selects:
    the second re-arms it, so from then on its item is lazy (level and
    persistent in epoll)."""
    b.send(data)
    for _ in range(2):
        assert ready(sel, 1) == [("a", READ)]


def idle(sel, timeout=1.0, plain=False):
    """select (or a plain process) that must wait the whole timeout,
    report nothing, and burn little CPU."""
    wall, cpu = time.monotonic(), time.process_time()
    got = sel.port.process([], timeout) if plain else sel.select(timeout)
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert list(got) == []
    assert wall >= timeout * 0.9, wall
    assert cpu < IDLE_CPU_LIMIT, f"waiting {timeout} s burnt {cpu:.2f} s of CPU"


@pytest.fixture
def sel():
    selector = NotifySelector("epoll")
    try:
        yield selector
    finally:
        selector.close()


def test_steady_state_makes_no_epoll_ctl(sel):
    """A ping-pong's iteration is one epoll_wait and nothing else."""
    a, b = pair()
    try:
        sel.register(a, READ, "a")
        for _ in range(3):
            b.send(b"x")
            assert ready(sel, 1) == [("a", READ)]
            a.recv(10)
        before = sel.port.counters()
        for _ in range(200):
            b.send(b"x")
            assert ready(sel, 1) == [("a", READ)]
            a.recv(10)
        after = sel.port.counters()
        assert after["changes"] - before["changes"] == 0
        assert after["waits"] - before["waits"] == 200
    finally:
        a.close()
        b.close()


def test_still_level_triggered_and_still_one_shot(sel):
    """Undrained input is reported at every select, drained input never;
    and between two selects (a plain process in between) a reported
    registration is not reported again, nor does the wait spin on it."""
    a, b = pair()
    try:
        sel.register(a, READ, "a")
        b.send(b"xyz")
        for _ in range(4):
            assert ready(sel, 1) == [("a", READ)]
        idle(sel, 0.5, plain=True)        # delivered, not re-armed: parked
        assert ready(sel, 1) == [("a", READ)]   # the re-arm after parking
        a.recv(10)
        assert ready(sel, 0) == []
        b.send(b"!")
        assert ready(sel, 1) == [("a", READ)]
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("keeper", ["dup", "child"])
def test_orphan_closed_before_unregister_is_dropped(sel, keeper):
    """A reported socket is closed BEFORE it is unregistered while its file
    lives on (a dup, or a child holding it): the item is orphaned in epoll.
    Until unregister the selector reports it as EpollSelector does; after
    unregister the next select(1.0) idles, the other registrations work,
    and the port's descriptor number is unchanged."""
    a, b = pair()
    c, d = pair()
    child = kept = None
    reference = selectors.EpollSelector()
    try:
        sel.register(a, READ, "a")
        sel.register(c, READ, "c")
        reference.register(a, READ, "a")
        reported_twice(sel, a, b)
        if keeper == "dup":
            kept = os.dup(a.fileno())
        else:
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(30)"],
                pass_fds=[a.fileno()], stdin=subprocess.DEVNULL)
        fd = a.fileno()
        handle = sel.port.os_handle
        a.close()
        assert ready(reference, 0) == [("a", READ)]
        assert ready(sel, 1) == [("a", READ)]
        sel.unregister(fd)
        reference.unregister(fd)
        idle(sel, 1.0)
        assert sel.port.counters()["rebuilds"] == 1
        assert sel.port.os_handle == handle
        d.send(b"y")
        assert ready(sel, 1) == [("c", READ)]
    finally:
        reference.close()
        for s in (a, b):
            s.close()
        if kept is not None:
            os.close(kept)
        if child is not None:
            child.kill()
            child.wait()


def test_orphan_met_by_a_plain_process(sel):
    """The orphan fires while its registration is delivered and not yet
    re-armed: the park fails (the number is closed), the interest set is
    rebuilt, and the wait idles."""
    a, b = pair()
    kept = None
    try:
        sel.register(a, READ, "a")
        reported_twice(sel, a, b)
        kept = os.dup(a.fileno())
        a.close()
        idle(sel, 1.0, plain=True)
        assert sel.port.counters()["rebuilds"] == 1
    finally:
        a.close()
        b.close()
        if kept is not None:
            os.close(kept)


def test_rebuild_keeps_every_registration_as_it_was(sel):
    """Registrations in every state survive a rebuild as they were: armed
    with input pending (reported next), delivered and not yet re-armed
    (reported at its re-arm), writable, and one whose number was closed
    and taken by another socket (never carried over to the newcomer)."""
    pairs = [pair() for _ in range(5)]
    (armed, armed_w), (rearm, rearm_w), (writer, _w), (gone, gone_w), (orphan, orphan_w) = pairs
    extra = []
    kept = None
    try:
        sel.register(armed, READ, "armed")
        sel.register(rearm, READ, "rearm")
        sel.register(writer, WRITE, "writer")
        sel.register(gone, READ, "gone")
        sel.register(orphan, READ, "orphan")
        orphan_w.send(b"o")
        rearm_w.send(b"r")
        assert ready(sel, 1) == [("orphan", READ), ("rearm", READ), ("writer", WRITE)]
        assert ready(sel, 1) == [("orphan", READ), ("rearm", READ), ("writer", WRITE)]
        # "gone" is closed without unregister and its number reused.
        number = gone.fileno()
        gone.close()
        newcomer, newcomer_w = pair_on_number(number)
        extra += [newcomer, newcomer_w]
        newcomer_w.send(b"n")
        # The orphan: closed before unregister, its file kept by a dup.
        kept = os.dup(orphan.fileno())
        orphan_number = orphan.fileno()
        orphan.close()
        sel.unregister(orphan_number)
        armed_w.send(b"a")
        # Each select meets the orphan's stale key; the second sighting in
        # a row rebuilds the interest set.
        first = ready(sel, 1)
        second = ready(sel, 0)
        assert sel.port.counters()["rebuilds"] == 1
        expected = [("armed", READ), ("rearm", READ), ("writer", WRITE)]
        assert first == second == expected
        assert ready(sel, 0) == expected
        armed.recv(10)
        rearm.recv(10)
        sel.unregister(writer)
        assert ready(sel, 0) == []
        idle(sel, 0.5)
    finally:
        for s, w in pairs:
            s.close()
            w.close()
        for s in extra:
            s.close()
        if kept is not None:
            os.close(kept)


def test_waiter_in_another_thread_survives_a_rebuild(sel):
    """A thread blocked in the port while the interest set is replaced is
    woken, waits on the new set, and gets the next event."""
    a, b = pair()
    kept = None
    results = []
    try:
        sel.register(a, READ, "a")
        reported_twice(sel, a, b)
        a.recv(100)
        assert ready(sel, 0) == []         # re-armed, and nothing to read
        watched_c, watched_d = pair()
        sel.port.process([Registration(watched_c, 77, EVENT_IN)], 0)

        def wait():
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                notes = sel.port.process([], 0.5)
                if any(key == 77 for key, _events in notes):
                    results.append(time.monotonic())
                    return

        thread = threading.Thread(target=wait)
        thread.start()
        time.sleep(0.2)
        kept = os.dup(a.fileno())
        fd = a.fileno()
        a.close()                          # before unregister: an orphan
        sel.unregister(fd)
        b.send(b"orphan fires")
        deadline = time.monotonic() + 5
        while sel.port.counters()["rebuilds"] == 0 and time.monotonic() < deadline:
            sel.select(0.1)
        assert sel.port.counters()["rebuilds"] == 1
        sent = time.monotonic()
        watched_d.send(b"w")
        thread.join(6)
        assert results, "the waiter never saw the event after the rebuild"
        assert results[0] - sent < 1.0
        watched_c.close()
        watched_d.close()
    finally:
        for s in (a, b):
            s.close()
        if kept is not None:
            os.close(kept)


# -- unregister deferred to the next select ------------------------------------------


def test_unregister_then_register_in_one_iteration_is_one_epoll_ctl(sel):
    """asyncio's sock_recv removes its reader in a done callback and the
    next sock_recv adds it back before the loop selects again: the pair
    costs one EPOLL_CTL_MOD, and readiness goes to the new key only."""
    a, b = pair()
    try:
        sel.register(a, READ, "first")
        b.send(b"x")
        assert ready(sel, 1) == [("first", READ)]
        a.recv(10)
        before = sel.port.counters()["changes"]
        for n in range(50):
            sel.unregister(a)
            sel.register(a, READ, n)
            b.send(b"x")
            assert ready(sel, 1) == [(n, READ)]
            a.recv(10)
        assert sel.port.counters()["changes"] - before == 50
    finally:
        a.close()
        b.close()


def test_unregister_close_reuse_register_watches_the_new_file(sel):
    """Unregistered, closed, its number taken by a new socket, registered
    again before any select: the new socket is watched, and nothing of the
    old one (readable when it was closed) is ever reported."""
    a, b = pair()
    extra = []
    try:
        sel.register(a, READ, "old")
        b.send(b"old data")
        assert ready(sel, 1) == [("old", READ)]
        number = a.fileno()
        sel.unregister(a)
        a.close()
        c, d = pair_on_number(number)
        extra += [c, d]
        sel.register(c, READ, "new")
        assert ready(sel, 0) == []
        d.send(b"new data")
        assert ready(sel, 1) == [("new", READ)]
    finally:
        for s in [a, b, *extra]:
            s.close()


def test_unregister_then_close_before_select_waits_quietly(sel):
    """The REMOVE meets a closed descriptor at the next select: that select
    neither reports it nor returns early, and burns no CPU."""
    a, b = pair()
    try:
        sel.register(a, READ, "a")
        reported_twice(sel, a, b, b"x")
        sel.unregister(a)
        a.close()
        idle(sel, 1.0)
    finally:
        a.close()
        b.close()
