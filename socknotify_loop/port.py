"""The notification port: the Pythonic face of the C core.

A :class:`Port` is one completion port (Windows) or one epoll instance
(Linux) speaking the Winsock "socket state notifications" contract:
registrations are applied and notifications are dequeued in ONE call,
:meth:`Port.process`, exactly like ``ProcessSocketNotifications``::

    with Port() as port:
        reg = Registration(sock, key=1, events=EVENT_IN)   # LEVEL|ONESHOT
        for key, events in port.process([reg], timeout=1.0):
            ...

This module is the only importer of the compiled ``_socknotify`` module; it
turns the core's error codes into the exceptions ``socket`` and
``selectors`` raise.
"""
from __future__ import annotations

import errno
import math
import os
import struct
import sys
import threading
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from ._core_import import ffi, lib

__all__ = [
    "Port", "Registration", "backend_info", "available_backends",
    "EVENT_IN", "EVENT_OUT", "EVENT_HANGUP", "EVENT_ERR", "EVENT_REMOVE", "EVENT_IO",
    "IO_COMPLETION_KEY",
    "OP_NONE", "OP_ENABLE", "OP_DISABLE", "OP_REMOVE",
    "TRIGGER_ONESHOT", "TRIGGER_PERSISTENT", "TRIGGER_LEVEL", "TRIGGER_EDGE",
]

EVENT_IN: int = lib.SN_EVENT_IN
EVENT_OUT: int = lib.SN_EVENT_OUT
EVENT_HANGUP: int = lib.SN_EVENT_HANGUP
EVENT_ERR: int = lib.SN_EVENT_ERR
EVENT_REMOVE: int = lib.SN_EVENT_REMOVE
#: Not a socket event: an overlapped I/O completion on the port (Windows);
#: the notification's key is the OVERLAPPED's address.
EVENT_IO: int = lib.SN_EVENT_IO
#: The completion key to associate overlapped handles with a port under.
IO_COMPLETION_KEY: int = lib.sn_io_completion_key()

OP_NONE: int = lib.SN_OP_NONE
OP_ENABLE: int = lib.SN_OP_ENABLE
OP_DISABLE: int = lib.SN_OP_DISABLE
OP_REMOVE: int = lib.SN_OP_REMOVE

TRIGGER_ONESHOT: int = lib.SN_TRIGGER_ONESHOT
TRIGGER_PERSISTENT: int = lib.SN_TRIGGER_PERSISTENT
TRIGGER_LEVEL: int = lib.SN_TRIGGER_LEVEL
TRIGGER_EDGE: int = lib.SN_TRIGGER_EDGE

_FILTER_EVENTS = EVENT_IN | EVENT_OUT | EVENT_HANGUP
_ALL_TRIGGERS = TRIGGER_ONESHOT | TRIGGER_PERSISTENT | TRIGGER_LEVEL | TRIGGER_EDGE
_OPS = (OP_NONE, OP_ENABLE, OP_DISABLE, OP_REMOVE)
_MAX_KEY = (1 << 64) - 1

_BACKENDS = {"epoll": lib.SN_BACKEND_EPOLL, "psn": lib.SN_BACKEND_PSN, "afd": lib.SN_BACKEND_AFD}
_BACKEND_NAMES = {number: name for name, number in _BACKENDS.items()}

# sn_registration_t and sn_notification_t, packed and unpacked in one call
# each instead of one cffi attribute access per field (the selector's hot path).
_REGISTRATION = struct.Struct("=QQHBBI")
_NOTIFICATION = struct.Struct("=QI4x")
assert _REGISTRATION.size == ffi.sizeof("sn_registration_t")
assert _NOTIFICATION.size == ffi.sizeof("sn_notification_t")

_NOTE_SIZE = _NOTIFICATION.size
_iter_notes = _NOTIFICATION.iter_unpack
_from_buffer = ffi.from_buffer
_process = lib.sn_port_process
_NULL = ffi.NULL
_REARM = lib.SN_PROCESS_REARM
_INFINITE = lib.SN_INFINITE
_ceil = math.ceil

