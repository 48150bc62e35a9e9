"""NotifySelector: a :mod:`selectors` selector on one notification port.

The stdlib selectors tell the kernel about every change the moment
``register``/``modify``/``unregister`` is called, then wait in a separate
call. The Winsock socket state notifications model wants the opposite: ONE
kernel transition per loop iteration that applies every change AND waits
(``ProcessSocketNotifications``; emulated on Linux by the epoll backend).
So this selector only *records* changes, and :meth:`NotifySelector.select`
hands them to :meth:`Port.process_batch` together with the re-arm of every
registration it reported last time.

Why re-arms: registrations are one-shot level-triggered. After the port
delivers a notification for a socket, that registration is disarmed until
the next ``OP_ENABLE``. A selector user (asyncio) expects level semantics:
"still readable" must be reported again by the next ``select()``.
Re-enabling every reported registration in the next call gives exactly that,
and a socket nobody reads stays reported, as with ``EpollSelector``. The
re-arms are the port's own (``rearm=True``): the C core remembers what it
delivered and prepends those ENABLEs to the batch inside the same call, so
the steady state hands nothing across the FFI but the wait itself.

Why a fresh port key per registration: the port returns the caller's key
with each notification. If keys were file descriptors, a notification queued
for a socket that a callback unregistered and closed (and whose descriptor
was reused by a new registration) would be delivered to the new owner. Each
``register()`` therefore takes a new key from a counter, notifications are
mapped key -> :class:`selectors.SelectorKey`, and a key no longer in the map
is dropped. The core additionally drops packets of retired registrations.

Why registration failures never raise from ``select()``: changes are applied
lazily, so ``register()`` cannot see the error (e.g. the socket was closed
before the next ``select()``). Like ``EPOLLERR`` with epoll, the failure is
reported as readiness for the key's events, so its owner's callback meets
the error in ``recv``/``send``; the registration is retried on the next
``select()`` until it is unregistered.
"""
from __future__ import annotations

import itertools
import selectors
from time import monotonic as _monotonic
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from .port import _fileno as _fileobj_to_fd  # validated as selectors do
from .port import (EVENT_ERR, EVENT_HANGUP, EVENT_IN, EVENT_IO, EVENT_OUT, OP_ENABLE,
                   OP_REMOVE, TRIGGER_LEVEL, TRIGGER_ONESHOT, Port)

__all__ = ["NotifySelector", "WAKEUP_KEY"]

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
SelectorKey = selectors.SelectorKey

_ONESHOT_LEVEL = TRIGGER_ONESHOT | TRIGGER_LEVEL
_NO_CHANGES: Tuple[tuple, ...] = ()

#: A port key no registration uses: ``selector.port.post(WAKEUP_KEY)``
#: makes a waiting select() return (with ``[]`` if nothing else is ready).
WAKEUP_KEY = 0

# Port event filter for each selector mask. HANGUP is asked for only with
# READ: a reader meets EOF and unregisters, but a write-only registration
# would be woken again and again by a peer's half-close (shutdown(SHUT_WR)
# keeps the hang-up condition true) while its send buffer stays full.
_FILTER_OF_MASK = {
    EVENT_READ: EVENT_IN | EVENT_HANGUP,
    EVENT_WRITE: EVENT_OUT,
    EVENT_READ | EVENT_WRITE: EVENT_IN | EVENT_HANGUP | EVENT_OUT,
}


def _selector_mask(events: int) -> int:
    """Port events -> selector mask: IN is READ, OUT is WRITE, and ERR or
    HANGUP wake both directions (a failed connect reports ERR without OUT).
    REMOVE and posted packets (0) map to no readiness."""
    mask = 0
    if events & EVENT_IN:
        mask |= EVENT_READ
    if events & EVENT_OUT:
        mask |= EVENT_WRITE
    if events & (EVENT_ERR | EVENT_HANGUP):
        mask |= EVENT_READ | EVENT_WRITE
    return mask


# Looked up per notification in select(): one tuple index instead of the
# branches above. Port events fit in 8 bits (IN|OUT|HANGUP|ERR|REMOVE).
_MASK_OF_EVENTS = tuple(_selector_mask(events) for events in range(256))


class _SelectorMapping(Mapping):
    """The read-only view returned by :meth:`NotifySelector.get_map`."""

    __slots__ = ("_selector",)

    def __init__(self, selector: "NotifySelector") -> None:
        self._selector = selector

    def __len__(self) -> int:
        return len(self._selector._fd_to_key)

    def __getitem__(self, fileobj: Any) -> SelectorKey:
        fd = self._selector._fileobj_lookup(fileobj)
        try:
            return self._selector._fd_to_key[fd]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def __iter__(self) -> Iterator[int]:
        return iter(self._selector._fd_to_key)


