"""Randomized stateful tests (hypothesis).

1. NotifySelector against the stdlib's reference selector, step by step:
   EpollSelector on Linux, SelectSelector on Windows (well under its 512
   socket limit). A pool of socket pairs (mostly AF_UNIX, some TCP
   loopback; TCP on Windows) is registered, modified, unregistered, fed,
   drained, half-closed, closed and reset at random; after every step both
   selectors are polled with select(0) and must report the same
   {(fd, mask)}, hold the same registrations, and have raised the same
   exceptions from register/modify/unregister.

2. Port against a small Python model of its documented contract:
   LEVEL|ONESHOT reports once and is then silent until re-ENABLEd,
   LEVEL|PERSISTENT keeps reporting while ready, DISABLE silences, REMOVE
   yields one EVENT_REMOVE notification and then nothing, and a key is
   never reported again once its socket was closed (even when a new
   socket reuses the descriptor).

CI runs a bounded, derandomized profile (a few seconds). A long run on
demand: ``SOCKNOTIFY_RANDOMIZED_STEPS=100000 pytest tests/test_randomized.py``
(randomized; hypothesis prints the failing sequence).
"""
from __future__ import annotations

import contextlib
import os
import select
import selectors
import socket
import struct
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from _platform import LINUX, WINDOWS  # noqa: E402
from _sockets import fill_send_buffer, tcp_pair  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from socknotify_loop import port as port_module  # noqa: E402
from socknotify_loop.port import (  # noqa: E402
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_OUT,
    EVENT_REMOVE,
    OP_DISABLE,
    OP_ENABLE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
)
from socknotify_loop.selector import NotifySelector  # noqa: E402

READ, WRITE = selectors.EVENT_READ, selectors.EVENT_WRITE

POOL = 50               # socket pairs per machine
TCP_PAIRS = 10          # of which TCP loopback (all of them on Windows)

_STEPS = int(os.environ.get("SOCKNOTIFY_RANDOMIZED_STEPS", "0") or 0)
_COMMON = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
settings.register_profile("socknotify-ci", max_examples=25, stateful_step_count=40,
                          derandomize=True, **_COMMON)