# A key posted by close() to wake threads still waiting; never returned.
_CLOSE_WAKE_KEY = _MAX_KEY

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


def _fileno(sock: Socket) -> int:
    """A socket's descriptor, validated the way selectors validate one."""
    if isinstance(sock, int):
        fd = sock
    else:
        try:
            fd = int(sock.fileno())  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            raise ValueError(f"Invalid file object: {sock!r}") from None
    if fd < 0:
        raise ValueError(f"Invalid file descriptor: {fd}")
    if fd > _MAX_KEY:
        raise ValueError(f"Invalid file descriptor: {fd}")
    return fd


def _check_trigger(trigger: int) -> None:
    if not isinstance(trigger, int) or trigger & ~_ALL_TRIGGERS:
        raise ValueError(f"Invalid trigger flags: {trigger!r}")
    if trigger & TRIGGER_ONESHOT and trigger & TRIGGER_PERSISTENT:
        raise ValueError("TRIGGER_ONESHOT and TRIGGER_PERSISTENT are exclusive")
    if trigger & TRIGGER_LEVEL and trigger & TRIGGER_EDGE:
        raise ValueError("TRIGGER_LEVEL and TRIGGER_EDGE are exclusive")


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

    def _validated(self) -> Tuple[int, int, int, int, int]:
        fd = _fileno(self.socket)
        if not isinstance(self.key, int) or not 0 <= self.key <= _MAX_KEY:
            raise ValueError(f"Invalid key (an integer from 0 to 2**64-1): {self.key!r}")
        if not isinstance(self.events, int) or self.events & ~_FILTER_EVENTS:
            raise ValueError(f"Invalid events: {self.events!r}")
        if self.op not in _OPS:
            raise ValueError(f"Invalid operation: {self.op!r}")
        _check_trigger(self.trigger)
        return fd, self.key, self.events, self.op, self.trigger

    def __repr__(self) -> str:
        return (f"Registration(sock={self.socket!r}, key={self.key!r}, "
                f"events={self.events:#x}, op={self.op}, trigger={self.trigger:#x}, "
                f"result={self.result})")


def available_backends() -> dict:
    """``{name: (available, reason)}`` for every backend of the core."""
    buf = ffi.new("char[]", 256)
    answer = {}
    for name, number in _BACKENDS.items():
        ok = bool(lib.sn_backend_available(number, buf, 256))
        answer[name] = (ok, ffi.string(buf).decode("utf-8", "replace"))
    return answer


def _requested_backend(backend: Optional[str]) -> str:
    if backend is None:
        backend = os.environ.get("SOCKNOTIFY_BACKEND") or None
    if backend is None:
        buf = ffi.new("char[]", 256)
        for name in ("psn", "afd", "epoll"):
            if lib.sn_backend_available(_BACKENDS[name], buf, 256):
                return name
        raise OSError(errno.ENOSYS, f"no notification backend on {sys.platform}")
    if backend not in _BACKENDS:
        raise ValueError(f"unknown backend {backend!r} (choose from {', '.join(_BACKENDS)})")
    return backend


def backend_info(backend: Optional[str] = None) -> dict:
    """Which backend a new Port would use and why.

    Returns ``{'backend': name, 'reason': sentence, 'available': {name: (bool, reason)}}``;
    the backend may be forced with ``SOCKNOTIFY_BACKEND``.
    """
    available = available_backends()
    name = _requested_backend(backend)
    return {"backend": name, "reason": available[name][1], "available": available}


