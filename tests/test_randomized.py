"""Randomized stateful tests (hypothesis).

1. NotifySelector against the stdlib's reference selector, step by step:
   EpollSelector on Linux, SelectSelector on Windows (well under its 512
   socket limit). A pool of socket pairs (mostly AF_UNIX, some TCP
   loopback; TCP on Windows) is registered, modified, unregistered, fed,
   drained, half-closed, closed and reset at random; after every step both
   selectors are polled with select(0) and must report the same
   {(fd, mask)}, hold the same registrations, and have raised the same
   exceptions from register/modify/unregister.

   On Linux the machine also makes *orphans*: a registered socket gets a
   copy of its file elsewhere -- a dup() in this process, or a helper child
   process (one per test case, started on first use) that receives it over
   a Unix socket -- and is then closed behind the selectors' backs, its
   peer left open. Its epoll item outlives the descriptor. EpollSelector's
   level item would report it at every select, and after the stale object
   is unregistered, under whatever socket reuses the number; that is not
   the contract, so the reference is kept free of orphans (the item is
   taken out of its epoll object before the close; its map keeps the stale
   key, so both selectors still answer register/unregister alike) and
   NotifySelector's reports for an orphan are judged against the
   documented one-shot semantics instead: an orphan whose registration
   was armed at the close (not reported by the last select) and is ready
   for the key's events is reported once, by the next select, with a mask
   within the key's events; one that was disarmed (reported by the last
   select) is never reported; none is ever reported twice, nor after its
   stale object was unregistered, nor under another key. A socket closed
   behind the back with no copy left is gone from the kernel: neither
   selector reports it again. Every other report is compared with the
   reference as above.

   A second thread: a rule runs a few register/modify/unregister calls
   (and select attempts) in a worker thread while the main thread selects
   with a short timeout; whichever select meets the other is refused
   (RuntimeError) and must have touched nothing. Each
   call must end as the same call on the reference (made afterwards,
   in order); every report of those concurrent selects must name a key
   registered before or during the rule, be a subset of that key's events,
   and be true (select.select() agrees once the worker is done: nothing
   drains the sockets meanwhile); the comparison after the step then finds
   nothing lost.

2. Port against a small Python model of its documented contract:
   LEVEL|ONESHOT reports once and is then silent until re-ENABLEd,
   LEVEL|PERSISTENT keeps reporting while ready, DISABLE silences, REMOVE
   yields one EVENT_REMOVE notification and then nothing, and a key is
   never reported again once its socket was closed (even when a new
   socket reuses the descriptor).

CI runs a bounded, derandomized profile (10-30 seconds for the file on
a loaded 2-core machine: the orphan and thread rules add waits, and a
child process for the test cases that copy to one). A long run on
demand: ``SOCKNOTIFY_RANDOMIZED_STEPS=100000 pytest tests/test_randomized.py``
(randomized; hypothesis prints the failing sequence).
"""
from __future__ import annotations

import contextlib
import os
import platform
import select
import selectors
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

hypothesis = pytest.importorskip("hypothesis")
from _platform import LINUX, WINDOWS  # noqa: E402
from _sockets import fill_send_buffer, tcp_pair  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule  # noqa: E402

from socknotify_loop import port as port_module  # noqa: E402
from socknotify_loop import selector as selector_module  # noqa: E402
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
# Where an injected exception may land: the selector and the port modules.
_CHANGE_FILES = (selector_module.__file__, port_module.__file__)


class _Injected(BaseException):
    """An exception landing wherever CPython runs pending calls."""
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
        # Where a copy of a's file lives: None, "dup" (dup_fd) or "child".
        self.copy = None
        self.dup_fd = None

    def close(self) -> None:
        self.a.close()
        if self.b_open:
            self.b.close()
        self.a_open = self.b_open = False
        if self.dup_fd is not None:
            os.close(self.dup_fd)
            self.dup_fd = None


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


# The helper child: holds every descriptor it is sent until its control
# socket closes; one byte back says the copy exists.
_HOLDER = """
import socket, sys
ctl = socket.socket(fileno=int(sys.argv[1]))
held = []
while True:
    msg, fds, _flags, _addr = socket.recv_fds(ctl, 16, 64)
    if not msg:
        break
    held.extend(fds)
    ctl.sendall(b"k")
"""


