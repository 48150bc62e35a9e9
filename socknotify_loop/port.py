"""The notification port: the Pythonic face of the C core.

A :class:`Port` is one completion port (Windows) or one epoll instance
(Linux) speaking the Winsock "socket state notifications" contract:
registrations are applied and notifications are dequeued in ONE call,
:meth:`Port.process`, exactly like ``ProcessSocketNotifications``::

    with Port() as port:
        reg = Registration(sock, key=1, events=EVENT_IN)   # LEVEL|ONESHOT
        for key, events in port.process([reg], timeout=1.0):
            ...

This module is the only one that imports the compiled core (through
``_core_import``, which explains an unbuilt source tree) and turns the
core's error codes into the exceptions ``socket`` and ``selectors`` raise.
For the selector's hot path it also hands out a few of the core's
functions themselves (:meth:`Port.select_function`,
:meth:`Port.wait_functions`, :meth:`Port.change_function`), which the
selector and the loop then call directly with :attr:`Port.address`.
"""
from __future__ import annotations

import errno
import functools
import os
import struct
import sys
import threading
import time
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from ._backends import backend_from_environment, parse_backend_name
from ._core_import import ffi, lib

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    import socket

__all__ = [
    "Port", "Registration", "Change", "backend_info", "available_backends", "fileno_of",
    "RawPort",
    "EVENT_IN", "EVENT_OUT", "EVENT_HANGUP", "EVENT_ERR", "EVENT_REMOVE", "EVENT_IO",
    "IO_COMPLETION_KEY",
    "OP_NONE", "OP_ENABLE", "OP_DISABLE", "OP_REMOVE",
    "TRIGGER_ONESHOT", "TRIGGER_PERSISTENT", "TRIGGER_LEVEL", "TRIGGER_EDGE",
]

#: ``SOCK_NOTIFY_EVENT_IN``: readable (data, end of stream, or a
#: connection to accept).
EVENT_IN: int = lib.SN_EVENT_IN
#: ``SOCK_NOTIFY_EVENT_OUT``: writable.
EVENT_OUT: int = lib.SN_EVENT_OUT
#: ``SOCK_NOTIFY_EVENT_HANGUP``: the connection is closed or reset.
EVENT_HANGUP: int = lib.SN_EVENT_HANGUP
#: ``SOCK_NOTIFY_EVENT_ERR``: the socket has an error pending.
EVENT_ERR: int = lib.SN_EVENT_ERR
#: ``SOCK_NOTIFY_EVENT_REMOVE``: the registration is gone (the last
#: notification a key receives after :data:`OP_REMOVE`).
EVENT_REMOVE: int = lib.SN_EVENT_REMOVE
#: Not a socket event: an overlapped I/O completion on the port (Windows);
#: the notification's key is the OVERLAPPED's address.
EVENT_IO: int = lib.SN_EVENT_IO
#: The completion key to associate overlapped handles with a port under.
IO_COMPLETION_KEY: int = lib.sn_io_completion_key()

#: ``SOCK_NOTIFY_OP_NONE``: change nothing.
OP_NONE: int = lib.SN_OP_NONE
#: ``SOCK_NOTIFY_OP_ENABLE``: register, or re-arm, with the given events.
OP_ENABLE: int = lib.SN_OP_ENABLE
#: ``SOCK_NOTIFY_OP_DISABLE``: stop notifying, keep the registration.
OP_DISABLE: int = lib.SN_OP_DISABLE
#: ``SOCK_NOTIFY_OP_REMOVE``: remove the registration (answered by
#: :data:`EVENT_REMOVE`).
OP_REMOVE: int = lib.SN_OP_REMOVE

#: ``SOCK_NOTIFY_TRIGGER_ONESHOT``: disabled after one notification.
TRIGGER_ONESHOT: int = lib.SN_TRIGGER_ONESHOT
#: ``SOCK_NOTIFY_TRIGGER_PERSISTENT``: stays enabled.
TRIGGER_PERSISTENT: int = lib.SN_TRIGGER_PERSISTENT
#: ``SOCK_NOTIFY_TRIGGER_LEVEL``: notifies while the condition holds.
TRIGGER_LEVEL: int = lib.SN_TRIGGER_LEVEL
#: ``SOCK_NOTIFY_TRIGGER_EDGE``: notifies when the condition arises.
TRIGGER_EDGE: int = lib.SN_TRIGGER_EDGE

