"""The selector's registrations on epoll: one-shot in the kernel, each
re-arm one EPOLL_CTL_MOD, and so an item whose descriptor was closed while
its file lives on (a dup, a child holding it) fires at most once and never
makes a wait spin. These tests pin the costs (what a ping-pong and an
unregister/register pair cost in epoll_ctl), the semantics (level
readiness at every select, one-shot between them) and the orphans."""
from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time

import pytest
from _sockets import nonblocking_pair

from socknotify_loop.selector import NotifySelector

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="epoll only"),
    pytest.mark.timeout(30),
]

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE
IDLE_CPU_LIMIT = 0.2


pair = nonblocking_pair


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


def test_steady_state_is_one_wait_and_one_rearm(sel):
    """A ping-pong's iteration is one epoll_wait and the EPOLL_CTL_MOD that
    re-arms what the previous select reported."""
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
        assert after["changes"] - before["changes"] == 200
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
        idle(sel, 0.5, plain=True)        # delivered, not re-armed: disarmed
        assert ready(sel, 1) == [("a", READ)]   # the re-arm
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
    lives on (a dup, or a child holding it): the item is orphaned in epoll,
    disarmed. The next select(1.0) idles, the other registrations work,
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
        # EpollSelector goes on reporting the orphan until unregister; here
        # the re-arm of the closed descriptor fails, so it is silent.
        assert ready(reference, 0) == [("a", READ)]
        assert ready(sel, 0.2) == []
        sel.unregister(fd)
        reference.unregister(fd)
        idle(sel, 1.0)
        assert sel.port.os_handle == handle
        d.send(b"y")
        assert ready(sel, 1) == [("c", READ)]
    finally:
        reference.close()
        for s in (a, b, c, d):
            s.close()
        if kept is not None:
            os.close(kept)
        if child is not None:
            child.kill()
            child.wait()


def test_orphan_met_by_a_plain_process(sel):
    """The socket is closed while its registration is delivered and not
    yet re-armed: the disarmed item can never fire, and the wait idles."""
    a, b = pair()
    kept = None
    try:
        sel.register(a, READ, "a")
        reported_twice(sel, a, b)
        kept = os.dup(a.fileno())
        a.close()
        idle(sel, 1.0, plain=True)
    finally:
        a.close()
        b.close()
        if kept is not None:
            os.close(kept)


# -- unregister and register again ----------------------------------------------------


def test_unregister_then_register_costs_what_epoll_selector_pays(sel):
    """asyncio's sock_recv removes its reader in a done callback and the
    next sock_recv adds it back before the loop selects again: the pair
    costs an EPOLL_CTL_DEL (made while the descriptor is surely open) and
    an EPOLL_CTL_ADD, as with EpollSelector, and readiness goes to the new
    key only."""
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
        assert sel.port.counters()["changes"] - before == 100
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


def test_an_unregister_queues_nothing_and_its_tag_is_never_reused(sel):
    """On epoll the item leaves the kernel at unregister(), from any
    thread: the next select needs no preparation (the loop's iteration
    keeps its cheapest call), and a registration made next gets a new tag,
    so an answer in flight naming the old one reaches nobody."""
    import threading
    view = sel.loop_view
    a, b = pair()
    c, d = pair()
    try:
        sel.register(a, READ)
        tag = sel._records[a.fileno()].tag
        sel.unregister(a)
        assert not view.pending and tag not in view.keys
        sel.register(a, READ)
        assert sel._records[a.fileno()].tag > tag

        def elsewhere():
            sel.register(c, READ)
            sel.unregister(c)
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join(10)
        assert not view.pending
        b.send(b"x")
        assert [key.fileobj for key, _ in sel.select(1)] == [a]
    finally:
        for s in (a, b, c, d):
            s.close()
