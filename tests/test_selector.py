"""NotifySelector: the stdlib selectors contract, on a deferred one-shot port.

What these tests pin down, beyond CPython's own test_selectors (bound in
tests/conformance): changes are only recorded until select(), which sends
them and the re-arms of last time's reports in ONE port call; each
registration gets its own port key so stale notifications are dropped; a
registration that fails at flush time is reported, not raised.
"""
from __future__ import annotations

import errno
import os
import selectors
import signal
import socket
import sys
import threading
import time

import pytest

from socknotify_loop.port import (EVENT_ERR, EVENT_HANGUP, EVENT_IN,
                                  OP_ENABLE, OP_REMOVE)
from socknotify_loop.selector import NotifySelector

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE


class BatchSpy:
    """Wraps the selector's port.process_batch and records every call."""

    def __init__(self, selector: NotifySelector) -> None:
        self.calls = []
        self.rearm_flags = []
        self.inject = []   # extra notifications to append to the next answer
        self._real = selector.port.process_batch
        selector.port.process_batch = self  # instance attribute shadows the method

    def __call__(self, changes, timeout, max_events, rearm=False):
        self.calls.append((list(changes), timeout))
        self.rearm_flags.append(rearm)
        notifications, failures = self._real(changes, timeout, max_events, rearm)
        if self.inject:
            notifications = list(notifications) + self.inject
            self.inject = []
        return notifications, failures


@pytest.fixture
def selector():
    sel = NotifySelector()
    yield sel
    sel.close()


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def ready_fds(result):
    return {(key.fd, mask) for key, mask in result}


# -- the stdlib's errors, raised where it raises them --------------------------------

def test_invalid_events_raise_value_error(selector, pair):
    for events in (0, 4, READ | 8, -1):
        with pytest.raises(ValueError):
            selector.register(pair[0], events)
    selector.register(pair[0], READ)
    with pytest.raises(ValueError):
        selector.modify(pair[0], 0)
    with pytest.raises(ValueError):
        selector.modify(pair[0], 16)


def test_invalid_file_objects_raise_value_error(selector):
    with pytest.raises(ValueError):
        selector.register(-1, READ)
    with pytest.raises(ValueError):
        selector.register(object(), READ)
    with pytest.raises(ValueError):
        selector.register("not a file", READ)

    class NegativeFileno:
        def fileno(self):
            return -5
    with pytest.raises(ValueError):
        selector.register(NegativeFileno(), READ)


def test_register_twice_and_unknown_raise_key_error(selector, pair):
    key = selector.register(pair[0], READ, "data")
    assert key == selectors.SelectorKey(pair[0], pair[0].fileno(), READ, "data")
    with pytest.raises(KeyError):
        selector.register(pair[0].fileno(), WRITE)   # same fd, other spelling
    with pytest.raises(KeyError):
        selector.unregister(pair[1])
    with pytest.raises(KeyError):
        selector.modify(pair[1], READ)
    with pytest.raises(KeyError):
        selector.get_key(pair[1])
    assert selector.unregister(pair[0]) is key
    with pytest.raises(KeyError):
        selector.unregister(pair[0])


def test_get_map_and_close(selector, pair):
    mapping = selector.get_map()
    key = selector.register(pair[0], READ)
    assert mapping[pair[0]] is key and mapping[pair[0].fileno()] is key
    assert list(mapping) == [pair[0].fileno()] and len(mapping) == 1
    assert pair[0] in mapping and pair[1] not in mapping
    selector.close()
    selector.close()   # idempotent
    assert selector.get_map() is None
    with pytest.raises(RuntimeError):
        selector.get_key(pair[0])
    with pytest.raises(KeyError):
        mapping[pair[0]]
    assert selector.port.closed