_FILTER_EVENTS = EVENT_IN | EVENT_OUT | EVENT_HANGUP
_ALL_TRIGGERS = TRIGGER_ONESHOT | TRIGGER_PERSISTENT | TRIGGER_LEVEL | TRIGGER_EDGE
_OPS = (OP_NONE, OP_ENABLE, OP_DISABLE, OP_REMOVE)
_MAX_KEY = (1 << 64) - 1

_BACKENDS = {"epoll": lib.SN_BACKEND_EPOLL, "psn": lib.SN_BACKEND_PSN, "afd": lib.SN_BACKEND_AFD}
#: Whether the core is a test build (SOCKNOTIFY_TESTING=1 when it was
#: compiled): only such a build has the strict model (backend ``strict``)
#: and its controls.
TEST_BUILD: bool = hasattr(lib, "SN_BACKEND_STRICT")
if TEST_BUILD:
    _BACKENDS["strict"] = lib.SN_BACKEND_STRICT
#: Why a production build has no ``strict`` backend, and how to get one.
_NO_STRICT = ("the strict model of ProcessSocketNotifications is compiled into test builds "
              "only: build the core with SOCKNOTIFY_TESTING=1 in the environment "
              "(SOCKNOTIFY_TESTING=1 pip install -e .; `python -m tools.wine test` does so)"
              if sys.platform == "win32" else
              "the strict model of ProcessSocketNotifications runs only on Windows, in a "
              "test build of the core (SOCKNOTIFY_TESTING=1 when it is built)")

#: Names of the kernel-call counters, in the core's order (SN_COUNT_*).
COUNTER_NAMES = ("waits", "changes", "wakes", "drains",
                 "afd_polls", "afd_cancels", "afd_dequeues", "afd_posts", "fallbacks",
                 "refused")
assert len(COUNTER_NAMES) == lib.SN_COUNTERS


class Change(NamedTuple):
    """One registration change as the core reads it (``sn_registration_t``
    without its result field): what :meth:`Port.process` packs for each
    :class:`Registration`, and what the selector queues."""

    fd: int
    key: int
    events: int
    op: int
    trigger: int


# sn_registration_t and sn_notification_t, packed and unpacked in one call
# each instead of one cffi attribute access per field.
_REGISTRATION = struct.Struct("=QQHBBI")   # Change fields, then the result
_NOTIFICATION = struct.Struct("=QI4x")     # key, events
_RESULT_WORD = 5                           # sn_registration_t.result as the 6th uint32
assert _REGISTRATION.size == ffi.sizeof("sn_registration_t") == 24
assert _NOTIFICATION.size == ffi.sizeof("sn_notification_t")

_NOTE_SIZE = _NOTIFICATION.size
_iter_notes = _NOTIFICATION.iter_unpack
_from_buffer = ffi.from_buffer
_NULL = ffi.NULL
_INFINITE: float = float(lib.SN_INFINITE)
_ERROR_CLOSED: int = lib.sn_error_closed()
_ERROR_BUSY: int = lib.sn_error_busy()
_ERROR_INTERRUPTED: int = lib.sn_error_interrupted()
# What process() packs when it has no changes (never written to: nothing
# reads it, since the core gets NULL and no results are unpacked).
_NO_CHANGES = bytearray()

# A process() call returns at most this many notifications, whatever
# max_events says (the rest wait for the next call), so a huge max_events
# never allocates a huge buffer; buffers up to _CACHED_EVENTS entries are
# kept for reuse, larger ones are not.
_BATCH_LIMIT = 65536
_CACHED_EVENTS = 4096

Socket = Union[int, "object"]  # an int fileno or any object with fileno()


def _os_error(code: int, what: str = "") -> OSError:
    """The OSError subclass CPython would raise for this OS error code."""
    if sys.platform == "win32":
        winerror, message = ffi.getwinerror(code)
        if what:
            message = f"{what}: {message}"
        return OSError(0, message, None, winerror)
    message = os.strerror(code)
    if what:
        message = f"{what}: {message}"
    return OSError(code, message)


