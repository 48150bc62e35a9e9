"""The strict model of ProcessSocketNotifications (backend ``strict``,
Windows only), and the port, selector and loop on it.

Two kinds of tests:

- The model's rules, asked through the bare function (the questions of
  ``python -m socknotify_loop --probe-os``): each is asked of the model,
  which must answer as Microsoft's documentation reads at its strictest,
  and of the forgiving AFD polyfill, which must NOT (marked xfail strict:
  if the polyfill ever answered like the model, the question would test
  nothing).
- The port, the selector and the loop on the model, where the forgiving
  polyfill let them break a documented rule: one kernel key per socket
  until its REMOVE is dequeued, refused registrations, whole-call
  failures, REMOVEs on close, notifications queued before DISABLE/REMOVE,
  edges.
"""
from __future__ import annotations

import asyncio
import io
import socket
import threading
import time

import pytest
from _platform import WINDOWS
from _sockets import nonblocking_pair

from socknotify_loop import Loop, probe
from socknotify_loop.launcher import main
from socknotify_loop.port import (
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
    available_backends,
    lib,
)
from socknotify_loop.selector import EVENT_READ, EVENT_WRITE, NotifySelector

pytestmark = pytest.mark.skipif(not WINDOWS, reason="the strict model runs on Windows only")

if WINDOWS and not hasattr(lib, "sn_model_control"):
    # The model and its controls are in a test build only
    # (SOCKNOTIFY_TESTING=1: SN_TESTING, socknotify.h's CDEF-TESTING part):
    # a production build here would skip every test below in silence.
    raise ImportError("the strict model's tests need a test build of the core "
                      "(SOCKNOTIFY_TESTING=1; tools/wine test and all make one)")

ONESHOT = TRIGGER_LEVEL | TRIGGER_ONESHOT
PERSISTENT = TRIGGER_LEVEL | TRIGGER_PERSISTENT
ERROR_INVALID_PARAMETER = 87
WSAEOPNOTSUPP = 10045


def control(port: Port, what: int, sock=None, value: int = 0) -> int:
    fd = sock.fileno() if sock is not None else 0
    answer = lib.sn_model_control(port._handle, what, fd, value)
    assert answer >= 0, answer
    return int(answer)


def refuse(port: Port, sock) -> None:
    control(port, lib.SN_MODEL_REFUSE, sock, 1)


def named_modes(name) -> int:
    """SN_MODEL_<name> (None: no mode), read when a test runs: a
    production build, where these tests skip, has no such names."""
    return 0 if name is None else int(getattr(lib, f"SN_MODEL_{name}"))


def set_modes(port: Port, modes: int) -> None:
    """Give the port's model these SN_MODEL_MODE_* flags."""
    control(port, lib.SN_MODEL_MODES, None, modes)


#: Calls a test tells the model to fail: more than the port makes while it
#: takes a failed batch apart, so that the failure is the port's own.
FAIL_FOR_GOOD = 1000


def socket_on_handle(handle: int, tries: int = 64) -> tuple[socket.socket, socket.socket]:
    """A connected pair whose first socket has the handle value ``handle``
    (closed just before): Windows hands values out again at once. Skips
    if none comes."""
    spare = []
    try:
        for _ in range(tries):
            a, b = nonblocking_pair()
            if a.fileno() == handle:
                return a, b
            if b.fileno() == handle:
                return b, a
            spare += [a, b]
    finally:
        for s in spare:
            s.close()
    pytest.skip("no new socket took the closed handle value")


def wait_for(port, key, timeout=2.0, regs=()):
    deadline = time.monotonic() + timeout
    regs = list(regs)
    while time.monotonic() < deadline:
        for k, events in port.process(regs, timeout=0.1):
            if k == key:
                return events
        regs = []
    return None


# -- the model's rules, against the forgiving polyfill --------------------------------

#: What the strict model answers, question by question (probe.QUESTIONS).
MODEL_ANSWERS = probe.MODEL_ANSWERS
#: Questions both answer alike (a fixed rule of the polyfill's, or where
#: the forgiving and the strict reading agree). The model's default answers
#: the last eight as the polyfill does; its modes (SN_MODEL_MODE_*) take
#: the harsher readings, which the port is tested against.
SAME_ON_AFD = {"port closed after the socket's REMOVE", "ENABLE without LEVEL or EDGE",
               "closed handle in a batch", "LEVEL|ONESHOT re-armed, data unread",
               "ENABLE of an armed registration, new filter",
               "socket closed before its REMOVE event",
               "closesocket() with a notification queued",
               "socket tied by CreateIoCompletionPort", "failed connect, OUT-only filter",
               "DISABLE without trigger flags", "a notification's lpOverlapped",
               "two ENABLEs of one registration in one call", "REMOVE sent to another port",
               "ENABLE (new filter) with a notification queued"}


@pytest.mark.parametrize("question", probe.QUESTIONS, ids=lambda q: q.name)
def test_model_answers_strictly(question):
    assert probe.ask(question, "strict") == MODEL_ANSWERS[question.name]


@pytest.mark.parametrize("question", [q for q in probe.QUESTIONS if q.name not in SAME_ON_AFD],
                         ids=lambda q: q.name)
@pytest.mark.xfail(strict=True, reason="the AFD polyfill forgives this rule")
def test_forgiving_polyfill_answers_otherwise(question):
    assert probe.ask(question, "afd") == MODEL_ANSWERS[question.name]


@pytest.mark.parametrize("mode, question, answer", [
    ("NO_ENABLE_WHILE_ARMED", probe.two_enables_in_one_call,
     f"second refused (error {ERROR_INVALID_PARAMETER})"),
    ("REMOVE_ANY_PORT", probe.remove_from_another_port,
     "accepted: the first port's registration removed"),
    ("ENABLE_OVERWRITES", probe.second_port_enable_who_hears,
     "accepted, overwrites: only the second port hears"),
    ("QUEUED_BEFORE_MODIFY", probe.modify_with_a_notification_queued,
     "queued notification delivered"),
])
def test_model_answers_the_harsher_readings_in_its_modes(monkeypatch, mode, question, answer):
    """The questions the port's latest rules rest on, asked of the model
    in the mode that takes the harsher reading of the documentation: what
    the OS may do, which the port must survive (probe.MODEL_ANSWERS holds
    the default's answers)."""
    monkeypatch.setenv("SOCKNOTIFY_STRICT_MODES", str(getattr(lib, f"SN_MODEL_MODE_{mode}")))
    assert question("strict") == answer


def test_probe_asks_windows_itself():
    answer = probe.bsp_state_after_reset()
    assert answer.startswith(("answers after the reset", "fails after the reset")), answer


def test_probe_compares_answers_by_meaning():
    assert probe.meaning("refused (error 87)") == probe.meaning("refused (error 10045)")
    assert probe.meaning("refused (call 0, results [87, 0])") == "refused"
    assert probe.meaning("its registration failed (error 1168), the rest applied") == \
        probe.meaning("its registration failed (error 10038), the rest applied")
    assert probe.meaning("accepted") != probe.meaning("refused (error 87)")


@pytest.mark.timeout(120)
def test_probe_tells_a_windows_11_owner_what_to_send(monkeypatch):
    """Where the OS has the function, the report ends by asking for the
    whole output back, and marks every answer that differs in meaning."""
    real = probe.available_backends()
    faked = dict(real, psn=(True, "pretended for the test"))
    monkeypatch.setattr(probe, "available_backends", lambda: faked)
    monkeypatch.setattr(probe, "QUESTIONS", probe.QUESTIONS[:2])
    out = io.StringIO()
    probe.probe(out)
    text = out.getvalue()
    assert "Please send this whole output back" in text
    assert "--info" in text
    assert "differs from the model" in text     # psn's answers are errors here