class Port:
    """A notification port: one completion port (Windows) or epoll (Linux).

    ``backend`` is ``'epoll'``, ``'psn'`` (the OS's ProcessSocketNotifications),
    ``'afd'`` (the IOCTL_AFD_POLL polyfill), or None for the environment
    variable ``SOCKNOTIFY_BACKEND`` or else the best one available. Asking
    for a backend this machine lacks raises :class:`OSError` with the reason.

    Waiting releases the GIL, so several threads may wait on one port; each
    notification goes to one of them.
    """

    def __init__(self, backend: Optional[str] = None) -> None:
        name = _requested_backend(backend)
        error = ffi.new("int *")
        handle = lib.sn_port_open(_BACKENDS[name], error)
        if handle == ffi.NULL:
            if error[0] == lib.sn_error_not_supported():
                reason = available_backends()[name][1]
                raise OSError(errno.ENOSYS, f"backend {name!r} is not available: {reason}")
            raise _os_error(error[0], f"cannot open a {name} port")
        self._handle = handle
        self._backend = name
        self._triggers = lib.sn_backend_triggers(_BACKENDS[name])
        self._lock = threading.Lock()
        self._inside: list = []   # one entry per thread inside the C core
        self._closed = False
        self._held: List[Tuple[int, int]] = []   # notifications of a call that raised
        self._spare: list = []    # notification buffers, reused across calls

    # -- properties ---------------------------------------------------------

    @property
    def backend(self) -> str:
        """The backend's name: ``'epoll'``, ``'psn'`` or ``'afd'``."""
        return self._backend

    @property
    def os_handle(self) -> int:
        """The OS object behind the port: the completion port HANDLE on
        Windows (associate overlapped handles with it under
        :data:`IO_COMPLETION_KEY`), the epoll descriptor on Linux."""
        handle = self._enter()
        try:
            return lib.sn_port_os_handle(handle)
        finally:
            self._leave()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def registered(self) -> int:
        """Number of live registrations."""
        handle = self._enter()
        try:
            return lib.sn_port_registered(handle)
        finally:
            self._leave()

    def supports(self, trigger: int) -> bool:
        """Whether this backend honours all the given ``TRIGGER_*`` flags."""
        return not (trigger & ~self._triggers)

    # -- life cycle -----------------------------------------------------------

    # Threads inside the C core are counted in self._inside, a list whose
    # append/pop are atomic under the GIL: the hot path takes no lock. The
    # order makes close() safe: a caller appends, THEN checks _closed;
    # close() sets _closed, THEN looks at the list. Either close() sees the
    # caller (and wakes it; the last one out frees the port), or the caller
    # sees the port closed and backs out before touching the handle.

    def _enter(self):
        self._inside.append(None)
        if self._closed:
            self._leave()
            raise ValueError("I/O operation on closed port")
        return self._handle

    def _leave(self) -> None:
        self._inside.pop()
        if self._closed and not self._inside:
            self._free()

    def _free(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            lib.sn_port_close(handle)

    def close(self) -> None:
        """Close the port; registrations are dropped. Idempotent.

        Threads still waiting in :meth:`process` are woken and return; the
        C port is freed when the last of them has left.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiting = len(self._inside)
            handle = self._handle
        if waiting == 0:
            self._free()
            return
        for _ in range(waiting):
            lib.sn_port_post(handle, _CLOSE_WAKE_KEY)
        if not self._inside:   # they all left while we posted
            self._free()

    def __enter__(self) -> "Port":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_inside", True) and getattr(self, "_handle", None) is not None:
            self._closed = True
            self._free()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Port backend={self._backend} {state}>"

    # -- the one call -------------------------------------------------------------

    def process(self, registrations: Iterable[Registration] = (),
                timeout: Optional[float] = None,
                max_events: int = 1024) -> List[Tuple[int, int]]:
        """Apply ``registrations`` in order, then wait for notifications.

        Returns a list of ``(key, events)``; a packet from :meth:`post` has
        ``events == 0``. ``timeout`` is in seconds: None waits forever, 0 or
        less polls, a positive value is rounded up to whole milliseconds.
        Each registration's ``result`` is filled in. If any failed, the first
        failure is raised as :class:`OSError` (its ``registration`` attribute
        names it) and the notifications dequeued by this call are returned by
        the next one, so none is lost.
        """
        registrations = list(registrations)
        changes = [reg._validated() for reg in registrations]
        notifications, failures = self.process_batch(changes, timeout, max_events)
        for reg in registrations:
            reg.result = 0
        for index, code in failures:
            registrations[index].result = code
        if failures:
            index, code = failures[0]
            self._hold(notifications)
            error = _os_error(code, f"registration {index} ({registrations[index]!r}) failed")
            error.registration = registrations[index]  # type: ignore[attr-defined]
            raise error
        return notifications

    def process_batch(self, changes: Sequence[Tuple[int, int, int, int, int]],
                      timeout: Optional[float],
                      max_events: int = 1024,
                      rearm: bool = False) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
        """The fast path of :meth:`process`, for the selector.

        ``changes`` are ``(fileno, key, events, op, trigger)`` tuples whose
        values the caller has validated. With ``rearm=True`` the port first
        re-enables every one-shot registration it delivered since the last
        such call (and that was not re-enabled or removed meanwhile), in the
        same kernel call: the selector's steady state without handing each
        re-arm over. Returns ``(notifications, failures)``, where failures
        lists ``(index, os_error_code)`` for each change that failed;
        nothing is raised for them.
        """
        if max_events.__class__ is not int or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, not {max_events!r}")
        # Seconds to the core's milliseconds: None waits forever, <= 0 polls,
        # and a positive timeout rounds UP so a wait never ends early.
        if timeout is None:
            timeout_ms = _INFINITE
        elif timeout <= 0:
            timeout_ms = 0
        else:
            timeout_ms = min(_ceil(timeout * 1e3), 0x7FFFFFFF)
        held = None
        if self._held:
            # A previous call raised after dequeuing: hand those over first
            # and do not block while doing so. Threads share the list.
            with self._lock:
                held, self._held = self._held, []
            if held:
                timeout_ms = 0
                max_events = max(1, max_events - len(held))

        count = len(changes)
        if count:
            size = _REGISTRATION.size
            packed = bytearray(size * count)
            pack_into = _REGISTRATION.pack_into
            try:
                offset = 0
                for change in changes:
                    pack_into(packed, offset, *change, 0)
                    offset += size
            except struct.error as exc:
                raise ValueError(f"invalid registration change: {exc}") from None
            regs = _from_buffer("sn_registration_t[]", packed)
        else:
            packed = None
            regs = _NULL

        try:
            raw, buffer, received = self._spare.pop()
            if len(raw) < max_events * _NOTE_SIZE:
                raw, buffer, received = self._new_buffer(max_events)
        except IndexError:
            raw, buffer, received = self._new_buffer(max_events)
        handle = self._enter()
        try:
            err = _process(handle, _REARM if rearm else 0, regs, count, timeout_ms,
                           buffer, max_events, received)
        finally:
            self._leave()

        failures: List[Tuple[int, int]] = []
        if count:
            # The result field is the last 4 bytes of each 24-byte record.
            results = memoryview(packed).cast("I")[5::6]
            if any(results):
                failures = [(i, code) for i, code in enumerate(results) if code]
        got = received[0]
        if got:
            notifications = list(_iter_notes(memoryview(raw)[:got * _NOTE_SIZE]))
            if self._closed:
                notifications = [note for note in notifications
                                 if note[0] != _CLOSE_WAKE_KEY or note[1] != 0]
        else:
            notifications = []
        self._spare.append((raw, buffer, received))
        if held:
            notifications = held + notifications
        if err:
            self._hold(notifications)
            raise _os_error(err, "waiting on the port failed")
        return notifications, failures

    @staticmethod
    def _new_buffer(max_events: int):
        """A notification buffer: Python-owned bytes the C core writes
        into, its cdata view, and the count cell."""
        raw = bytearray(max(max_events, 64) * _NOTE_SIZE)
        return raw, _from_buffer("sn_notification_t[]", raw), ffi.new("uint32_t *")

    def _hold(self, notifications: List[Tuple[int, int]]) -> None:
        """Keep notifications of a call that raises for the next call."""
        if notifications:
            with self._lock:
                self._held = notifications + self._held

    def post(self, key: int) -> None:
        """Queue a packet with ``key``: one waiter receives ``(key, 0)``."""
        if not isinstance(key, int) or not 0 <= key < _MAX_KEY:
            raise ValueError(f"Invalid key (an integer from 0 to 2**64-2): {key!r}")
        handle = self._enter()
        try:
            err = lib.sn_port_post(handle, key)
        finally:
            self._leave()
        if err:
            raise _os_error(err, "post failed")