def fileno_of(sock: Socket, bounded: bool = True) -> int:
    """A socket's descriptor, validated the way selectors validate one
    (``ValueError`` for an object without a valid ``fileno()``); the
    selector validates what it is given with it. ``bounded``: a number
    wider than a port's 64-bit key is a ValueError too (the Port API's
    rule); the selector passes False, since the stdlib selectors accept any
    number here and leave the OS call to refuse what does not fit."""
    if isinstance(sock, int):
        fd = sock
    else:
        try:
            fd = int(sock.fileno())  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {sock!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    if bounded and fd > _MAX_KEY:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


def _check_trigger(trigger: int) -> None:
    if not isinstance(trigger, int) or trigger & ~_ALL_TRIGGERS:
        raise ValueError(f"Invalid trigger flags: {trigger!r}")
    if trigger & TRIGGER_ONESHOT and trigger & TRIGGER_PERSISTENT:
        raise ValueError("TRIGGER_ONESHOT and TRIGGER_PERSISTENT are exclusive")
    if trigger & TRIGGER_LEVEL and trigger & TRIGGER_EDGE:
        raise ValueError("TRIGGER_LEVEL and TRIGGER_EDGE are exclusive")


def wait_ms(timeout: Optional[float]) -> float:
    """Seconds to the milliseconds the core's waits take, as selectors
    reads a timeout: None waits forever, ``<= 0`` polls, a positive number
    is multiplied by 1000 and nothing more. The rounding -- UP to whole
    milliseconds, so a wait never ends early (what the stdlib selectors
    do) -- and the clamp belong to the core (``sn__wait_ms``), the one
    place a timeout is converted. NaN raises ValueError, as selectors'
    ``math.ceil`` does."""
    if timeout is None:
        return _INFINITE
    if timeout > 0:
        return timeout * 1e3
    if timeout <= 0:
        return 0.0
    raise ValueError(f"timeout must be a number of seconds, not {timeout!r}")


class Registration:
    """One registration change, in ``SOCK_NOTIFY_REGISTRATION``'s order.

    ``sock`` is a socket object or a file descriptor, ``key`` the integer
    completion key returned with each notification, ``events`` the filter
    (``EVENT_IN | EVENT_OUT | EVENT_HANGUP``), ``op`` one ``OP_*`` and
    ``trigger`` the ``TRIGGER_*`` flags (used by ``OP_ENABLE``). After
    :meth:`Port.process`, ``result`` holds 0 or the OS error code of this
    change and :attr:`error` the matching exception.
    """

    __slots__ = ("socket", "key", "events", "op", "trigger", "result")

    def __init__(self, sock: Socket, key: int, events: int = EVENT_IN,
                 op: int = OP_ENABLE,
                 trigger: int = TRIGGER_LEVEL | TRIGGER_ONESHOT) -> None:
        self.socket = sock
        self.key = key
        self.events = events
        self.op = op
        self.trigger = trigger
        self.result = 0

    @property
    def error(self) -> Optional[OSError]:
        """The exception for a failed change, or None."""
        return _os_error(self.result) if self.result else None

    def _validated(self) -> Change:
        fd = fileno_of(self.socket)
        if not isinstance(self.key, int) or not 0 <= self.key <= _MAX_KEY:
            raise ValueError(f"Invalid key (an integer from 0 to 2**64-1): {self.key!r}")
        if not isinstance(self.events, int) or self.events & ~_FILTER_EVENTS:
            raise ValueError(f"Invalid events: {self.events!r}")
        if self.op not in _OPS:
            raise ValueError(f"Invalid operation: {self.op!r}")
        _check_trigger(self.trigger)
        return Change(fd, self.key, self.events, self.op, self.trigger)

    def __repr__(self) -> str:
        return (f"Registration(sock={self.socket!r}, key={self.key!r}, "
                f"events={self.events:#x}, op={self.op}, trigger={self.trigger:#x}, "
                f"result={self.result})")


def available_backends() -> Dict[str, Tuple[bool, str]]:
    """``{name: (available, reason)}`` for every backend of the core."""
    buf = ffi.new("char[]", 512)
    answer = {}
    for name, number in _BACKENDS.items():
        ok = bool(lib.sn_backend_available(number, buf, 512))
        answer[name] = (ok, ffi.string(buf).decode("utf-8", "replace"))
    answer.setdefault("strict", (False, _NO_STRICT))
    return answer


def _requested_backend(backend: Optional[str]) -> str:
    """The backend a new Port uses: ``backend``, else SOCKNOTIFY_BACKEND,
    else the core's choice (its order of preference is the only one)."""
    name = backend_from_environment() if backend is None else parse_backend_name(backend)
    if name is None:
        number = lib.sn_backend_default()
        for name, value in _BACKENDS.items():
            if value == number:
                return name
        raise OSError(errno.ENOSYS, f"no notification backend on {sys.platform}")
    return name


def backend_info(backend: Optional[str] = None) -> Dict[str, Any]:
    """Which backend a new Port would use and why.

    Returns ``{'backend': name, 'usable': bool, 'reason': sentence,
    'available': {name: (bool, reason)}}``; the backend may be forced with
    ``SOCKNOTIFY_BACKEND``, and ``usable`` is False when the forced one is
    not available here.
    """
    available = available_backends()
    name = _requested_backend(backend)
    usable, reason = available[name]
    return {"backend": name, "usable": usable, "reason": reason, "available": available}



@functools.cache
def _closed_epoll_words() -> str:
    """What the running interpreter's ``select.epoll`` says once closed
    (CPython: "closed epoll object", PyPy: "closed epoll fd"). Asked once,
    of an epoll object made and closed for it; a process out of
    descriptors at that moment gets CPython's words instead of none."""
    if sys.platform != "linux":
        raise RuntimeError("no epoll object outside Linux")   # only epoll's port asks
    import select
    try:
        epoll = select.epoll()
    except OSError:
        return "I/O operation on closed epoll object"
    epoll.close()
    try:
        epoll.poll(0)
    except ValueError as exc:
        return str(exc)
    raise RuntimeError("a closed select.epoll object accepted poll()")

class Port:
    """A notification port: one completion port (Windows) or epoll (Linux).

    ``backend`` is ``'epoll'``, ``'psn'`` (the OS's ProcessSocketNotifications),
    ``'afd'`` (the IOCTL_AFD_POLL polyfill), ``'strict'`` (for tests: the
    strict model of ProcessSocketNotifications, in a test build of the core
    only, never chosen unless named), or None for the environment
    variable ``SOCKNOTIFY_BACKEND`` or else the best one available. Asking
    for a backend this machine lacks raises :class:`OSError` with the reason.

    Every method is safe to call from any thread at any time, :meth:`close`
    included: waiting releases the GIL, several threads may wait on one
    port (each notification goes to one of them), and :meth:`close` wakes
    them all. A port does not survive ``fork()``: in the child it behaves
    as closed (:meth:`close` there releases only the child's descriptors).
    """

    def __init__(self, backend: Optional[str] = None) -> None:
        name = _requested_backend(backend)
        if name not in _BACKENDS:
            raise OSError(errno.ENOSYS, f"backend {name!r} is not available: {_NO_STRICT}")
        error = ffi.new("int *")
        handle = lib.sn_port_open(_BACKENDS[name], error)
        if handle == ffi.NULL:
            if error[0] == lib.sn_error_not_supported():
                reason = available_backends()[name][1]
                raise OSError(errno.ENOSYS, f"backend {name!r} is not available: {reason}")
            raise _os_error(error[0], f"cannot open a {name} port")
        # The C port's memory lives exactly as long as this object: a call
        # racing close() reads valid memory and fails cleanly in the core.
        self._handle = ffi.gc(handle, lib.sn_port_free)
        self._backend = name
        self._pid = os.getpid()
        self._triggers = lib.sn_backend_triggers(_BACKENDS[name])
        self._caps = lib.sn_backend_caps(_BACKENDS[name])
        self._lock = threading.Lock()
        self._closed = False
        self._held: List[Tuple[int, int]] = []   # notifications of a call that raised
        # Notification buffers, reused across calls: (bytes, cdata view, count cell).
        self._spare: List[Tuple[bytearray, Any, Any]] = []

    # -- properties ---------------------------------------------------------

    @property
    def backend(self) -> str:
        """The backend's name: ``'epoll'``, ``'psn'``, ``'afd'`` or ``'strict'``."""
        return self._backend

    @property
    def os_handle(self) -> int:
        """The OS object behind the port: the completion port HANDLE on
        Windows (associate overlapped handles with it under
        :data:`IO_COMPLETION_KEY`), the epoll descriptor on Linux."""
        out = ffi.new("uint64_t *")
        self._check(lib.sn_port_os_handle(self._handle, out))
        return int(out[0])

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or in a forked child)."""
        return self._closed or os.getpid() != self._pid

    @property
    def registered(self) -> int:
        """Number of live registrations."""
        if self.closed:
            raise self._closed_error()
        return int(lib.sn_port_registered(self._handle))

    @property
    def changes_at_once(self) -> bool:
        """Whether every registration change costs a system call of its own
        (epoll), so that nothing is saved by carrying changes to the next
        wait (see ``SN_CAP_CHANGES_AT_ONCE``)."""
        return bool(self._caps & lib.SN_CAP_CHANGES_AT_ONCE)

    def supports(self, trigger: int) -> bool:
        """Whether this backend honours all the given ``TRIGGER_*`` flags."""
        return not (trigger & ~self._triggers)

    def counters(self) -> Dict[str, int]:
        """Kernel calls made for this port so far, by kind (see
        ``COUNTER_NAMES``): ``waits`` (epoll_wait, or calls of the
        ProcessSocketNotifications function: the OS's on psn, the polyfill
        on afd), ``changes`` (epoll_ctl), ``wakes``/``drains`` (eventfd or
        PostQueuedCompletionStatus), and on afd the polyfill's own
        NtDeviceIoControlFile polls, NtCancelIoFileEx cancels,
        GetQueuedCompletionStatusEx dequeues and posted packets; on psn and
        strict, ``fallbacks``: registrations the port's own function refused
        for a socket still open, which the polyfill took over on the same
        port. ``refused`` is no kernel call: it counts faults of the core's
        own, transitions of its records refused as starting from a wrong
        state (each answered with an error for the change that asked); it
        stays 0."""
        out = ffi.new("uint64_t[]", len(COUNTER_NAMES))
        n = lib.sn_port_counters(self._handle, out, len(COUNTER_NAMES))
        return {COUNTER_NAMES[i]: int(out[i]) for i in range(n)}

    # -- errors ---------------------------------------------------------------

    def _closed_error(self) -> ValueError:
        if os.getpid() != self._pid:
            return ValueError("I/O operation on closed port (it was opened by the "
                              "parent process; a port does not survive fork())")
        return ValueError("I/O operation on closed port")

    def _check(self, err: int, what: str = "") -> None:
        if err:
            if err == _ERROR_CLOSED and self.closed:
                raise self._closed_error()
            raise _os_error(err, what)

    # -- life cycle -----------------------------------------------------------

    def close(self) -> None:
        """Close the port; registrations are dropped. Idempotent.

        Threads waiting in :meth:`process` are woken and return; close()
        returns once they have left the core and the OS resources are
        released. Later calls raise :class:`ValueError`.
        """
        self._closed = True
        lib.sn_port_close(self._handle)   # the GIL is released meanwhile

    def __enter__(self) -> Port:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<Port backend={self._backend} {state}>"

    # -- the one call -------------------------------------------------------------

    def process(self, registrations: Iterable[Registration] = (),
                timeout: Optional[float] = None,
                max_events: int = 1024) -> List[Tuple[int, int]]:
        """Apply ``registrations`` in order, then wait for notifications.

        Returns a list of ``(key, events)``; a packet from :meth:`post` has
        ``events == 0``. ``timeout`` is in seconds: None waits forever, 0 or
        less polls, a positive value is rounded up to whole milliseconds.
        At most ``max_events`` (and at most 65536) notifications are
        returned; the rest wait for the next call. Each registration's
        ``result`` is filled in. If any failed, the call does not block, the
        first failure is raised as :class:`OSError` (its ``registration``
        attribute names it) and the notifications dequeued by this call are
        returned by the next one, so none is lost.
        """
        registrations = list(registrations)
        if max_events.__class__ is not int or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, not {max_events!r}")
        # Everything that can raise ValueError happens before anything is
        # taken from the port or from the held notifications.
        changes = [reg._validated() for reg in registrations]
        wait = wait_ms(timeout)
        count = len(changes)
        packed = _pack(changes) if count else _NO_CHANGES
        capacity = min(max_events, _BATCH_LIMIT)

        held = None
        if self._held:
            # A previous call raised after dequeuing: hand those over first
            # and do not block while doing so. Threads share the list.
            with self._lock:
                held, self._held = self._held, []
            if held:
                wait = 0.0
                capacity = max(1, capacity - len(held))

        try:
            raw, buffer, received = self._spare.pop()
            if len(raw) < capacity * _NOTE_SIZE:
                raw, buffer, received = self._new_buffer(capacity)
        except IndexError:
            raw, buffer, received = self._new_buffer(capacity)
        regs = _from_buffer("sn_registration_t[]", packed) if count else _NULL
        err = lib.sn_port_process(self._handle, 0, regs, count, wait,
                                  buffer, capacity, received)
        got = received[0]
        notifications = list(_iter_notes(memoryview(raw)[:got * _NOTE_SIZE])) if got else []
        if len(raw) <= _CACHED_EVENTS * _NOTE_SIZE:
            self._spare.append((raw, buffer, received))
        if held:
            notifications = held + notifications
        results = memoryview(packed).cast("I")[_RESULT_WORD::6] if count else ()
        for reg, code in zip(registrations, results):
            reg.result = code
        if err:
            self._hold(notifications)
            self._check(err, "waiting on the port failed")
        for index, code in enumerate(results):
            if code:
                self._hold(notifications)
                reg = registrations[index]
                error = _os_error(code, f"registration {index} ({reg!r}) failed")
                error.registration = reg  # type: ignore[attr-defined]
                raise error
        return notifications

    # -- what a selector built on the port uses ----------------------------------
    # NotifySelector reaches the C core through these methods and the
    # functions three of them hand out; only this module touches the cffi
    # handle. The selector lends the port no memory: the port owns the
    # buffers it binds.

    def probe(self, fd: int) -> int:
        """0 if ``fd`` passes the backend's cheap registration check (see
        ``sn_port_check``), else the error code a registration would get."""
        err: int = lib.sn_port_check(self._handle, fd)
        if err == _ERROR_CLOSED and self.closed:
            raise self._closed_error()
        return err

    @property
    def address(self) -> int:
        """This port's C object as an integer, the first argument of the
        functions below: the binding converts an integer for less than a
        pointer, on calls a loop makes every iteration. Valid while this
        Port lives (the caller keeps a reference to it)."""
        return int(lib.sn_port_address(self._handle))

    def change_function(self) -> Callable[[int, int, int, int, int, int], int]:
        """``f(address, fd, key, events, op, trigger) -> code`` applies one
        change at once (removes quiet, as a selector wants them) and returns
        0 or the error code :meth:`change_error` turns into an exception.
        ``address`` is :attr:`address`."""
        change: Callable[[int, int, int, int, int, int], int] = lib.sn_port_change_at
        return change

    def select_function(self) -> Callable[[int, int, float], int]:
        """``f(address, changes, wait_ms) -> answer`` (``address`` is
        :attr:`address`) applies the first ``changes`` changes of the bound
        change buffer and the port's one-shot re-arms, waits up to
        ``wait_ms`` milliseconds (a float, rounded up; negative waits
        forever) and writes ``(key, selector mask)`` pairs at the front of
        the bound output, the keys of I/O completions after them.

        The answer: minus an error code (:meth:`select_error`); or, when
        its two low bits are not 0, exactly one pair, key ``answer >> 2``
        and mask ``answer & 3``, which is not in the buffer; or else
        ``answer >> 2`` is the number of pairs in the buffer plus the
        number of I/O keys times 2**32. One thread at a time: another gets
        the busy error."""
        select: Callable[[int, int, float], int] = lib.sn_port_select_at
        return select

    def wait_functions(self) -> Tuple[Callable[[int], int], Callable[[int], int],
                                      Callable[[int, float], int]]:
        """``(poll, block, wait)``: with ``f`` of :meth:`select_function`,
        ``poll(address)`` is ``f(address, 0, 0)``, ``block(address)`` is
        ``f(address, 0, -1)`` and ``wait(address, wait_ms)`` is
        ``f(address, 0, wait_ms)``: the waits a loop makes, without queued
        changes, in calls of fewer arguments (which the binding makes for
        less)."""
        return lib.sn_port_poll_at, lib.sn_port_block_at, lib.sn_port_wait_at

    def bind_select_buffers(self, pairs: int, changes: int) -> Optional[Tuple[Any, int]]:
        """Bind to the port, for :meth:`select_function`, an output buffer
        of ``pairs`` pairs and a change buffer of ``changes`` entries.
        Returns the output as a memoryview of unsigned 64-bit words, and
        how many changes fit; None if a select is running in another thread
        (the old buffers stay bound). The port keeps the buffers alive."""
        words = 2 * pairs
        out = ffi.new("uint64_t[]", words)
        bound_changes = ffi.new("sn_registration_t[]", changes)
        err = lib.sn_port_bind(self._handle, bound_changes, changes, out, words)
        if err == _ERROR_BUSY:
            return None
        self._check(err, "binding the select buffers failed")
        # The core writes into these from now on; the old ones are free.
        self._select_buffers = (out, bound_changes)
        self._bound_changes = ffi.buffer(bound_changes)
        return memoryview(ffi.buffer(out)).cast("Q"), changes

    def pack_bound_changes(self, changes: Sequence[Tuple[int, int, int, int, int]]) -> None:
        """Write ``changes`` (each a :class:`Change` or its five numbers) at
        the front of the bound change buffer, for the next call of
        :meth:`select_function`'s function to carry (the caller made the
        buffer large enough with :meth:`bind_select_buffers`)."""
        buffer = self._bound_changes
        pack_into = _REGISTRATION.pack_into
        size = _REGISTRATION.size
        for offset, change in zip(range(0, len(changes) * size, size), changes):
            pack_into(buffer, offset, *change, 0)

    def change_error(self, code: int) -> Exception:
        """The exception for a change refused with ``code``: ValueError on
        a closed port, else the OSError CPython raises for the code."""
        if code == _ERROR_CLOSED and self.closed:
            return self.closed_error()
        return _os_error(code)

    def closed_error(self) -> ValueError:
        """What a call on this closed port raises: the ValueError and the
        words of the stdlib's poller of the same kind (on Linux, what the
        running interpreter's closed ``select.epoll`` says, as
        EpollSelector passes it on)."""
        if self.backend == "epoll":
            return ValueError(_closed_epoll_words())
        return ValueError("I/O operation on closed completion port")

    def too_wide_error(self, fd: int) -> OverflowError:
        """What registering ``fd``, a number too wide for this port, raises:
        on epoll, the running interpreter's own refusal of it as a file
        descriptor (CPython and PyPy word it differently, and
        EpollSelector passes it on), asked of ``select.poll``, whose
        register converts the number as epoll's does and holds no kernel
        object; elsewhere (64-bit socket handles) CPython's words."""
        if sys.platform == "linux" and self.backend == "epoll":
            import select
            try:
                select.poll().register(fd)
            except OverflowError as exc:
                return OverflowError(*exc.args)
        return OverflowError("Python int too large to convert to C int")

    def select_error(self, code: int) -> Optional[Exception]:
        """The exception for a select that answered ``-code``: None for a
        wait a signal cut short (its Python handler runs next, and the
        caller waits again), ValueError on a closed port, RuntimeError when
        another thread is selecting, else the OSError for the code."""
        if code == _ERROR_INTERRUPTED:
            return None
        if code == _ERROR_CLOSED:
            return self.closed_error()
        if code == _ERROR_BUSY:
            return RuntimeError("select() is already running in another thread")
        return _os_error(code, "select failed")

    @staticmethod
    def _new_buffer(capacity: int) -> Tuple[bytearray, Any, Any]:
        """A notification buffer: Python-owned bytes the C core writes
        into, its cdata view, and the count cell."""
        raw = bytearray(max(capacity, 64) * _NOTE_SIZE)
        return raw, _from_buffer("sn_notification_t[]", raw), ffi.new("uint32_t *")

    def _hold(self, notifications: List[Tuple[int, int]]) -> None:
        """Keep notifications of a call that raises for the next call."""
        if notifications:
            with self._lock:
                self._held = notifications + self._held

    def post(self, key: int) -> None:
        """Queue a packet with ``key``: one waiter receives ``(key, 0)``.
        (2**64-1 is refused: it is the selector's own wake-up, see
        :meth:`post_quiet_wakeup`.)"""
        if not isinstance(key, int) or not 0 <= key < _MAX_KEY:
            raise ValueError(f"Invalid key (an integer from 0 to 2**64-2): {key!r}")
        self._check(lib.sn_port_post(self._handle, key), "post failed")

    def post_quiet_wakeup(self) -> None:
        """Queue a packet that ends a waiting selector's call as a
        :meth:`post` does, but that :meth:`select_was_posted` does not
        count: a selector's wake-up of its own (a change made by another
        thread, which the waiting select takes before it waits again)."""
        self._check(lib.sn_port_post(self._handle, lib.SN_QUIET_WAKE_KEY), "post failed")

    def select_was_posted(self) -> bool:
        """Whether the last select of the bound buffers dequeued a packet of
        :meth:`post` (any but :meth:`post_quiet_wakeup`'s): a caller's
        wake-up, which ends the select."""
        return bool(lib.sn_port_select_posted(self._handle))