class NotifySelector(selectors.BaseSelector):
    """A selector on one notification :class:`~socknotify_loop.port.Port`.

    Same contract as the stdlib selectors (``select()`` returns
    ``[(key, mask & key.events)]``; ``None`` blocks, ``<= 0`` polls, a
    positive timeout is rounded up to milliseconds; ERR and HANGUP wake both
    directions; unregistering a closed socket does not raise), with every
    change deferred to the next :meth:`select`, which applies the changes and
    waits in one port call.

    ``backend`` chooses the port's backend (see :class:`Port`); ``None``
    takes ``SOCKNOTIFY_BACKEND`` or the best one available.
    """

    def __init__(self, backend: Optional[str] = None) -> None:
        self._port = Port(backend)
        self._fd_to_key: Dict[int, SelectorKey] = {}
        self._port_key_of_fd: Dict[int, int] = {}
        # port key -> (SelectorKey, the OP_ENABLE change that arms it); one
        # dict lookup per notification gives what to report, and the ENABLE
        # is at hand to retry a failed one or re-arm after an interruption.
        self._by_port_key: Dict[int, Tuple[SelectorKey, tuple]] = {}
        # Changes for the next select(), keyed by port key. Keys only grow,
        # so the dict's insertion order applies a REMOVE of an old
        # registration before the ENABLE of a new one on the same fd.
        self._changes: Dict[int, tuple] = {}
        # Registrations whose first ENABLE has not reached the port yet:
        # unregistering one just forgets it instead of sending a REMOVE.
        self._unsent: Set[int] = set()
        # Port keys of registrations start at 1: WAKEUP_KEY (0) is left for
        # packets posted to wake select() (see Port.post).
        self._next_port_key = itertools.count(WAKEUP_KEY + 1).__next__
        self._map: Optional[_SelectorMapping] = _SelectorMapping(self)
        #: Keys (OVERLAPPED addresses) of overlapped I/O completions that
        #: came out of the port (Windows handles associated with
        #: ``port.os_handle``); whoever started that I/O drains this list.
        self.io_completions: List[int] = []

    # -- introspection ---------------------------------------------------------

    @property
    def port(self) -> Port:
        """The notification port this selector waits on."""
        return self._port

    @property
    def backend(self) -> str:
        """The port's backend: ``'epoll'``, ``'psn'`` or ``'afd'``."""
        return self._port.backend

    def _fileobj_lookup(self, fileobj: Any) -> int:
        """``fileobj``'s descriptor; for a closed file object (``fileno()``
        fails or is -1), the descriptor it was registered with, so it can
        still be unregistered."""
        try:
            return _fileobj_to_fd(fileobj)
        except ValueError:
            for key in self._fd_to_key.values():
                if key.fileobj is fileobj:
                    return key.fd
            raise

    def get_map(self) -> Optional[Mapping]:
        """A read-only mapping of file objects to keys (None once closed)."""
        return self._map

    # -- recording changes -------------------------------------------------------

    def register(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        """Register ``fileobj`` for ``events``; applied at the next select().

        Raises ValueError for invalid events or file object and KeyError if
        it is already registered.
        """
        if not events or events & ~(EVENT_READ | EVENT_WRITE):
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._fileobj_lookup(fileobj)
        if fd in self._fd_to_key:
            raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
        if self._map is None:
            # What EpollSelector raises: its epoll object is closed.
            raise ValueError("I/O operation on a closed selector")
        key = SelectorKey(fileobj, fd, events, data)
        port_key = self._next_port_key()
        enable = (fd, port_key, _FILTER_OF_MASK[events], OP_ENABLE, _ONESHOT_LEVEL)
        self._fd_to_key[fd] = key
        self._port_key_of_fd[fd] = port_key
        self._by_port_key[port_key] = (key, enable)
        self._changes[port_key] = enable
        self._unsent.add(port_key)
        return key

    def unregister(self, fileobj: Any) -> SelectorKey:
        """Unregister ``fileobj``; KeyError if it is not registered.

        Never fails for a socket closed meanwhile: its REMOVE, sent with the
        next select(), may fail, and that failure is ignored.
        """
        try:
            key = self._fd_to_key.pop(self._fileobj_lookup(fileobj))
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        fd = key.fd
        port_key = self._port_key_of_fd.pop(fd)
        del self._by_port_key[port_key]
        if port_key in self._unsent:
            # The port never heard of it: nothing to remove.
            self._unsent.discard(port_key)
            del self._changes[port_key]
        else:
            self._changes[port_key] = (fd, port_key, 0, OP_REMOVE, 0)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        """Change the events and/or data of a registered file object.

        Only an events change costs a port operation (at the next select()).
        """
        try:
            fd = self._fileobj_lookup(fileobj)
            key = self._fd_to_key[fd]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        if events != key.events:
            if not events or events & ~(EVENT_READ | EVENT_WRITE):
                raise ValueError(f"Invalid events: {events!r}")
            port_key = self._port_key_of_fd[fd]
            key = key._replace(events=events, data=data)
            enable = (fd, port_key, _FILTER_OF_MASK[events], OP_ENABLE, _ONESHOT_LEVEL)
            self._by_port_key[port_key] = (key, enable)
            self._changes[port_key] = enable
            self._fd_to_key[fd] = key
        elif data is not key.data:
            port_key = self._port_key_of_fd[fd]
            key = key._replace(data=data)
            self._by_port_key[port_key] = (key, self._by_port_key[port_key][1])
            self._fd_to_key[fd] = key
        return key

    # -- the one call ---------------------------------------------------------------

    def select(self, timeout: Optional[float] = None) -> List[Tuple[SelectorKey, int]]:
        """Apply the recorded changes and re-arms, wait, return ready keys.

        ``timeout``: None blocks, ``<= 0`` polls, a positive number of
        seconds is rounded up to whole milliseconds. Returns a list of
        ``(key, events)`` with ``events`` a subset of ``key.events``.
        """
        fd_to_key = self._fd_to_key
        deadline = None
        if timeout is not None:
            if timeout <= 0:
                timeout = 0
            else:
                deadline = _monotonic() + timeout
        changes = self._changes
        by_port_key = self._by_port_key
        mask_of = _MASK_OF_EVENTS
        while True:
            if changes:
                batch = list(changes.values())
                changes.clear()
                if self._unsent:
                    self._unsent.clear()
            else:
                batch = _NO_CHANGES
            # Room for one notification per registration, plus the REMOVE
            # events this batch causes and a posted packet: a short buffer
            # would leave readiness for the next call, delaying it.
            max_events = len(fd_to_key) + len(batch) + 1
            try:
                # rearm=True: the port re-enables, in this same call, every
                # one-shot registration it delivered last time (the re-arms
                # of the reported keys), before applying the batch.
                notifications, failures = self._port.process_batch(
                    batch, timeout, max_events, rearm=True)
                ready = []
                woken = False
                for port_key, events in notifications:
                    if events & EVENT_IO:
                        # An overlapped I/O completion, kept for its owner.
                        # Tested before the key lookup: its key is an
                        # OVERLAPPED address, which may equal a port key.
                        self.io_completions.append(port_key)
                        woken = True
                        continue
                    entry = by_port_key.get(port_key)
                    if entry is None:
                        # Unregistered since, or a REMOVE: dropped. A packet
                        # posted to the port (events 0) is a wake-up:
                        # select() returns, even with nothing to report.
                        if not events:
                            woken = True
                        continue
                    # Delivered means disarmed: the port re-arms it in the
                    # next select() (rearm=True above).
                    key = entry[0]
                    mask = mask_of[events] & key.events
                    if mask:
                        ready.append((key, mask))
                if failures:
                    self._report_failures(batch, failures, ready)
            except BaseException:
                self._recover_from_interruption(batch)
                raise
            if ready or woken or timeout == 0:
                return ready
            # Nothing to report before the deadline: either a signal
            # interrupted the wait (the core returns early on EINTR; the
            # Python handler has run by now and did not raise) or every
            # notification was a REMOVE or for a key unregistered meanwhile.
            # Wait for the time left, as the stdlib selectors do (PEP 475).
            if deadline is not None:
                timeout = deadline - _monotonic()
                if timeout <= 0:
                    return ready

    def _recover_from_interruption(self, batch) -> None:
        """select() is leaving by an exception: the wait failed, the port
        was closed, or (most likely) a signal handler raised, e.g.
        KeyboardInterrupt, which Python runs at whatever bytecode follows the
        wait. Notifications already dequeued may be lost with it, leaving
        their registrations disarmed forever (the self-pipe among them, so
        the loop could never be woken again). Re-arm every registration in
        the next select(), and resend this batch, whose results are unknown:
        enabling an armed registration again, or removing a removed one
        (its failure is ignored), is harmless."""
        # The batch first, in its order (a REMOVE before the ENABLE of a new
        # registration on the same fd), then the rest of the live ones.
        pending = {change[1]: change for change in batch}
        for port_key, (_key, enable) in self._by_port_key.items():
            pending[port_key] = enable
        self._changes.clear()
        self._changes.update(pending)

    def _report_failures(self, batch: list, failures: List[Tuple[int, int]],
                         ready: List[Tuple[SelectorKey, int]]) -> None:
        """A failed ENABLE is reported as ready for the key's events and
        retried next time (level-triggered, like EPOLLERR). A failed REMOVE
        means the socket was already closed: nothing left to undo."""
        for index, _code in failures:
            change = batch[index]
            if change[3] != OP_ENABLE:
                continue
            entry = self._by_port_key.get(change[1])
            if entry is None:
                continue
            key, enable = entry
            self._changes[change[1]] = enable
            ready.append((key, key.events))

    # -- life cycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the port and forget every registration. Idempotent."""
        self._fd_to_key.clear()
        self._port_key_of_fd.clear()
        self._by_port_key.clear()
        self._changes.clear()
        self._unsent.clear()
        self._map = None
        self._port.close()

    def get_key(self, fileobj: Any) -> SelectorKey:
        """The key of a registered file object: KeyError if it is not
        registered, RuntimeError if the selector is closed."""
        mapping = self.get_map()
        if mapping is None:
            raise RuntimeError("Selector is closed")
        try:
            return mapping[fileobj]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"{len(self._fd_to_key)} registered"
        return f"<{type(self).__name__} backend={self._port.backend} {state}>"