def test_model_fails_a_whole_call_and_changes_nothing():
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        control(port, lib.SN_MODEL_FAIL_CALLS, None, FAIL_FOR_GOOD)
        reg = Registration(a, 1, EVENT_IN)
        with pytest.raises(OSError):
            port.process([reg], timeout=0)
        control(port, lib.SN_MODEL_FAIL_CALLS, None, 0)
        assert reg.result != 0
        assert control(port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_UNTIED


def test_model_refuses_a_chosen_socket():
    a, b = nonblocking_pair()
    with a, b, probe.RawPort("strict") as raw, Port("strict") as port:
        refuse(port, a)
        try:
            rc, results, _ = raw.call([(a, 1, EVENT_IN, 1, ONESHOT)], 0, 0)
            assert rc == 0 and results == [WSAEOPNOTSUPP]
        finally:
            control(port, lib.SN_MODEL_REFUSE, a, 0)
        rc, results, _ = raw.call([(a, 1, EVENT_IN, 1, ONESHOT)], 0, 0)
        assert rc == 0 and results == [0]


def test_model_refusal_ends_with_the_socket():
    """A refused socket closed, its handle value reused: the new socket is
    not refused (the model tells them apart, as the OS would)."""
    a, b = nonblocking_pair()
    with Port("strict") as port:
        refuse(port, a)
        old = a.fileno()
        a.close()
        b.close()
        for _ in range(20):
            c, d = nonblocking_pair()
            with c, d:
                if old in (c.fileno(), d.fileno()):
                    reused = c if c.fileno() == old else d
                    port.process([Registration(reused, 1, EVENT_IN)], timeout=0)
                    assert port.counters()["fallbacks"] == 0
                    return
        pytest.skip("the OS never reused the handle value")


def test_probe_os_command_under_wine_runs_the_model():
    out = io.StringIO()
    assert main(["--probe-os"], out) == 0
    text = out.getvalue()
    assert "the strict model assumes" in text
    for question in probe.QUESTIONS:
        assert question.name in text
    for name, _ in probe.OS_QUESTIONS:
        assert name in text
    if not available_backends()["psn"][0]:
        assert "the OS did" not in text


# -- the port on the model --------------------------------------------------------------

def test_port_rekey_keeps_notifications():
    """ENABLE of a live socket under a new key: the kernel keeps the old
    one, so the port must not invent a new kernel key (deaf socket)."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        port.process([Registration(a, 2, EVENT_IN)], timeout=0)
        b.send(b"x")
        assert wait_for(port, 2) == EVENT_IN


def test_port_remove_then_enable_in_one_batch():
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        notes = port.process([Registration(a, 1, 0, OP_REMOVE),
                              Registration(a, 2, EVENT_IN)], timeout=0.2)
        b.send(b"x")
        deadline = time.monotonic() + 3
        while (2, EVENT_IN) not in notes and time.monotonic() < deadline:
            notes += port.process(timeout=0.1)
        # The REMOVE under the old key, then notifications under the new.
        assert notes == [(1, EVENT_REMOVE), (2, EVENT_IN)]


def test_port_reports_nothing_queued_before_disable_or_remove():
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        b.send(b"x")
        time.sleep(0.05)
        assert port.process([Registration(a, 1, EVENT_IN, OP_DISABLE)], timeout=0.2) == []
        assert port.process(timeout=0.1) == []
        notes = port.process([Registration(a, 1, 0, OP_REMOVE)], timeout=0.2)
        notes += port.process(timeout=0.1)
        assert notes == [(1, EVENT_REMOVE)]


@pytest.mark.parametrize("op", [OP_DISABLE, OP_REMOVE])
def test_port_reports_nothing_queued_before_the_change(op):
    """A notification queued (by the model, at a known moment) before a
    DISABLE or a REMOVE, and dequeued by the call that applies it: only a
    REMOVE's own event may reach the caller."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        control(port, lib.SN_MODEL_QUEUE, a, EVENT_IN)
        notes = port.process([Registration(a, 1, EVENT_IN, op, trigger=PERSISTENT)],
                             timeout=0.2)
        deadline = time.monotonic() + 2
        while op == OP_REMOVE and (1, EVENT_REMOVE) not in notes and \
                time.monotonic() < deadline:
            notes += port.process(timeout=0.1)
        notes += port.process(timeout=0.1)
        assert notes == ([(1, EVENT_REMOVE)] if op == OP_REMOVE else [])


def test_port_enable_while_its_remove_event_is_on_its_way():
    """The REMOVING path itself: the REMOVE reaches the OS in a call that
    dequeues nothing, so its event is still on its way when the ENABLE
    under a new key comes. The ENABLE must wait for that event (the OS
    keeps the old key until then), then notify under the new key."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        # A register-only call (the selector's change path): no dequeue.
        assert lib.sn_port_change(port._handle, a.fileno(), 1, 0, OP_REMOVE, 0) == 0
        assert control(port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_TIED_REMOVING
        notes = port.process([Registration(a, 2, EVENT_IN)], timeout=0)
        b.send(b"x")
        deadline = time.monotonic() + 3
        while (2, EVENT_IN) not in notes and time.monotonic() < deadline:
            notes += port.process(timeout=0.1)
        # (That REMOVE was a quiet one: its event is not reported.)
        assert notes == [(2, EVENT_IN)]


@pytest.mark.parametrize("backend", ["afd", "strict"])
def test_port_enable_without_level_or_edge_is_refused(backend):
    """ProcessSocketNotifications wants LEVEL or EDGE with ENABLE; the port
    and the polyfill refuse it too, so no backend accepts what the OS
    would not."""
    a, b = nonblocking_pair()
    with a, b, Port(backend) as port:
        reg = Registration(a, 1, EVENT_IN, trigger=TRIGGER_ONESHOT)
        with pytest.raises(OSError):
            port.process([reg], timeout=0)
        assert reg.result == ERROR_INVALID_PARAMETER
        assert port.registered == 0


def test_polyfill_alone_refuses_enable_without_level_or_edge():
    """The polyfill's own check of the rule, with no port in front of it
    (the bare function) and no model above it."""
    question = next(q for q in probe.QUESTIONS if q.name == "ENABLE without LEVEL or EDGE")
    assert probe.ask(question, "afd") == f"refused (error {ERROR_INVALID_PARAMETER})"


def test_port_alone_refuses_enable_without_level_or_edge():
    """The port's own check of the rule: the ENABLE never reaches the
    function (a caller's ENABLE that does costs a call of its own before
    the wait), so the model's and the polyfill's checks behind it are not
    what refused it."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        before = port.counters()["waits"]
        reg = Registration(a, 1, EVENT_IN, trigger=TRIGGER_PERSISTENT)
        with pytest.raises(OSError):
            port.process([reg], timeout=1)
        assert reg.result == ERROR_INVALID_PARAMETER
        assert port.counters()["waits"] - before == 1


def test_port_edge_needs_draining():
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 4, EVENT_IN, trigger=TRIGGER_EDGE | TRIGGER_PERSISTENT)],
                     timeout=0)
        b.send(b"1")
        assert wait_for(port, 4) & EVENT_IN
        b.send(b"2")              # not drained: no rising edge
        assert port.process(timeout=0.2) == []
        assert a.recv(10) == b"12"
        with pytest.raises(BlockingIOError):
            a.recv(10)            # drained to WSAEWOULDBLOCK
        port.process(timeout=0)   # the model sees the fall
        b.send(b"3")
        assert wait_for(port, 4) & EVENT_IN