def test_unregister_closed_socket_object_does_not_raise(selector, pair):
    key = selector.register(pair[0], READ)
    selector.select(0)
    pair[0].close()   # fileno() is now -1: found by identity
    assert selector.unregister(pair[0]) is key
    assert selector.select(0) == []   # the failing REMOVE is ignored


# -- deferral and the one batched call -------------------------------------------------

def test_changes_are_deferred_to_select(selector, pair):
    selector.register(pair[1], WRITE)
    assert selector.port.registered == 0
    selector.select(0)
    assert selector.port.registered == 1


def test_one_port_call_per_select_carries_changes_and_rearms(selector, pair):
    spy = BatchSpy(selector)
    a, b = pair
    selector.register(a, READ)
    selector.register(b, WRITE)
    assert ready_fds(selector.select(0)) == {(b.fileno(), WRITE)}
    assert len(spy.calls) == 1
    changes, timeout = spy.calls[0]
    assert [c[3] for c in changes] == [OP_ENABLE, OP_ENABLE] and timeout == 0

    # Only b was reported: the next call asks the port to re-arm what it
    # delivered (b), in the same call, and hands no change of its own.
    assert ready_fds(selector.select(0)) == {(b.fileno(), WRITE)}
    changes, _ = spy.calls[1]
    assert changes == [] and spy.rearm_flags == [True, True]
    assert len(spy.calls) == 2
    # a was never reported, so it stays armed and is reported once readable.
    b.send(b"x")
    assert ready_fds(selector.select(1)) == {(a.fileno(), READ), (b.fileno(), WRITE)}
    assert len(spy.calls) == 3


def test_level_semantics_through_rearm(selector, pair):
    a, b = pair
    selector.register(a, READ)
    assert selector.select(0) == []
    b.send(b"x")
    for _ in range(3):   # unread data stays reported, select after select
        assert ready_fds(selector.select(1)) == {(a.fileno(), READ)}
    a.recv(1)
    assert selector.select(0) == []


def test_register_then_unregister_before_select_sends_nothing(selector, pair):
    spy = BatchSpy(selector)
    selector.register(pair[0], READ)
    selector.unregister(pair[0])
    selector.select(0)
    assert spy.calls[0][0] == []


def test_data_only_modify_sends_nothing(selector, pair):
    spy = BatchSpy(selector)
    selector.register(pair[0], READ, "old")
    selector.select(0)
    key = selector.modify(pair[0], READ, "new")
    assert key.data == "new" and selector.get_key(pair[0]).data == "new"
    selector.select(0)
    assert spy.calls[1][0] == []


def test_modify_changes_interest(selector, pair):
    a, _ = pair
    selector.register(a, READ)
    assert selector.select(0) == []
    selector.modify(a, WRITE)
    assert ready_fds(selector.select(0)) == {(a.fileno(), WRITE)}
    selector.modify(a, READ | WRITE)
    assert ready_fds(selector.select(0)) == {(a.fileno(), WRITE)}
    selector.modify(a, READ)
    assert selector.select(0) == []


def test_reregister_same_fd_sends_remove_then_enable_with_new_key(selector, pair):
    spy = BatchSpy(selector)
    a, b = pair
    selector.register(b, READ)
    selector.select(0)
    selector.unregister(b)
    selector.register(b, WRITE)
    assert ready_fds(selector.select(0)) == {(b.fileno(), WRITE)}
    changes = spy.calls[1][0]
    assert [c[3] for c in changes] == [OP_REMOVE, OP_ENABLE]
    assert changes[0][0] == changes[1][0] == b.fileno()
    assert changes[0][1] != changes[1][1], "a new registration needs a new port key"