settings.register_profile("socknotify-long", max_examples=max(1, _STEPS // 100),
                          stateful_step_count=100, **_COMMON)
PROFILE = settings.get_profile("socknotify-long" if _STEPS else "socknotify-ci")
# Bounded in CI; a long run on demand has no time limit.
pytestmark = pytest.mark.timeout(0 if _STEPS else 180)

BACKENDS = [name for name, (ok, _why) in port_module.available_backends().items() if ok]


def _reference_selector():
    if LINUX:
        return selectors.EpollSelector()
    return selectors.SelectSelector()


class _Slot:
    """One socket pair: ``a`` is what gets registered, ``b`` its peer."""

    def __init__(self, tcp: bool) -> None:
        self.tcp = tcp
        if tcp or WINDOWS:
            self.a, self.b = tcp_pair()
        else:
            self.a, self.b = socket.socketpair()
        for s in (self.a, self.b):
            s.setblocking(False)
            if tcp:
                # Small buffers: filling the send side takes a few calls.
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        self.a_open = True
        self.b_open = True

    def close(self) -> None:
        self.a.close()
        self.b.close()
        self.a_open = self.b_open = False


def _fill(sock) -> None:
    # Any error ends it too: the peer may have reset or closed.
    with contextlib.suppress(OSError):
        fill_send_buffer(sock, chunk=16384, limit=8 << 20)


def _drain(sock) -> None:
    for _ in range(1024):
        try:
            if not sock.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return


def _outcome(call):
    """What a selector call did: the exception's type and errno, or 'ok'."""
    try:
        key = call()
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        code = getattr(exc, "errno", None)
        if isinstance(exc, OSError) and code is None:
            code = getattr(exc, "winerror", None)
        return (type(exc).__name__, code)
    return ("ok", key.events)


# Mostly the first few pairs, so that operations meet on one socket often
# enough for short runs; the whole pool for descriptor reuse and numbers.
pool_index = st.one_of(st.integers(0, 3), st.integers(0, POOL - 1))
port_index = st.one_of(st.integers(0, 3), st.integers(0, POOL // 2 - 1))
masks = st.sampled_from([READ, WRITE, READ | WRITE])


class SelectorVersusReference(RuleBasedStateMachine):
    """NotifySelector and the reference selector, fed the same operations."""

    backend = None  # set per bound class

    def __init__(self) -> None:
        super().__init__()
        self.slots = [_Slot(tcp=i < TCP_PAIRS) for i in range(POOL)]
        self.ours = NotifySelector(self.backend)
        self.ref = _reference_selector()
        # Closed sockets the selectors may still hold (closed while
        # registered): unregistered later through the stale object.
        self.stale = []

    def teardown(self) -> None:
        self.ours.close()
        self.ref.close()
        for slot in self.slots:
            slot.close()

    def _both(self, name, *args):
        got = _outcome(lambda: getattr(self.ours, name)(*args))
        want = _outcome(lambda: getattr(self.ref, name)(*args))
        reference = type(self.ref).__name__
        assert got == want, f"{name}{args!r}: NotifySelector {got}, {reference} {want}"

    # -- registrations --------------------------------------------------------

    @rule(i=pool_index, events=masks)
    def register(self, i, events):
        self._both("register", self.slots[i].a, events)

    @rule(i=pool_index, events=masks)
    def modify(self, i, events):
        self._both("modify", self.slots[i].a, events)

    @rule(i=pool_index)
    def unregister(self, i):
        self._both("unregister", self.slots[i].a)

    @precondition(lambda self: self.stale)
    @rule(data=st.data())
    def unregister_stale(self, data):
        sock = self.stale.pop(data.draw(st.integers(0, len(self.stale) - 1)))
        self._both("unregister", sock)

    # -- socket state ---------------------------------------------------------

    @rule(i=pool_index, size=st.sampled_from([1, 100, 5000]))
    def peer_sends(self, i, size):
        slot = self.slots[i]
        if slot.b_open:
            try:
                slot.b.send(b"s" * size)
            except OSError:
                pass

    @rule(i=pool_index)
    def recv(self, i):
        if self.slots[i].a_open:
            _drain(self.slots[i].a)

    @rule(i=pool_index)
    def fill(self, i):
        if self.slots[i].a_open:
            _fill(self.slots[i].a)

    @rule(i=pool_index)
    def peer_drains(self, i):
        if self.slots[i].b_open:
            _drain(self.slots[i].b)

    @rule(i=pool_index)
    def peer_shutdown_write(self, i):
        slot = self.slots[i]
        if slot.b_open:
            try:
                slot.b.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    @rule(i=pool_index)
    def peer_reset(self, i):
        """The peer goes away: RST on TCP (SO_LINGER 0), close on AF_UNIX."""
        slot = self.slots[i]
        if slot.b_open:
            if slot.tcp or WINDOWS:
                slot.b.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            slot.b.close()
            slot.b_open = False

    # SelectSelector's select() fails outright on a closed socket that is
    # still registered, so on Windows only unregistered sockets are closed.
    @rule(i=pool_index)
    def close_and_reopen(self, i):
        """Close the pair (registered or not) and open a new one in its
        place, which often reuses the descriptor numbers."""
        slot = self.slots[i]
        registered = slot.a in self.ref.get_map()
        if registered and WINDOWS:
            self._both("unregister", slot.a)
            registered = False
        slot.close()
        if registered:
            self.stale.append(slot.a)
        self.slots[i] = _Slot(tcp=slot.tcp)

    # -- the comparison after every step ----------------------------------------

    def _ready(self, selector):
        if selector is self.ref and WINDOWS and not selector.get_map():
            return []   # Windows select() refuses three empty sets (WSAEINVAL)
        return sorted((key.fd, mask) for key, mask in selector.select(0))

    @invariant()
    def same_readiness(self):
        # Same registrations, then same readiness. TCP loopback state
        # travels through the stack asynchronously: a difference is
        # re-checked a few times before it counts.
        assert sorted(self.ours.get_map()) == sorted(self.ref.get_map())
        for attempt in range(4):
            ours, ref = self._ready(self.ours), self._ready(self.ref)
            if ours == ref:
                return
            time.sleep(0.02 * (attempt + 1))
        assert ours == ref, f"NotifySelector {ours} != {type(self.ref).__name__} {ref}"


# -- the Port against a model ---------------------------------------------------------

ONESHOT = TRIGGER_LEVEL | TRIGGER_ONESHOT
PERSISTENT = TRIGGER_LEVEL | TRIGGER_PERSISTENT
filters = st.sampled_from([EVENT_IN, EVENT_OUT, EVENT_IN | EVENT_OUT,
                           EVENT_IN | EVENT_HANGUP, EVENT_IN | EVENT_OUT | EVENT_HANGUP])
triggers = st.sampled_from([ONESHOT, PERSISTENT])


class _Model:
    """A registration as the contract describes it."""

    def __init__(self, key, events, trigger):
        self.key, self.events, self.trigger, self.armed = key, events, trigger, True


def _oracle(sock):
    """(readable, writable) now, from select(): the reference for readiness."""
    r, w, _ = select.select([sock], [sock], [], 0)
    return bool(r), bool(w)


class PortVersusModel(RuleBasedStateMachine):
    backend = None

    def __init__(self) -> None:
        super().__init__()
        self.port = Port(self.backend)
        self.slots = [_Slot(tcp=i < TCP_PAIRS // 2) for i in range(POOL // 2)]
        self.model = {}            # slot index -> _Model
        self.removing = set()      # keys with one EVENT_REMOVE due
        self.retired = set()       # keys that must never be reported again
        self.next_key = 1

    def teardown(self) -> None:
        self.port.close()
        for slot in self.slots:
            slot.close()

    def _process(self, regs=()):
        """One port call, then the check of what it returned against the
        model; a few short polls collect readiness still on its way."""
        got = self.port.process(list(regs), 0)
        reported = set()
        for attempt in range(6):
            reported |= self._check(got)
            # Owed: armed, ready, and not reported by this collection (a
            # persistent registration stays armed after its report).
            missing = self._expected_now() - reported
            if not missing and not self.removing:
                return
            if attempt == 5:
                break
            time.sleep(0.01 * (attempt + 1))
            got = self.port.process([], 0)
        assert not self.removing, f"no EVENT_REMOVE for keys {sorted(self.removing)}"
        assert not missing, f"ready but never reported: {sorted(missing)}"

    def _expected_now(self):
        """Keys armed and ready (per select()) that the port owes a report."""
        owed = set()
        for i, reg in self.model.items():
            slot = self.slots[i]
            if not reg.armed or not slot.a_open:
                continue
            readable, writable = _oracle(slot.a)
            if (readable and reg.events & EVENT_IN) or (writable and reg.events & EVENT_OUT):
                owed.add(reg.key)
        return owed

    def _check(self, got):
        """Checks one call's notifications; returns the keys reported."""
        reported = set()
        by_key = {reg.key: (i, reg) for i, reg in self.model.items()}
        for key, events in got:
            if events & EVENT_REMOVE:
                assert key in self.removing, f"EVENT_REMOVE for key {key} not being removed"
                self.removing.discard(key)
                self.retired.add(key)
                continue
            assert key not in self.retired, f"stale key {key} reported ({events:#x})"
            assert key in by_key, f"unknown key {key} reported ({events:#x})"
            i, reg = by_key[key]
            assert reg.armed, f"key {key} reported while disarmed ({events:#x})"
            readable, writable = _oracle(self.slots[i].a)
            if events & EVENT_IN:
                assert readable, f"key {key}: IN but select() says not readable"
            if events & EVENT_OUT:
                assert writable, f"key {key}: OUT but select() says not writable"
            reported.add(key)
            if reg.trigger & TRIGGER_ONESHOT:
                reg.armed = False
        return reported

    @rule(i=port_index, events=filters, trigger=triggers)
    def enable(self, i, events, trigger):
        slot = self.slots[i]
        reg = self.model.get(i)
        if reg is None:
            reg = self.model[i] = _Model(self.next_key, events, trigger)
            self.next_key += 1
        reg.events, reg.trigger, reg.armed = events, trigger, True
        self._process([Registration(slot.a, reg.key, events, OP_ENABLE, trigger)])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def disable(self, data):
        i = data.draw(st.sampled_from(sorted(self.model)))
        reg = self.model[i]
        reg.armed = False
        self._process([Registration(self.slots[i].a, reg.key, reg.events, OP_DISABLE, reg.trigger)])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove(self, data):
        i = data.draw(st.sampled_from(sorted(self.model)))
        reg = self.model.pop(i)
        self.removing.add(reg.key)
        self._process([Registration(self.slots[i].a, reg.key, 0, OP_REMOVE)])

    @rule(i=port_index, size=st.sampled_from([1, 3000]))
    def peer_sends(self, i, size):
        slot = self.slots[i]
        if slot.b_open:
            try:
                slot.b.send(b"p" * size)
            except OSError:
                pass
        self._process()

    @rule(i=port_index)
    def recv(self, i):
        _drain(self.slots[i].a)
        self._process()

    @rule(i=port_index)
    def fill(self, i):
        _fill(self.slots[i].a)
        self._process()

    @rule(i=port_index)
    def peer_drains(self, i):
        if self.slots[i].b_open:
            _drain(self.slots[i].b)
        self._process()

    @rule(i=port_index)
    def peer_shutdown_write(self, i):
        slot = self.slots[i]
        if slot.b_open:
            try:
                slot.b.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        self._process()

    @rule(i=port_index)
    def close_and_reuse(self, i):
        """Close a socket without telling the port (the OS drops its
        registration, no EVENT_REMOVE), then open new ones that may reuse
        the descriptor: the old key is never reported again."""
        slot = self.slots[i]
        reg = self.model.pop(i, None)
        if reg is not None:
            self.retired.add(reg.key)
        slot.close()
        self.slots[i] = _Slot(tcp=slot.tcp)
        self._process()


def _bind(machine, backend):
    cls = type(f"{machine.__name__}_{backend}", (machine,), {"backend": backend})
    case = cls.TestCase
    case.settings = PROFILE
    return case


for _backend in BACKENDS:
    globals()[f"TestSelectorVersusReference_{_backend}"] = _bind(SelectorVersusReference, _backend)
    globals()[f"TestPortVersusModel_{_backend}"] = _bind(PortVersusModel, _backend)
del _backend