def check_refused_socket_falls_back(modes: int = 0) -> None:
    """A socket the model refuses (on a model with these SN_MODEL_MODE_*
    flags) is served by the polyfill instead: its readiness comes within
    the call, counted as one fallback, and it re-arms and is removed like
    any other registration."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        if modes:
            set_modes(port, modes)
        refuse(port, a)
        try:
            b.send(b"x")
            start = time.monotonic()
            assert port.process([Registration(a, 1, EVENT_IN)], timeout=5) == [(1, EVENT_IN)]
            assert time.monotonic() - start < 2
            assert port.counters()["fallbacks"] == 1
            a.recv(10)
            b.send(b"y")
            assert wait_for(port, 1, regs=[Registration(a, 1, EVENT_IN)]) == EVENT_IN
            assert wait_for(port, 1, regs=[Registration(a, 1, 0, OP_REMOVE)]) == EVENT_REMOVE
        finally:
            lib.sn_model_control(port._handle, lib.SN_MODEL_REFUSE, a.fileno(), 0)


def test_refused_socket_falls_back_to_the_polyfill():
    check_refused_socket_falls_back()


def test_port_close_removes_so_the_next_port_accepts():
    a, b = nonblocking_pair()
    with a, b:
        with Port("strict") as first:
            first.process([Registration(a, 1, EVENT_IN)], timeout=0)
            # The REMOVEs of close() happen below.
        with Port("strict") as second:
            second.process([Registration(a, 1, EVENT_IN)], timeout=0)
            assert second.counters()["fallbacks"] == 0
            assert control(second, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_TIED_HERE
            b.send(b"x")
            assert wait_for(second, 1) == EVENT_IN


def test_port_whole_call_failure_keeps_the_registrations():
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        control(port, lib.SN_MODEL_FAIL_CALLS, None, FAIL_FOR_GOOD)
        remove = Registration(a, 1, 0, OP_REMOVE)
        with pytest.raises(OSError):
            port.process([remove], timeout=0)
        control(port, lib.SN_MODEL_FAIL_CALLS, None, 0)
        # Nothing changed: still registered, still notified.
        assert port.registered == 1
        b.send(b"x")
        assert wait_for(port, 1) == EVENT_IN


def test_port_whole_call_failure_once_applies_the_batch():
    """A call that fails as a whole once (a transient fault): the port
    applies the batch registration by registration, and nothing is lost
    or raised."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        control(port, lib.SN_MODEL_FAIL_CALLS, None, 1)
        reg = Registration(a, 1, EVENT_IN, trigger=PERSISTENT)
        port.process([reg], timeout=0)
        assert reg.result == 0
        b.send(b"x")
        assert wait_for(port, 1) == EVENT_IN