def _pack(changes: Sequence[Change]) -> bytearray:
    """Changes as an array of sn_registration_t (results zeroed)."""
    size = _REGISTRATION.size
    packed = bytearray(size * len(changes))
    pack_into = _REGISTRATION.pack_into
    try:
        for offset, change in zip(range(0, len(packed), size), changes):
            pack_into(packed, offset, *change, 0)
    except struct.error as exc:
        raise ValueError(f"invalid registration change: {exc}") from None
    return packed


# -- the bare function, for the OS probe ---------------------------------------------------

#: The returns of a bare call whose wait ended with no notification, besides
#: 0: Win32's WAIT_TIMEOUT and ERROR_TIMEOUT.
WAIT_TIMEOUT = 258
ERROR_TIMEOUT = 1460

#: One change of a bare call: ``(socket, key, events, op, trigger)``.
RawChange = Tuple["socket.socket", int, int, int, int]


class RawPort:
    """A completion port driven by one backend's bare
    ProcessSocketNotifications-shaped function (Windows only): no table,
    no kernel keys of the port's, the caller's keys handed to the function
    as they are (``sn_raw_*`` in the core). What ``python -m
    socknotify_loop --probe-os`` (:mod:`socknotify_loop.probe`) asks the
    OS's function, the strict model and the AFD polyfill through; a
    :class:`Port` is what programs use. Elsewhere, opening one raises
    OSError."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        if backend not in _BACKENDS:
            raise OSError(errno.ENOSYS, f"backend {backend!r} is not available: {_NO_STRICT}")
        self._number = _BACKENDS[backend]
        handle = ffi.new("uint64_t *")
        err = lib.sn_raw_open(self._number, handle)
        if err:
            raise OSError(err, f"cannot open a {backend} port")
        self._handle: Optional[int] = int(handle[0])

    def call(self, regs: Sequence[RawChange] = (), timeout_ms: int = 0,
             max_notifications: int = 16) -> Tuple[int, List[int], List[Tuple[int, int]]]:
        """One call: ``(return code, registration results, notifications)``.
        ``max_notifications`` 0 registers without waiting."""
        if self._handle is None:
            raise ValueError("port closed")
        n = len(regs)
        cregs = ffi.new("sn_registration_t[]", max(n, 1))
        for i, (sock, key, events, op, trigger) in enumerate(regs):
            cregs[i].socket = sock.fileno()
            cregs[i].key = key
            cregs[i].events = events
            cregs[i].op = op
            cregs[i].trigger = trigger
        notes = ffi.new("sn_notification_t[]", max(max_notifications, 1))
        received = ffi.new("uint32_t *")
        rc = lib.sn_raw_process(self._number, self._handle, cregs if n else ffi.NULL, n,
                                timeout_ms, notes, max_notifications, received)
        return (rc, [int(cregs[i].result) for i in range(n)],
                [(int(notes[i].key), int(notes[i].events)) for i in range(received[0])])

    def collect(self, ms: int) -> List[Tuple[int, int]]:
        """Every notification dequeued within ``ms`` milliseconds."""
        got: List[Tuple[int, int]] = []
        deadline = time.monotonic() + ms / 1000
        while True:
            left = int((deadline - time.monotonic()) * 1000)
            if left <= 0:
                return got
            rc, _, notes = self.call(timeout_ms=left)
            if rc not in (0, WAIT_TIMEOUT, ERROR_TIMEOUT):
                raise OSError(rc, "ProcessSocketNotifications failed")
            got.extend(notes)

    def close(self) -> None:
        if self._handle is not None:
            lib.sn_raw_close(self._number, self._handle)
            self._handle = None

    def __enter__(self) -> RawPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