class _Holder:
    """A child process holding copies of the descriptors it is sent."""

    def __init__(self) -> None:
        self.ctl, theirs = socket.socketpair()
        try:
            self.child = subprocess.Popen([sys.executable, "-S", "-I", "-c", _HOLDER,
                                           str(theirs.fileno())],
                                          pass_fds=[theirs.fileno()])
        finally:
            theirs.close()
        self.ctl.settimeout(10)

    def hold(self, fd: int) -> None:
        socket.send_fds(self.ctl, [b"c"], [fd])
        assert self.ctl.recv(1) == b"k", "the holder child did not take the copy"

    def close(self) -> None:
        self.ctl.close()
        self.child.wait(10)


class _Orphan:
    """A registered socket closed while a copy of its file lives on."""

    def __init__(self, sock, peer, copy, dup_fd, armed, ready_at_close) -> None:
        self.copy = copy                  # "dup" or "child"
        self.sock = sock                  # the closed object (the selectors' stale fileobj)
        self.peer = peer                  # still open unless the pair was closed
        self.dup_fd = dup_fd              # our copy, or None: the child holds it
        self.armed = armed                # not reported by the last select before the close
        self.ready_at_close = ready_at_close  # (readable, writable) then
        self.fed = False                  # the peer sent it data since
        self.reports = 0

    def ready(self):
        """(readable, writable) of the orphaned file, where it is known for
        sure: our dup can be asked; a child's copy is as it was at the
        close, plus what happened to it since (data sent, the peer gone).
        None when the last copy is closed (the kernel dropped the item)."""
        if self.dup_fd is not None:
            return _oracle(self.dup_fd)
        if self.copy == "dup":
            return None
        readable, writable = self.ready_at_close
        return readable or self.fed or self.peer is None, writable


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
        # id(closed socket) -> _Orphan, for the whole test case.
        self.orphans = {}
        self.holder = None
        # ids of the file objects the last select reported (their one-shot
        # registrations are disarmed until the next select re-arms them);
        # None after a rule whose selects ran in two threads at once.
        self.last_reported = set()

    def teardown(self) -> None:
        self.ours.close()
        self.ref.close()
        for slot in self.slots:
            slot.close()
        for orphan in self.orphans.values():
            if orphan.peer is not None:
                orphan.peer.close()
            if orphan.dup_fd is not None:
                os.close(orphan.dup_fd)
        if self.holder is not None:
            self.holder.close()

    def _both(self, name, *args):
        old = self.ours.get_map().get(args[0]) if name == "modify" else None
        got = _outcome(lambda: getattr(self.ours, name)(*args))
        want = _outcome(lambda: getattr(self.ref, name)(*args))
        reference = type(self.ref).__name__
        assert got == want, f"{name}{args!r}: NotifySelector {got}, {reference} {want}"
        if got[0] == "ok" and self.last_reported is not None and (
                name == "register" or (name == "modify" and old.events != args[1])):
            # A new registration is armed; a modify that changes the
            # events re-arms it at once (one EPOLL_CTL_MOD).
            self.last_reported.discard(id(args[0]))

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
        place, which often reuses the descriptor numbers. With a copy of
        the registered socket's file elsewhere, it becomes an orphan whose
        peer is gone (a hang-up: ready at once)."""
        self._close_behind_back(i, keep_peer=False)

    # -- copies elsewhere, closes behind the back (Linux: epoll's orphans) -------

    def _registered_slots(self, copied=None):
        """Indices of the slots whose socket is registered under its own
        object; with ``copied`` given, only those with (True) or without
        (False) a copy elsewhere."""
        registered = self.ref.get_map()
        return [i for i, slot in enumerate(self.slots)
                if slot.a_open and slot.a in registered
                and registered[slot.a].fileobj is slot.a
                and (copied is None or (slot.copy is not None) == copied)]

    @precondition(lambda self: LINUX and self._registered_slots(copied=False))
    @rule(data=st.data(), kind=st.sampled_from(["dup", "child"]))
    def copy_elsewhere(self, data, kind):
        """A registered socket's file gets a copy: a dup() of its
        descriptor in this process, or one held by a child process (what a
        fork leaves behind; one child per test case)."""
        self._copy(self.slots[data.draw(st.sampled_from(self._registered_slots(copied=False)))],
                   kind)

    def _copy(self, slot, kind):
        if kind == "dup":
            slot.dup_fd = os.dup(slot.a.fileno())
        else:
            if self.holder is None:
                self.holder = _Holder()
            self.holder.hold(slot.a.fileno())
        slot.copy = kind

    # SelectSelector's select() fails on a closed registered socket.
    @precondition(lambda self: not WINDOWS and self._registered_slots())
    @rule(data=st.data(), then_unregister=st.booleans())
    def close_behind_back(self, data, then_unregister):
        """Close a registered socket (its peer stays open) without
        unregistering it; then, or in a later step, unregister the closed
        object (which must not raise). With a copy elsewhere it becomes an
        orphan."""
        i = data.draw(st.sampled_from(self._registered_slots()))
        sock = self._close_behind_back(i, keep_peer=True)
        if then_unregister:
            self.stale.remove(sock)
            self._both("unregister", sock)

    @precondition(lambda self: LINUX)
    @rule(i=pool_index, events=masks, kind=st.sampled_from(["dup", "child"]))
    def make_orphan(self, i, events, kind):
        """The three steps above at once, so that short runs meet orphans
        often: register (a new registration is armed), copy, close."""
        slot = self.slots[i]
        if slot.a not in self.ref.get_map():
            self._both("register", slot.a, events)
        if i in self._registered_slots(copied=False):
            self._copy(slot, kind)
            self._close_behind_back(i, keep_peer=True)

    @precondition(lambda self: any(o.peer is not None for o in self.orphans.values()))
    @rule(data=st.data(), size=st.sampled_from([1, 5000]))
    def orphan_peer_sends(self, data, size):
        """Data for an orphan's file: ready for reading, nobody to read it."""
        orphan = data.draw(st.sampled_from(
            [o for o in self.orphans.values() if o.peer is not None]))
        with contextlib.suppress(OSError):
            orphan.peer.send(b"o" * size)
            orphan.fed = True

    @precondition(lambda self: any(o.dup_fd is not None for o in self.orphans.values()))
    @rule(data=st.data())
    def orphan_copy_closed(self, data):
        """The last copy of an orphan's file is closed (with its peer): the
        kernel drops the item."""
        orphan = data.draw(st.sampled_from(
            [o for o in self.orphans.values() if o.dup_fd is not None]))
        os.close(orphan.dup_fd)
        orphan.dup_fd = None
        if orphan.peer is not None:
            orphan.peer.close()
            orphan.peer = None

    def _close_behind_back(self, i, keep_peer):
        """Close slot ``i``'s socket (and its peer unless ``keep_peer``),
        put a new pair in its place; returns the closed socket if it was
        registered (it is then in ``self.stale``)."""
        slot = self.slots[i]
        registered = slot.a in self.ref.get_map()
        if registered and WINDOWS:
            self._both("unregister", slot.a)
            registered = False
        # Registered under its own object (not a stale one's number).
        own = registered and self.ref.get_map()[slot.a].fileobj is slot.a
        orphan = None
        if own and slot.copy is not None:
            # The reference must not see the orphan (see the module
            # docstring): its item leaves its epoll object now, its map
            # keeps the key.
            self.ref._selector.unregister(slot.a.fileno())
            armed = self.last_reported is not None and id(slot.a) not in self.last_reported
            peer = slot.b if keep_peer and slot.b_open else None
            orphan = _Orphan(slot.a, peer, slot.copy, slot.dup_fd, armed, _oracle(slot.a))
            self.orphans[id(slot.a)] = orphan
            slot.dup_fd = None   # the orphan's now
            if peer is not None:
                slot.b_open = False   # the orphan's now: slot.close() leaves it
                slot.a.close()
        slot.close()
        if registered:
            self.stale.append(slot.a)
        self.slots[i] = _Slot(tcp=slot.tcp)
        return slot.a if registered else None

    # -- a second thread --------------------------------------------------------

    @rule(ops=st.lists(st.tuples(st.sampled_from(["register", "modify", "unregister", "select"]),
                                 pool_index, masks), min_size=1, max_size=4))
    def changes_from_another_thread(self, ops):
        """register/modify/unregister (and a select) in a worker thread
        while the main thread selects: whichever select meets the other is
        refused with RuntimeError, having touched nothing."""
        before = list(self.ours.get_map().values())
        outcomes, worker_reports, made = [], [], []
        go = threading.Event()

        def work():
            go.wait(5)
            time.sleep(0.002)   # the main thread is in its wait by now
            for name, i, events in ops:
                if name == "select":
                    try:
                        worker_reports.append(self.ours.select(0))
                    except RuntimeError:
                        pass   # the main thread is selecting
                    continue
                sock = self.slots[i].a
                args = (sock,) if name == "unregister" else (sock, events)
                outcome = _outcome(lambda: getattr(self.ours, name)(*args))  # noqa: B023
                outcomes.append(outcome)
                if outcome[0] == "ok":
                    made.append(self.ours.get_map().get(sock))

        worker = threading.Thread(target=work)
        worker.start()
        reports = []
        try:
            go.set()
            while True:
                try:
                    reports.append(self.ours.select(0.01))
                except RuntimeError:
                    pass   # the worker is selecting (refused: touches nothing)
                if not worker.is_alive():
                    break
        finally:
            worker.join(10)
        assert not worker.is_alive(), "the worker thread is stuck"
        # The same calls on the reference, in order.
        want = []
        for name, i, events in ops:
            if name != "select":
                sock = self.slots[i].a
                args = (sock,) if name == "unregister" else (sock, events)
                want.append(_outcome(lambda: getattr(self.ref, name)(*args)))  # noqa: B023
        assert outcomes == want, f"{ops!r} from a second thread: NotifySelector {outcomes}, " \
                                 f"{type(self.ref).__name__} {want}"
        known = {id(k) for k in before} | {id(k) for k in made if k is not None}
        for got in reports + worker_reports:
            fds = [key.fd for key, _ in got]
            assert len(fds) == len(set(fds)), f"a descriptor reported twice by one select: {got}"
            for key, mask in self._orphan_reports(got):
                assert id(key) in known, f"{key} reported, never registered in this step"
                assert mask and not mask & ~key.events, f"{key}: mask {mask} outside its events"
                readable, writable = _oracle(key.fileobj)
                assert not (mask & READ) or readable, f"{key} reported readable, it is not"
                assert not (mask & WRITE) or writable, f"{key} reported writable, it is not"
        # Which selects ran last is unknown: the next comparison's select tells.
        self.last_reported = None

    # -- a signal handler and an exception inside a change -------------------------

    _WAIT_CALLS = frozenset({"sn_port_select_at", "sn_port_wait_at", "sn_port_poll_at",
                             "sn_port_block_at", "poll", "select"})

    def _select_with_handler(self, selector, handler):
        """select(0) on ``selector`` with ``handler`` run where a signal
        handler runs when a signal arrives during the wait: right after the
        wait returns, before the answer is read."""
        if selector is self.ref and WINDOWS and not selector.get_map():
            # Windows select() refuses three empty sets (WSAEINVAL): no
            # wait, so the handler runs where the wait would have ended.
            handler(selector)
            return []
        selector_file = (selector_module.__file__ if selector is self.ours
                         else selectors.__file__)
        ran = []

        def profile(frame, event, arg):
            if (not ran and event == "c_return" and frame.f_code.co_filename == selector_file
                    and getattr(arg, "__name__", "") in self._WAIT_CALLS):
                ran.append(1)
                handler(selector)

        sys.setprofile(profile)
        try:
            return selector.select(0)
        finally:
            sys.setprofile(None)

    # The handler is run from a profile function's "c_return" event of the
    # wait's call, which CPython emits for a C function and PyPy does not
    # for a cffi call: there the rule would compare a selector whose
    # handler never ran.
    @precondition(lambda self: platform.python_implementation() == "CPython")
    @rule(i=pool_index, j=pool_index, events=masks)
    def signal_handler_re_registers(self, i, j, events):
        """A signal handler unregisters socket i and registers socket j
        while the wait's answer is in flight. Every key reported is one
        registered now, with a true mask within its events, and EpollSelector
        (which maps descriptors to keys after the handler) reports it too
        unless our answer named the registration the handler ended."""
        a, b = self.slots[i].a, self.slots[j].a
        outcomes = {}

        def handler(selector):
            got = [_outcome(lambda: selector.unregister(a))]
            got.append(_outcome(lambda: selector.register(b, events)))
            outcomes[selector is self.ours] = got

        ours = self._select_with_handler(self.ours, handler)
        ref = self._select_with_handler(self.ref, handler)
        assert outcomes.get(True) == outcomes.get(False), outcomes
        registered = {id(key) for key in self.ours.get_map().values()}
        ref_fds = {key.fd for key, _ in ref}
        for key, mask in self._orphan_reports(ours):
            assert id(key) in registered, f"{key} reported after the handler ended it"
            assert mask and not mask & ~key.events, f"{key}: mask {mask} outside its events"
            readable, writable = _oracle(key.fileobj)
            assert not (mask & READ) or readable, f"{key} reported readable, it is not"
            assert not (mask & WRITE) or writable, f"{key} reported writable, it is not"
            assert key.fd in ref_fds or key.fd == b.fileno(), (
                f"{key} reported by NotifySelector only")
        self.last_reported = None

    @rule(name=st.sampled_from(["register", "modify", "unregister"]), i=pool_index,
          events=masks, point=st.integers(1, 30))
    def exception_inside_a_change(self, name, i, events, point):
        """An exception (a signal handler's, KeyboardInterrupt) lands at the
        ``point``-th place of a register/modify/unregister where CPython runs
        pending calls. The reference is then brought to what NotifySelector
        recorded; the next comparison finds the port agreeing with it."""
        sock = self.slots[i].a
        fd = sock.fileno()
        count = [0]

        def profile(frame, event, arg):
            if (event in ("c_return", "call")
                    and frame.f_code.co_filename in _CHANGE_FILES):
                # Not where a lock was just taken (a `with` statement does
                # not release it if an exception lands before its block:
                # CPython's own limitation), which would deadlock the run.
                if event == "c_return" and getattr(arg, "__name__", "") in (
                        "__enter__", "acquire"):
                    return
                count[0] += 1
                if count[0] == point:
                    raise _Injected

        args = (sock,) if name == "unregister" else (sock, events)
        sys.setprofile(profile)
        try:
            getattr(self.ours, name)(*args)
        except _Injected:
            pass
        except (KeyError, ValueError, OSError):
            pass
        finally:
            sys.setprofile(None)
        ours = self.ours.get_map().get(fd)
        ref = self.ref.get_map().get(fd)
        if ours is None and ref is not None:
            self.ref.unregister(ref.fileobj)
        elif ours is not None and ref is None:
            self.ref.register(ours.fileobj, ours.events)
        elif ours is not None and ref is not None and (
                ours.events != ref.events or ours.fileobj is not ref.fileobj):
            self.ref.unregister(ref.fileobj)
            self.ref.register(ours.fileobj, ours.events)
        if self.last_reported is not None:
            self.last_reported.discard(id(sock))

    # -- the comparison after every step ----------------------------------------

    def _orphan_reports(self, got):
        """Checks the reports of orphans against the one-shot semantics (at
        most one each) and returns the others."""
        others = []
        for key, mask in got:
            orphan = self.orphans.get(id(key.fileobj))
            if orphan is None or orphan.sock is not key.fileobj:
                others.append((key, mask))
                continue
            assert orphan.reports == 0, f"orphan {key} reported again (mask {mask})"
            assert orphan.armed, f"orphan {key} reported though it was disarmed at the close"
            assert orphan.ready() is not None, f"orphan {key} reported after its last copy closed"
            assert mask and not mask & ~key.events, f"orphan {key}: mask {mask} outside its events"
            orphan.reports += 1
        return others

    def _orphans_owed(self):
        """Orphans the next select owes a report: armed at the close, still
        registered, their file alive and ready for the key's events."""
        registered = {id(key.fileobj): key for key in self.ours.get_map().values()}
        owed = set()
        for ident, orphan in self.orphans.items():
            key = registered.get(ident)
            ready = orphan.ready()
            if key is None or not orphan.armed or orphan.reports or ready is None:
                continue
            readable, writable = ready
            if (readable and key.events & READ) or (writable and key.events & WRITE):
                owed.add(ident)
        return owed

    def _ready(self, selector):
        if selector is self.ref and WINDOWS and not selector.get_map():
            return []   # Windows select() refuses three empty sets (WSAEINVAL)
        got = selector.select(0)
        if selector is self.ours:
            self.last_reported = {id(key.fileobj) for key, _ in got}
            got = self._orphan_reports(got)
        return sorted((key.fd, mask) for key, mask in got)

    @invariant()
    def same_readiness(self):
        # Same registrations, then same readiness. TCP loopback state
        # travels through the stack asynchronously: a difference is
        # re-checked a few times before it counts.
        assert sorted(self.ours.get_map()) == sorted(self.ref.get_map())
        owed = self._orphans_owed()
        for attempt in range(4):
            ours, ref = self._ready(self.ours), self._ready(self.ref)
            owed = {ident for ident in owed if not self.orphans[ident].reports}
            if ours == ref and not owed:
                return
            time.sleep(0.02 * (attempt + 1))
        assert ours == ref, f"NotifySelector {ours} != {type(self.ref).__name__} {ref}"
        assert not owed, ("armed, ready orphans never reported: "
                          f"{[self.orphans[i].sock for i in owed]}")


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