@pytest.mark.timeout(60)
def test_port_bad_handle_failing_the_whole_call_fails_its_change_alone():
    """A REMOVE for a socket its owner closed already, in a batch with
    another socket's ENABLE, on an OS that fails the whole call for a bad
    handle: the ENABLE is applied, the REMOVE alone fails, and later calls
    do not fail again."""
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    e, f = nonblocking_pair()
    with a, b, c, d, Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_BAD_HANDLE_FAILS_CALL)
        port.process([Registration(e, 5, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        handle = e.fileno()
        e.close()
        f.close()
        remove = Registration(handle, 5, 0, OP_REMOVE)
        enable = Registration(a, 1, EVENT_IN, trigger=PERSISTENT)
        b.send(b"x")
        start = time.monotonic()
        with pytest.raises(OSError) as raised:
            port.process([remove, enable], timeout=5)
        # The REMOVE's own error, not the call's: the ENABLE went through.
        assert raised.value.winerror == remove.result != 0
        assert enable.result == 0
        assert time.monotonic() - start < 4
        assert wait_for(port, 1) == EVENT_IN
        port.process([Registration(c, 3, EVENT_IN)], timeout=0)   # no failure left over


@pytest.mark.timeout(60)
def test_selector_survives_a_closed_socket_failing_the_whole_call():
    """asyncio's pattern: a socket closed before its unregister reached the
    port. Every select must go on, and the other registrations work."""
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        set_modes(sel.port, lib.SN_MODEL_MODE_BAD_HANDLE_FAILS_CALL)
        sel.register(c, EVENT_READ, "c")
        sel.select(0)
        sel.unregister(c)
        c.close()
        d.close()
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")
        seen = []
        for _ in range(5):
            seen += [key.data for key, _ in sel.select(0.2)]
        assert "a" in seen


@pytest.mark.timeout(60)
def test_port_rekey_of_a_reused_handle_does_not_sit_out_the_wait():
    """A handle value reused after closesocket() and registered under a
    new key while readable: the old registration's REMOVE fails (the
    socket is gone), and the ENABLE it held back must reach the kernel
    before the wait, not after it."""
    a, b = nonblocking_pair()
    with Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        handle = a.fileno()
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        with c, d:
            d.send(b"x")
            time.sleep(0.05)
            start = time.monotonic()
            notes = port.process([Registration(c, 2, EVENT_IN)], timeout=5)
            assert notes == [(2, EVENT_IN)]
            assert time.monotonic() - start < 2


@pytest.mark.timeout(60)
def test_port_two_threads_apply_changes_in_the_order_translated():
    """Thread A's ENABLE is translated, then held by the model before it is
    applied; thread B then removes the same registration. B's REMOVE must
    not reach the kernel first: it would fail (nothing registered yet) and
    retire the record, and A's ENABLE would then tie the socket under a
    retired key, which close() does not remove."""
    a, b = nonblocking_pair()
    port = Port("strict")
    threads: list[threading.Thread] = []
    try:
        control(port, lib.SN_MODEL_HOLD, None, 1)

        def enable() -> None:
            port.process([Registration(a, 1, EVENT_IN)], timeout=0)

        def remove() -> None:
            try:
                port.process([Registration(a, 1, op=OP_REMOVE)], timeout=0)
            except OSError:
                pass   # the REMOVE that overtook the ENABLE fails

        threads.append(threading.Thread(target=enable))
        threads[0].start()
        deadline = time.monotonic() + 5
        while control(port, lib.SN_MODEL_HOLD, None, 2) != 1:
            assert time.monotonic() < deadline, "the ENABLE was never held"
            time.sleep(0.01)
        threads.append(threading.Thread(target=remove))
        threads[1].start()
        time.sleep(0.3)   # room for B to overtake A
    finally:
        control(port, lib.SN_MODEL_HOLD, None, 0)
        for t in threads:
            t.join(10)
    try:
        for _ in range(3):
            port.process(timeout=0.05)   # the REMOVE event, if any
        assert port.registered == 0
        assert control(port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_UNTIED
    finally:
        port.close()
        a.close()
        b.close()


@pytest.mark.timeout(60)
def test_port_refused_modify_does_not_sit_out_the_wait():
    """A modify of a registration the OS holds (IN to IN|OUT on a writable
    socket) that the OS refuses: the port must hear of it before the wait
    and let the polyfill serve the socket, not wait out the timeout."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        refuse(port, a)
        try:
            start = time.monotonic()
            notes = port.process([Registration(a, 1, EVENT_IN | EVENT_OUT)], timeout=5)
            assert time.monotonic() - start < 2
            assert notes == [(1, EVENT_OUT)]
        finally:
            lib.sn_model_control(port._handle, lib.SN_MODEL_REFUSE, a.fileno(), 0)


@pytest.mark.timeout(60)
def test_selector_refused_rearm_does_not_sit_out_the_wait():
    """The port's own re-arm of a one-shot registration rides in the call
    that waits, and the OS may refuse it (here the model's refusal of a
    layered provider's socket, which the socket meets only now): the
    verdict comes after the wait ("a refusal never shortens it"), and the
    polyfill takes the socket over only then. The wait must not block past
    the socket's readiness all the same."""
    a, b = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")
        assert [key.data for key, _ in sel.select(5)] == ["a"]
        refuse(sel.port, a)     # the next call carries the re-arm of `a`
        try:
            start = time.monotonic()
            ready = sel.select(10)
            assert time.monotonic() - start < 2, ready
            assert [(key.data, mask) for key, mask in ready] == [("a", EVENT_READ)]
            assert sel.port.counters()["fallbacks"] == 1
            a.recv(10)
            assert sel.select(0.1) == []
            b.send(b"y")
            assert [key.data for key, _ in sel.select(5)] == ["a"]
        finally:
            lib.sn_model_control(sel.port._handle, lib.SN_MODEL_REFUSE, a.fileno(), 0)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("modes", ["MODE_NO_ENABLE_WHILE_ARMED", "MODES_HARSHEST"])
def test_port_two_enables_of_one_registration_in_one_call(modes):
    """Two ENABLEs of one registration in one call, on a model that
    refuses an ENABLE of an armed registration: the port sends the kernel
    one, with the last filter. (It used to send both; the second, refused,
    handed the socket to the AFD fallback while the model kept the first:
    two registrations, and the first never removed.)"""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, named_modes(modes))
        first = Registration(a, 1, EVENT_IN)
        second = Registration(a, 1, EVENT_IN | EVENT_OUT)
        assert port.process([first, second], timeout=2) == [(1, EVENT_OUT)]
        assert first.result == second.result == 0
        assert port.counters()["fallbacks"] == 0
        assert port.counters()["refused"] == 0
        assert wait_for(port, 1, regs=[Registration(a, 1, 0, OP_REMOVE)]) == EVENT_REMOVE
        assert control(port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_UNTIED


@pytest.mark.parametrize("modes", [None, "MODES_HARSHEST"])
@pytest.mark.parametrize("op", [OP_REMOVE, OP_DISABLE])
def test_port_change_whose_calls_fail_whole_changed_nothing(op, modes):
    """A REMOVE or DISABLE whose call fails as a whole, and whose call of
    its own fails again, while a call with nothing in it does not: "the
    entire operation failed, and no changes occurred". The registration is
    still the kernel's, under its first key: the change is reported failed,
    the port keeps its record as it was (still registered, still heard),
    and a registration under a new key is a re-key, heard under that key,
    not a new kernel key the kernel never takes (a deaf socket)."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, named_modes(modes))
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        control(port, lib.SN_MODEL_FAIL_CALLS, None, 2)   # the batch's call, the change's own
        change = Registration(a, 1, 0, op, trigger=PERSISTENT)
        with pytest.raises(OSError):
            port.process([change], timeout=0)
        assert change.result != 0
        assert port.registered == 1
        assert control(port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_TIED_HERE
        b.send(b"x")
        assert wait_for(port, 1) == EVENT_IN
        assert wait_for(port, 2, regs=[Registration(a, 2, EVENT_IN, trigger=PERSISTENT)]) \
            == EVENT_IN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("modes", [None, "MODES_HARSHEST"])
def test_port_enable_after_disable_of_a_reused_handle(modes):
    """A DISABLE leaves a ProcessSocketNotifications registration in place
    (unlike epoll's item, which it deletes). The socket closed and its
    handle value taken by a new socket: the next ENABLE under the same
    key must not renew the old registration's kernel key, under which a
    notification for the closed socket is still queued."""
    a, b = nonblocking_pair()
    with Port("strict") as port:
        set_modes(port, named_modes(modes))
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        port.process([Registration(a, 1, 0, OP_DISABLE, trigger=PERSISTENT)], timeout=0)
        control(port, lib.SN_MODEL_QUEUE, a, EVENT_IN)   # queued for a, before its close
        handle = a.fileno()
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        with c, d:
            notes = port.process([Registration(c, 1, EVENT_IN, trigger=PERSISTENT)],
                                 timeout=0.3)
            assert notes == []      # c has nothing to read: a's packet is stale
            d.send(b"x")
            assert wait_for(port, 1) == EVENT_IN


@pytest.mark.timeout(60)
@pytest.mark.parametrize("op", [OP_REMOVE, OP_DISABLE])
def test_port_remove_of_a_reused_handle_leaves_its_new_owner_alone(op):
    """A socket closed without its REMOVE, its handle value taken by a
    socket another port registered (another loop's accept): this port's
    REMOVE or DISABLE of the old registration must not reach the new
    socket's, which an OS that does not check the port would remove
    (SN_MODEL_MODE_REMOVE_ANY_PORT), leaving this port waiting for a REMOVE
    event that never comes and the other port deaf. The identity check an
    ENABLE makes tells the port the old socket is gone."""
    a, b = nonblocking_pair()
    with Port("strict") as mine, Port("strict") as theirs:
        set_modes(mine, lib.SN_MODEL_MODES_HARSHEST)
        mine.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        handle = a.fileno()
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        with c, d:
            theirs.process([Registration(c, 7, EVENT_IN, trigger=PERSISTENT)], timeout=0)
            with pytest.raises(OSError):
                mine.process([Registration(handle, 1, 0, op, trigger=PERSISTENT)], timeout=0)
            assert mine.registered == 0
            assert control(theirs, lib.SN_MODEL_TIED, c) == lib.SN_MODEL_TIED_HERE
            d.send(b"x")
            assert wait_for(theirs, 7) == EVENT_IN
            assert mine.process(timeout=0.2) == []


@pytest.mark.timeout(60)
def test_selector_unregister_whose_calls_fail_whole_is_finished_by_the_port():
    """The selector's unregister is a quiet REMOVE: it forgets the
    registration whatever the port answers. One that a call failing as a
    whole did not apply (the kernel still holds the registration, under
    its first key) is the port's to finish with the next call: left as it
    was, it would be re-armed and reported for nobody at every select, and
    the socket stay tied to the port."""
    a, b = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")          # readable: what stays armed fires at every select
        assert [key.data for key, _ in sel.select(2)] == ["a"]
        sel.unregister(a)
        control(sel.port, lib.SN_MODEL_FAIL_CALLS, None, 2)   # its call, and its own
        assert sel.select(0) == []
        for _ in range(3):
            assert sel.select(0.1) == []
        assert control(sel.port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_UNTIED
        assert sel.port.registered == 0


@pytest.mark.timeout(60)
def test_selector_rearm_of_a_socket_whose_state_cannot_be_read():
    """getsockopt(SO_BSP_STATE) may fail where it answered before (a reset
    connection, an unbound socket): what the port could not read is
    unknown, not "another socket", and the re-arm still goes to the
    kernel. (It was dropped: the port read the failure as a socket bound
    no more, and the reader waited for ever.)"""
    a, b = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")
        assert [key.data for key, _ in sel.select(2)] == ["a"]
        control(sel.port, lib.SN_MODEL_HIDE_STATE, a, 1)
        try:
            # Level-triggered, still unread: reported again.
            assert [key.data for key, _ in sel.select(2)] == ["a"]
        finally:
            control(sel.port, lib.SN_MODEL_HIDE_STATE, a, 0)


@pytest.mark.timeout(60)
def test_port_second_thread_does_not_overtake_a_deferred_enable():
    """A re-key whose quiet REMOVE fails (the socket closed meanwhile, its
    handle value taken by another socket) frees the ENABLE it held back,
    to ride in the call that waits. That ENABLE is translated and not yet
    applied: another thread's REMOVE of the same registration must wait
    for it, or it fails first (nothing registered yet), retires the
    record, and the ENABLE then ties the socket under a retired key."""
    a, b = nonblocking_pair()
    port = Port("strict")
    threads: list[threading.Thread] = []
    handle = a.fileno()
    port.process([Registration(a, 1, EVENT_IN)], timeout=0)
    c = d = None
    try:
        control(port, lib.SN_MODEL_HOLD, None, 3)    # the re-key's REMOVE

        def rekey() -> None:
            port.process([Registration(handle, 2, EVENT_IN)], timeout=0.5)

        threads.append(threading.Thread(target=rekey))
        threads[0].start()
        deadline = time.monotonic() + 5
        while control(port, lib.SN_MODEL_HOLD, None, 2) != 1:
            assert time.monotonic() < deadline, "the REMOVE was never held"
            time.sleep(0.01)
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        control(port, lib.SN_MODEL_HOLD, None, 1)    # the ENABLE the REMOVE frees
        control(port, lib.SN_MODEL_HOLD, None, 4)    # the REMOVE goes on, and fails
        deadline = time.monotonic() + 5
        while control(port, lib.SN_MODEL_HOLD, None, 2) != 1:
            assert time.monotonic() < deadline, "the deferred ENABLE was never held"
            time.sleep(0.01)

        def remove() -> None:
            try:
                port.process([Registration(handle, 2, op=OP_REMOVE)], timeout=0)
            except OSError:
                pass   # the REMOVE that overtook the ENABLE fails

        threads.append(threading.Thread(target=remove))
        threads[1].start()
        time.sleep(0.3)   # room for the second thread to overtake
    finally:
        control(port, lib.SN_MODEL_HOLD, None, 0)
        for t in threads:
            t.join(10)
    try:
        for _ in range(3):
            port.process(timeout=0.05)   # the REMOVE event, if any
        assert port.registered == 0
        assert c is not None
        assert control(port, lib.SN_MODEL_TIED, c) == lib.SN_MODEL_UNTIED
    finally:
        port.close()
        for s in (a, b, c, d):
            if s is not None:
                s.close()


def test_port_modify_of_an_armed_registration():
    """The reference page: "Notifications must not be re-enabled until the
    SOCK_NOTIFY_EVENT_DISABLE notification is received". Where the OS
    refuses an ENABLE of an armed registration (a modify: IN to IN|OUT),
    the port disables and enables it again, in the same call: the writer is
    heard at once, by the OS, not by the polyfill standing in for it."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED)
        port.process([Registration(a, 1, EVENT_IN)], timeout=0)
        notes = port.process([Registration(a, 1, EVENT_IN | EVENT_OUT)], timeout=0)
        assert notes == [(1, EVENT_OUT)]
        assert port.counters()["fallbacks"] == 0
        b.send(b"x")
        assert wait_for(port, 1, regs=[Registration(a, 1, EVENT_IN)]) == EVENT_IN


@pytest.mark.timeout(60)
def test_selector_modify_of_an_armed_ready_registration_is_heard():
    """A modify (IN to OUT) of an armed registration whose socket is
    readable, which the OS refuses ("Notifications must not be re-enabled
    until the SOCK_NOTIFY_EVENT_DISABLE notification is received"): the
    port's DISABLE and ENABLE leave a notification of the old filter queued
    ("Notifications that have already been queued might still be
    delivered"), ahead of the new filter's. The first must not stand for
    the second: the writable socket is reported at once, not when the wait
    runs out."""
    a, b = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        set_modes(sel.port, lib.SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED)
        sel.register(a, EVENT_READ, "a")
        assert sel.select(0) == []
        b.send(b"x")
        sel.modify(a, EVENT_WRITE, "a")
        start = time.monotonic()
        ready = sel.select(5)
        assert time.monotonic() - start < 2, ready
        assert [(key.data, mask) for key, mask in ready] == [("a", EVENT_WRITE)]
        assert sel.port.counters()["fallbacks"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["selector", "loop"])
def test_a_register_then_a_modify_is_one_enable_of_the_registration(api):
    """asyncio's connection_made adds a writer and the reader follows
    before the loop selects again. The port must hear of one ENABLE with
    both filters: two ENABLEs of one registration in one call are what
    the OS may refuse ("Notifications must not be re-enabled until the
    SOCK_NOTIFY_EVENT_DISABLE notification is received"), and the second's
    refusal would hand the socket to the polyfill while the OS keeps the
    first's registration. Under SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED: no
    fallback, both directions reported, and the socket untied once
    unregistered."""
    a, b = nonblocking_pair()
    with a, b:
        if api == "selector":
            with NotifySelector("strict") as sel:
                set_modes(sel.port, lib.SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED)
                sel.register(a, EVENT_WRITE, "a")
                sel.modify(a, EVENT_READ | EVENT_WRITE, "a")
                b.send(b"x")
                ready = sel.select(5)
                assert [(key.data, mask) for key, mask in ready] == [
                    ("a", EVENT_READ | EVENT_WRITE)]
                assert sel.port.counters()["fallbacks"] == 0
                sel.unregister(a)
                assert sel.select(0.1) == []
                assert control(sel.port, lib.SN_MODEL_TIED, a) == lib.SN_MODEL_UNTIED
            return
        loop = Loop(selector=NotifySelector("strict"))
        try:
            port = loop._selector.port
            set_modes(port, lib.SN_MODEL_MODE_NO_ENABLE_WHILE_ARMED)

            async def both() -> list:
                heard: list = []
                done = loop.create_future()

                def note(what: str) -> None:
                    heard.append(what)
                    if what == "write":
                        loop.remove_writer(a)
                    else:
                        loop.remove_reader(a)
                    if len(heard) == 2:
                        done.set_result(None)
                # One iteration: the writer, then the reader, as a
                # transport's connection_made and its protocol's reading.
                loop.add_writer(a, note, "write")
                loop.add_reader(a, note, "read")
                b.send(b"x")
                await asyncio.wait_for(done, 5)
                return sorted(heard)
            assert loop.run_until_complete(both()) == ["read", "write"]
            assert port.counters()["fallbacks"] == 0
        finally:
            loop.close()


@pytest.mark.timeout(60)
def test_refused_socket_falls_back_under_a_plain_wait():
    """The OS's wait is a plain GetQueuedCompletionStatusEx: the polyfill's
    packets for a refused socket reach the port as they are, and the port
    must turn them into events."""
    check_refused_socket_falls_back(lib.SN_MODEL_MODE_PLAIN_WAIT)


class OtherPort:
    """A completion port of its own, a socket tied to it by
    CreateIoCompletionPort, as a ProactorEventLoop ties the sockets it
    serves."""

    def __init__(self, sock) -> None:
        import _overlapped
        self.handle = _overlapped.CreateIoCompletionPort(_overlapped.INVALID_HANDLE_VALUE,
                                                         0, 0, 0)
        _overlapped.CreateIoCompletionPort(sock.fileno(), self.handle, 1, 0)

    def close(self) -> None:
        import _winapi
        _winapi.CloseHandle(self.handle)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("api", ["port", "selector", "loop"])
def test_socket_tied_by_create_io_completion_port_is_served_by_the_fallback(api):
    """SN_MODEL_MODE_TIES_SOCKET: a socket a ProactorEventLoop (or anyone's
    overlapped I/O) tied to another completion port is refused, as
    CreateIoCompletionPort refuses a second association; the polyfill
    serves it, promptly."""
    a, b = nonblocking_pair()
    other = OtherPort(a)
    try:
        with a, b:
            if api == "port":
                with Port("strict") as port:
                    set_modes(port, lib.SN_MODEL_MODE_TIES_SOCKET)
                    b.send(b"x")
                    start = time.monotonic()
                    notes = port.process([Registration(a, 1, EVENT_IN)], timeout=5)
                    assert time.monotonic() - start < 2, notes
                    assert notes == [(1, EVENT_IN)]
                    assert port.counters()["fallbacks"] == 1
            elif api == "selector":
                with NotifySelector("strict") as sel:
                    set_modes(sel.port, lib.SN_MODEL_MODE_TIES_SOCKET)
                    sel.register(a, EVENT_READ, "a")
                    b.send(b"x")
                    assert [key.data for key, _ in sel.select(5)] == ["a"]
                    assert sel.port.counters()["fallbacks"] == 1
                    a.recv(10)
                    assert sel.select(0.1) == []
                    b.send(b"y")
                    assert [key.data for key, _ in sel.select(5)] == ["a"]
            else:
                loop = Loop(selector=NotifySelector("strict"))
                try:
                    set_modes(loop._selector.port, lib.SN_MODEL_MODE_TIES_SOCKET)

                    async def echo() -> bytes:
                        # Later: the receive must wait for readiness.
                        loop.call_later(0.1, b.send, b"ping")
                        return await asyncio.wait_for(loop.sock_recv(a, 10), 5)
                    assert loop.run_until_complete(echo()) == b"ping"
                    assert loop._selector.port.counters()["fallbacks"] == 1
                finally:
                    loop.close()
    finally:
        other.close()


@pytest.mark.timeout(60)
def test_socket_the_model_tied_stays_tied():
    """SN_MODEL_MODE_TIES_SOCKET: the association a registration made
    outlives its REMOVE ("the handle remains associated with that I/O
    completion port until it is closed"): the same port takes the socket
    again, the next port is refused and its polyfill serves the socket."""
    a, b = nonblocking_pair()
    with a, b:
        with Port("strict") as first:
            set_modes(first, lib.SN_MODEL_MODE_TIES_SOCKET)
            first.process([Registration(a, 1, EVENT_IN)], timeout=0)
            assert wait_for(first, 1, regs=[Registration(a, 1, 0, OP_REMOVE)]) == EVENT_REMOVE
            b.send(b"x")
            assert wait_for(first, 2, regs=[Registration(a, 2, EVENT_IN)]) == EVENT_IN
            assert first.counters()["fallbacks"] == 0
            assert wait_for(first, 2, regs=[Registration(a, 2, 0, OP_REMOVE)]) == EVENT_REMOVE
        with Port("strict") as second:
            set_modes(second, lib.SN_MODEL_MODE_TIES_SOCKET)
            assert wait_for(second, 3, regs=[Registration(a, 3, EVENT_IN)]) == EVENT_IN
            assert second.counters()["fallbacks"] == 1


@pytest.mark.timeout(60)
def test_overlapped_io_on_a_tied_socket_is_no_notification():
    """SN_MODEL_MODE_TIES_SOCKET: the socket is associated with the port
    under its registration's key, so its own overlapped I/O completes on
    the port under that key, with a byte count where a notification has
    its events (one byte sent: EVENT_IN). That is not readiness."""
    import _overlapped
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_TIES_SOCKET)
        assert port.process([Registration(a, 1, EVENT_IN)], timeout=0) == []
        ov = _overlapped.Overlapped(0)
        ov.WSASend(a.fileno(), b"x", 0)
        time.sleep(0.2)            # the send's completion is queued by now
        assert port.process(timeout=0.3) == []
        assert ov.getresult() == 1
        assert b.recv(10) == b"x"
        b.send(b"y")               # the registration still works
        assert wait_for(port, 1) == EVENT_IN


def test_port_disable_carries_a_trigger():
    """DISABLE with no trigger flags from the caller, on a model that wants
    LEVEL or EDGE with DISABLE as with ENABLE: the port sends the
    registration's own."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_DISABLE_NEEDS_TRIGGER)
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        disable = Registration(a, 1, EVENT_IN, OP_DISABLE, trigger=0)
        port.process([disable], timeout=0)
        assert disable.result == 0


def test_port_timeout_as_error_timeout():
    """A wait that times out with ERROR_TIMEOUT (one reference page's
    word) is a timeout, not a failure."""
    a, b = nonblocking_pair()
    with a, b, Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_ERROR_TIMEOUT)
        assert port.process([Registration(a, 1, EVENT_IN)], timeout=0.05) == []
        assert port.process(timeout=0) == []


@pytest.mark.timeout(60)
def test_port_drops_what_a_closed_socket_left_queued():
    """closesocket() with a notification queued: it must not reach the
    socket that takes the handle value next, under its new key."""
    a, b = nonblocking_pair()
    with Port("strict") as port:
        set_modes(port, lib.SN_MODEL_MODE_STALE_AFTER_CLOSE)
        port.process([Registration(a, 1, EVENT_IN, trigger=PERSISTENT)], timeout=0)
        handle = a.fileno()
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        with c, d:
            notes = port.process([Registration(c, 2, EVENT_IN, trigger=PERSISTENT)],
                                 timeout=0.3)
            notes += port.process(timeout=0.3)
            assert notes == []
            d.send(b"x")
            assert wait_for(port, 2) == EVENT_IN


# -- the selector on the model ------------------------------------------------------------

def test_selector_unregister_two_then_register_the_first():
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    with a, b, c, d, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        sel.register(c, EVENT_READ, "c")
        sel.select(0)
        sel.unregister(a)
        sel.unregister(c)
        sel.register(a, EVENT_READ, "a2")
        b.send(b"x")
        deadline = time.monotonic() + 3
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = [key.data for key, _ in sel.select(0.2)]
        assert seen == ["a2"]


def test_selector_reregister_while_remove_not_dequeued():
    """unregister(a), register(c), register(a) before a select: a's new
    ENABLE (another slot, so another key) reaches the port while a's
    REMOVE has not been dequeued."""
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    with a, b, c, d, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        sel.select(0)
        sel.unregister(a)
        sel.register(c, EVENT_READ, "c")
        sel.register(a, EVENT_READ, "a2")
        b.send(b"x")
        deadline = time.monotonic() + 3
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = [key.data for key, _ in sel.select(0.2)]
        assert seen == ["a2"]


@pytest.mark.parametrize("backend", ["afd", "strict"])
@pytest.mark.timeout(60)
def test_selector_rearm_after_close_leaves_a_strangers_socket_alone(backend):
    """A socket just reported, closed without being unregistered, its
    handle value taken by a new socket: the selector's re-arm of the dead
    registration must not register the newcomer ("overwrites the existing
    registration", or creates one), or its readiness is reported under
    the dead socket's key and its owner's own port is refused."""
    a, b = nonblocking_pair()
    with NotifySelector(backend) as sel:
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")
        assert [key.data for key, _ in sel.select(2)] == ["a"]
        handle = a.fileno()
        a.close()
        b.close()
        c, d = socket_on_handle(handle)
        with c, d:
            d.send(b"y")
            time.sleep(0.05)
            seen = []
            for _ in range(4):
                seen += [key.data for key, _ in sel.select(0.1)]
            assert seen == []
            # The newcomer's owner can tie it to a port of its own.
            with Port(backend) as other:
                assert wait_for(other, 7, regs=[Registration(c, 7, EVENT_IN)]) == EVENT_IN


def test_selector_refused_socket_neither_blocks_nor_goes_deaf():
    a, b = nonblocking_pair()
    with a, b, NotifySelector("strict") as sel:
        refuse(sel.port, a)
        try:
            b.send(b"x")
            sel.register(a, EVENT_READ)
            start = time.monotonic()
            assert [m for _, m in sel.select(5)] == [EVENT_READ]
            assert time.monotonic() - start < 2
            a.recv(10)
            assert sel.select(0.1) == []
            b.send(b"y")
            assert [m for _, m in sel.select(5)] == [EVENT_READ]
        finally:
            lib.sn_model_control(sel.port._handle, lib.SN_MODEL_REFUSE, a.fileno(), 0)


def test_selector_whole_call_failure_loses_nothing():
    a, b = nonblocking_pair()
    c, d = nonblocking_pair()
    with a, b, c, d, NotifySelector("strict") as sel:
        sel.register(a, EVENT_READ, "a")
        b.send(b"x")
        assert [k.data for k, _ in sel.select(2)] == ["a"]
        sel.register(c, EVENT_READ, "c")      # a change for the failing call
        control(sel.port, lib.SN_MODEL_FAIL_CALLS, None, FAIL_FOR_GOOD)
        with pytest.raises(OSError):
            sel.select(0)
        control(sel.port, lib.SN_MODEL_FAIL_CALLS, None, 0)
        # The re-arm of a and the registration of c both survive.
        d.send(b"y")
        seen = set()
        deadline = time.monotonic() + 3
        while seen != {"a", "c"} and time.monotonic() < deadline:
            seen |= {k.data for k, _ in sel.select(0.2)}
        assert seen == {"a", "c"}


# -- the loop on the model ------------------------------------------------------------------

def test_loop_listener_outlives_its_loop():
    """A listening socket reused by a second loop (a second asyncio.run):
    the first port's close sends its REMOVE, so the socket is not tied to
    the dead port, and the second loop hears its connections natively."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    address = listener.getsockname()

    async def one_round():
        loop = asyncio.get_running_loop()
        client = socket.socket()
        client.setblocking(False)

        async def connect_later():
            await asyncio.sleep(0.2)     # the accept must wait for readiness
            await loop.sock_connect(client, address)

        with client:
            connecting = loop.create_task(connect_later())
            conn, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
            await connecting
            conn.close()

    with listener:
        for _ in range(2):
            loop = Loop(selector=NotifySelector("strict"))
            try:
                port = loop._selector.port
                assert control(port, lib.SN_MODEL_TIED, listener) == lib.SN_MODEL_UNTIED
                loop.run_until_complete(one_round())
                assert port.counters()["fallbacks"] == 0
                # Still registered when the loop closes (a reader nobody
                # removed, as a server left open at exit would leave it).
                loop.add_reader(listener, lambda: None)
                loop.run_until_complete(asyncio.sleep(0.05))
                assert control(port, lib.SN_MODEL_TIED, listener) == lib.SN_MODEL_TIED_HERE
            finally:
                loop.close()


# -- many refused sockets at once -------------------------------------------------------

#: Socket pairs in the tests of many refusals at once: more than one of
#: anything the port keeps on its stack per call would make a single one.
MANY = 64
#: A select, a process or a loop round that carries refused re-arms must end
#: within this, against a wait of WAIT: a bound that catches a wait sat out,
#: not a measure of speed (a loaded two-core machine runs these under Wine).
PROMPT = 2.0
WAIT = 10.0


class Pairs:
    """``count`` connected pairs (``a[i]``, ``b[i]``), closed together."""

    def __init__(self, count: int) -> None:
        self.a: list[socket.socket] = []
        self.b: list[socket.socket] = []
        try:
            for _ in range(count):
                a, b = nonblocking_pair()
                self.a.append(a)
                self.b.append(b)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Pairs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in self.a + self.b:
            s.close()


def refuse_all(port: Port, socks) -> None:
    for s in socks:
        refuse(port, s)


def accept_again(port: Port, socks) -> None:
    """Lift refusals (as the other refusal tests do, in their finally)."""
    for s in socks:
        if s.fileno() != -1:
            lib.sn_model_control(port._handle, lib.SN_MODEL_REFUSE, s.fileno(), 0)


def drain(sock: socket.socket) -> None:
    try:
        while sock.recv(4096):
            pass
    except BlockingIOError:
        pass


def collect_selected(sel: NotifySelector, pairs: Pairs, expected: set[int],
                     sent: set[int] | None = None) -> None:
    """select(WAIT) until every key in ``expected`` (the indices, the keys'
    data) has been reported: each select returns within PROMPT and reports
    readable sockets of ``expected`` only, each once (it is drained as it is
    reported, so a second report would be a socket reported while not
    ready); ``sent``, when given, holds what was made readable so far."""
    seen: set[int] = set()
    deadline = time.monotonic() + PROMPT + len(expected) * 0.05
    while seen != expected:
        assert time.monotonic() < deadline, f"never reported: {sorted(expected - seen)}"
        start = time.monotonic()
        ready = sel.select(WAIT)
        took = time.monotonic() - start
        assert took < PROMPT, (took, sorted(expected - seen))
        for key, mask in ready:
            i = key.data
            assert mask == EVENT_READ, (i, mask)
            assert i in expected, f"socket {i} reported, never made readable"
            assert i not in seen, f"socket {i} reported twice"
            if sent is not None:
                assert i in sent, f"socket {i} reported before it was sent to"
            seen.add(i)
            drain(pairs.a[i])


def send_later(pairs: Pairs, which: list[int], gap: float, sent: set[int]) -> threading.Thread:
    """A thread that sends a byte to each of ``which`` in turn, ``gap``
    seconds apart (the first after one gap)."""
    def run() -> None:
        for i in which:
            time.sleep(gap)
            sent.add(i)
            pairs.b[i].send(b"x")
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def check_many_refused_rearms(sel: NotifySelector, pairs: Pairs, refused: list[int],
                              pattern: str) -> None:
    """Every socket registered and delivered once, then ``refused`` refused,
    so the re-arms of those that select delivered last ride the next call
    together and go to the polyfill in it; readiness then comes in
    ``pattern``: on all at once, on a few later, or on one after another.
    Each is heard promptly, once; after one more round every refused socket
    is the polyfill's (one fallback each); the unregistered are never heard
    again."""
    everyone = set(range(len(pairs.a)))
    for i, a in enumerate(pairs.a):
        sel.register(a, EVENT_READ, i)
    assert sel.select(0) == []
    for b in pairs.b:
        b.send(b"x")
    time.sleep(0.1)       # all readable, so that one select delivers most of them
    collect_selected(sel, pairs, everyone)
    refuse_all(sel.port, [pairs.a[i] for i in refused])
    if pattern == "at once":
        for b in pairs.b:
            b.send(b"x")
        collect_selected(sel, pairs, everyone)
    elif pattern == "a few":
        few = sorted({0, len(pairs.a) // 3, len(pairs.a) // 2, len(pairs.a) - 1})
        sent: set[int] = set()
        thread = send_later(pairs, few, 0.2, sent)
        collect_selected(sel, pairs, set(few), sent)
        thread.join(5)
        assert sel.select(0.2) == []
    else:
        sent = set()
        thread = send_later(pairs, list(range(len(pairs.a))), 0.005, sent)
        collect_selected(sel, pairs, everyone, sent)
        thread.join(5)
    # One more round: every socket delivered, its re-arm refused or not.
    for b in pairs.b:
        b.send(b"x")
    collect_selected(sel, pairs, everyone)
    assert sel.select(0.1) == []
    assert sel.port.counters()["fallbacks"] == len(refused)
    # Half of them unregistered (the polyfill's and the OS's alike): the
    # others are heard, those never again.
    gone = set(range(0, len(pairs.a), 2))
    for i in gone:
        sel.unregister(pairs.a[i])
    for b in pairs.b:
        b.send(b"x")
    collect_selected(sel, pairs, everyone - gone)
    assert sel.select(0.2) == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pattern", ["at once", "a few", "one after another"])
@pytest.mark.parametrize("which", ["all", "half"])
def test_selector_many_refused_rearms_in_one_call(which, pattern):
    """MANY one-shot re-arms refused in the same call (all of them, or every
    other one beside re-arms the OS takes): the polyfill takes each socket
    over, and the select that carries them does not sit out its wait."""
    with Pairs(MANY) as pairs, NotifySelector("strict") as sel:
        refused = list(range(MANY)) if which == "all" else list(range(1, MANY, 2))
        try:
            check_many_refused_rearms(sel, pairs, refused, pattern)
        finally:
            accept_again(sel.port, pairs.a)


@pytest.mark.timeout(120)
def test_selector_many_refused_rearms_in_two_threads():
    """Two threads, each with its own selector, each with its sockets'
    re-arms refused together, at the same time."""
    errors: list[BaseException] = []

    def one(pattern: str) -> None:
        try:
            with Pairs(MANY // 2) as pairs, NotifySelector("strict") as sel:
                try:
                    check_many_refused_rearms(sel, pairs, list(range(MANY // 2)), pattern)
                finally:
                    accept_again(sel.port, pairs.a)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(pattern,), daemon=True)
               for pattern in ("at once", "one after another")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    if errors:
        raise errors[0]


def tie_all(socks) -> OtherPort:
    """One other completion port, every socket of ``socks`` tied to it."""
    import _overlapped
    other = OtherPort(socks[0])
    for s in socks[1:]:
        _overlapped.CreateIoCompletionPort(s.fileno(), other.handle, 1, 0)
    return other


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["refused", "tied", "half refused"])
def test_port_many_refused_enables_in_one_call(how):
    """MANY first ENABLEs in one process() call, refused (as a layered
    provider's sockets, or as sockets tied to another completion port by
    CreateIoCompletionPort), or every other one refused beside ENABLEs the
    OS takes: each refused socket is one fallback, the readable ones are
    reported at once, each once, the others when they become readable."""
    with Pairs(MANY) as pairs, Port("strict") as port:
        other = None
        if how == "tied":
            set_modes(port, lib.SN_MODEL_MODE_TIES_SOCKET)
            other = tie_all(pairs.a)
            refused = MANY
        elif how == "refused":
            refuse_all(port, pairs.a)
            refused = MANY
        else:
            refuse_all(port, pairs.a[1::2])
            refused = MANY // 2
        try:
            readable = set(range(0, MANY, 3))
            for i in readable:
                pairs.b[i].send(b"x")
            regs = [Registration(a, i + 1, EVENT_IN, trigger=ONESHOT)
                    for i, a in enumerate(pairs.a)]

            def collect(expected: set[int]) -> None:
                seen: set[int] = set()
                deadline = time.monotonic() + PROMPT + len(expected) * 0.05
                batch = regs
                while seen != expected:
                    assert time.monotonic() < deadline, sorted(expected - seen)
                    start = time.monotonic()
                    notes = port.process(batch, timeout=WAIT)
                    assert time.monotonic() - start < PROMPT, sorted(expected - seen)
                    batch = []
                    for key, events in notes:
                        i = key - 1
                        assert events == EVENT_IN, (i, events)
                        assert i in expected and i not in seen, (i, sorted(seen))
                        seen.add(i)

            collect(readable)
            assert port.counters()["fallbacks"] == refused
            assert port.process([], timeout=0.1) == []
            # The rest, one after another: their one-shot ENABLEs of the
            # first call are still armed, the polyfill's and the OS's.
            rest = sorted(set(range(MANY)) - readable)
            sent: set[int] = set()
            thread = send_later(pairs, rest, 0.005, sent)
            regs = []
            collect(set(rest))
            thread.join(5)
            assert port.counters()["fallbacks"] == refused
        finally:
            accept_again(port, pairs.a)
            if other is not None:
                other.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("which", ["all", "half"])
def test_loop_many_readers_refused_at_once(which):
    """MANY readers of a loop (add_reader), heard together in one select;
    the callbacks refuse them, so their re-arms ride the loop's next
    select, which blocks (nothing else to do) while the next bytes arrive
    from another thread. Every byte arrives, promptly; then again, one
    socket after another."""
    loop = Loop(selector=NotifySelector("strict"))
    with Pairs(MANY) as pairs:
        port = loop._selector.port
        refused = list(range(MANY)) if which == "all" else list(range(0, MANY, 2))
        try:
            heard: dict[int, int] = {}
            done = loop.create_future()
            refuse_first = [True]
            sent: set[int] = set()

            def on_readable(i: int) -> None:
                try:
                    data = pairs.a[i].recv(4096)
                except BlockingIOError:
                    return
                heard[i] = heard.get(i, 0) + len(data)
                if len(heard) < MANY:
                    return
                if refuse_first[0]:
                    # Within the loop's iteration: its next select carries
                    # the re-arms, and nothing is ready to cut its wait.
                    refuse_first[0] = False
                    heard.clear()
                    refuse_all(port, [pairs.a[i] for i in refused])
                    timer = threading.Timer(0.2, send_later,
                                            (pairs, list(range(MANY)), 0, sent))
                    timer.daemon = True
                    timer.start()
                elif not done.done():
                    done.set_result(None)

            for i, a in enumerate(pairs.a):
                loop.add_reader(a, on_readable, i)

            async def rounds() -> None:
                nonlocal done
                start = time.monotonic()
                await asyncio.wait_for(done, WAIT)
                took = time.monotonic() - start
                assert took < PROMPT, (took, sorted(set(range(MANY)) - set(heard)))
                assert heard == dict.fromkeys(range(MANY), 1)
                # One after another, from a thread.
                heard.clear()
                done = loop.create_future()
                start = time.monotonic()
                thread = send_later(pairs, list(range(MANY)), 0.005, sent)
                await asyncio.wait_for(done, WAIT)
                took = time.monotonic() - start
                assert took < PROMPT + 0.005 * MANY, (took, sorted(set(range(MANY)) - set(heard)))
                assert heard == dict.fromkeys(range(MANY), 1)
                thread.join(5)
                await asyncio.sleep(0.05)      # the last re-arms applied

            for b in pairs.b:
                b.send(b"x")
            time.sleep(0.1)       # all readable: the loop's first select hears them all
            loop.run_until_complete(rounds())
            assert port.counters()["fallbacks"] == len(refused)
            for a in pairs.a:
                loop.remove_reader(a)
        finally:
            accept_again(port, pairs.a)
            loop.close()