def test_stale_notification_for_old_key_is_dropped(selector):
    a, b = socket.socketpair()
    selector.register(a, READ)
    spy = BatchSpy(selector)
    selector.select(0)
    old_key = spy.calls[0][0][0][1]
    selector.unregister(a)
    a.close()
    b.close()
    c, d = socket.socketpair()   # very likely reuses a's descriptor
    try:
        selector.register(c, READ)
        # The notification the port would have had queued for the old
        # registration (what a closed socket's packet looks like).
        spy.inject = [(old_key, EVENT_IN), (old_key, EVENT_ERR)]
        assert selector.select(0) == []
        d.send(b"!")
        assert ready_fds(selector.select(1)) == {(c.fileno(), READ)}
    finally:
        c.close()
        d.close()


def test_callback_unregisters_and_closes_other_socket(selector):
    """Both sockets ready; handling the first unregisters and closes the
    second and registers a new socket on the same descriptor: nothing ready
    may be reported for it later."""
    pairs = [socket.socketpair() for _ in range(2)]
    try:
        for reader, writer in pairs:
            selector.register(reader, READ)
            writer.send(b"x")
        ready = selector.select(1)
        assert len(ready) == 2
        first, second = ready[0][0].fileobj, ready[1][0].fileobj
        first.recv(1)
        selector.unregister(second)
        fd = second.fileno()
        second.close()
        fresh_r, fresh_w = socket.socketpair()
        pairs.append((fresh_r, fresh_w))
        # Make the reuse certain where descriptors can be duplicated onto a
        # number (on Windows, sockets are not CRT descriptors: the OS's own
        # handle reuse is relied on).
        if fresh_r.fileno() != fd and sys.platform != "win32":
            os.dup2(fresh_r.fileno(), fd)
            fresh_r.close()
            fresh_r = socket.socket(fileno=fd)
            pairs.append((fresh_r, fresh_w))
        selector.register(fresh_r, READ, "fresh")
        for _ in range(3):
            assert selector.select(0.01) == []
        fresh_w.send(b"y")
        assert [(k.data, m) for k, m in selector.select(1)] == [("fresh", READ)]
    finally:
        for reader, writer in pairs:
            reader.close()
            writer.close()


# -- failures at flush time ------------------------------------------------------------

def test_registering_a_socket_closed_before_select_reports_it(selector):
    a, b = socket.socketpair()
    fd = a.fileno()
    key = selector.register(fd, READ | WRITE)
    a.close()
    b.close()
    result = selector.select(0)   # must not raise
    assert result == [(key, READ | WRITE)]
    # Still registered, so still reported (like EPOLLERR) until unregistered.
    assert selector.select(0) == [(key, READ | WRITE)]
    selector.unregister(fd)
    assert selector.select(0) == []


# -- events mapping --------------------------------------------------------------------

def test_peer_close_wakes_reader(selector, pair):
    a, b = pair
    selector.register(a, READ)
    b.close()
    assert ready_fds(selector.select(1)) == {(a.fileno(), READ)}
    assert a.recv(1) == b""


def test_err_and_hangup_map_to_both_directions_masked_by_key(selector, pair):
    a, b = pair
    spy = BatchSpy(selector)
    ka = selector.register(a, READ)
    kb = selector.register(b, WRITE)
    selector.select(0)   # b reported writable
    keys = {change[0]: change[1] for change in spy.calls[0][0]}
    spy.inject = [(keys[a.fileno()], EVENT_ERR), (keys[b.fileno()], EVENT_HANGUP)]
    result = selector.select(0)
    assert (ka, READ) in result and (kb, WRITE) in result


def test_failed_connect_is_reported_to_a_writer(selector):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()   # nothing listens there now: connect is refused
    sock = socket.socket()
    sock.setblocking(False)
    try:
        try:
            sock.connect(("127.0.0.1", port))
        except (BlockingIOError, InterruptedError):
            pass
        except ConnectionRefusedError:
            pytest.skip("connect refused synchronously")
        selector.register(sock, WRITE)
        assert ready_fds(selector.select(2)) == {(sock.fileno(), WRITE)}
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED
    finally:
        sock.close()


# -- timeouts --------------------------------------------------------------------------

def test_timeouts_poll_round_up_and_block(selector, pair):
    selector.register(pair[0], READ)
    start = time.monotonic()
    assert selector.select(0) == [] and selector.select(-1) == []
    assert time.monotonic() - start < 0.5
    for timeout in (0.0001, 0.05):
        start = time.monotonic()
        assert selector.select(timeout) == []
        assert time.monotonic() - start >= timeout


def test_empty_selector_with_no_timeout_blocks(selector):
    outcome = []

    def wait():
        try:
            outcome.append(selector.select(None))
        except Exception as exc:   # closing the port under the waiter
            outcome.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive(), f"select(None) returned early: {outcome}"
    selector.port.close()   # wakes the waiter
    waiter.join(5)
    assert not waiter.is_alive()


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_signal_without_exception_resumes_wait(selector, pair):
    selector.register(pair[0], READ)
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *args: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        start = time.monotonic()
        assert selector.select(0.4) == []
        assert fired and time.monotonic() - start >= 0.4
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs setitimer")
def test_signal_handler_exception_interrupts_wait(selector, pair):
    class Interrupted(Exception):
        pass

    def handler(*args):
        raise Interrupted

    selector.register(pair[0], READ)
    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        start = time.monotonic()
        with pytest.raises(Interrupted):
            selector.select(5)
        assert time.monotonic() - start < 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_many_sockets(selector):
    pairs = [socket.socketpair() for _ in range(600)]
    try:
        for reader, writer in pairs:
            selector.register(reader, READ, writer)
        for _, writer in pairs[::3]:
            writer.send(b"x")
        seen = set()
        deadline = time.monotonic() + 5
        while len(seen) < len(pairs[::3]) and time.monotonic() < deadline:
            for key, mask in selector.select(1):
                key.fileobj.recv(1)
                seen.add(key.fd)
        assert seen == {reader.fileno() for reader, _ in pairs[::3]}
    finally:
        for reader, writer in pairs:
            reader.close()
            writer.close()


def test_backend_property(selector):
    assert selector.backend == selector.port.backend
    if sys.platform.startswith("linux"):
        assert selector.backend == "epoll"


def test_exception_during_select_rearms_everything(selector):
    """A KeyboardInterrupt raised by a signal handler right after the wait
    loses the notifications of that call: every registration must be armed
    again by the next select(), or it would never be reported again."""
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        for reader, writer in pairs:
            selector.register(reader, READ)
            writer.send(b"x")
        real = selector.port.process_batch

        def dequeue_then_interrupt(changes, timeout, max_events, rearm=False):
            real(changes, timeout, max_events, rearm)   # dequeues (disarms) them all
            raise KeyboardInterrupt

        selector.port.process_batch = dequeue_then_interrupt
        with pytest.raises(KeyboardInterrupt):
            selector.select(1)
        del selector.port.process_batch
        assert ready_fds(selector.select(1)) == {(r.fileno(), READ) for r, _ in pairs}
    finally:
        for reader, writer in pairs:
            reader.close()
            writer.close()


def test_posted_packet_wakes_a_blocked_select(selector, pair):
    from socknotify_loop.selector import WAKEUP_KEY
    selector.register(pair[0], READ)
    results = []
    waiter = threading.Thread(target=lambda: results.append(selector.select(None)))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive()
    selector.port.post(WAKEUP_KEY)
    waiter.join(5)
    assert not waiter.is_alive() and results == [[]]


def test_io_completion_is_kept_not_dropped(selector, pair):
    from socknotify_loop.port import EVENT_IO
    selector.register(pair[0], READ)
    answers = [([(0x7FFF12340000, EVENT_IO)], [])]

    def one_completion(changes, timeout, max_events, rearm=False):
        return answers.pop()   # a second wait would raise IndexError

    selector.port.process_batch = one_completion
    assert selector.select(None) == []   # returns: something came
    assert selector.io_completions == [0x7FFF12340000]
