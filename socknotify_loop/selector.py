"""NotifySelector: a :mod:`selectors` selector on one notification port.

The Winsock socket state notifications model wants ONE kernel transition
per loop iteration that applies every registration change AND waits
(``ProcessSocketNotifications``). So on the completion-port backends this
selector only *records* ``register``/``modify``/``unregister`` and hands the
changes to the port in :meth:`NotifySelector.select`, the one call that
waits. On epoll, where every change is a system call of its own wherever it
is made, changes are applied at once instead, which also reports a refused
registration (a regular file: ``PermissionError``) at ``register()``,
exactly where ``selectors.EpollSelector`` reports it.

Why re-arms: registrations are one-shot level-triggered. After the port
delivers a notification for a socket, that registration is disarmed until
the next ``OP_ENABLE``. A selector user (asyncio) expects level semantics:
"still readable" must be reported again by the next ``select()``. The C core
remembers what it delivered and re-enables it at the start of the next
select, inside the same kernel call that waits, so the steady state hands
nothing across the FFI but the wait itself.

Why a tag per registration: the port returns the caller's key with each
notification (the caller key of its C record, ``sn_record_t.user_key``).
Each registration takes a tag, a number this selector never hands out
again, and the notification comes back as ``(tag, mask)``: one dict lookup
gives the :class:`selectors.SelectorKey`. An answer therefore reaches the
registration it was made for or none: whatever a signal handler, another
thread or an exception does between the wait's return and the reading of
the answer, a later registration cannot inherit an earlier one's tag. (The
core does the same one level down: the kernel sees a record number with a
generation, never the tag.) The one exception is deliberate: on the
completion-port backends an ``unregister`` followed by a ``register`` of
the same descriptor before the next select takes its REMOVE back and keeps
the tag, since the port still holds that very registration.

The hot path (``select()``, and :class:`~socknotify_loop.loop.Loop`, which
reads the same buffer) costs one cffi call with three arguments (the port,
the number of queued changes, the timeout in milliseconds, a float the C
side rounds up): the port writes ``(tag, selector mask)`` pairs into a
buffer bound to it once, and Python reads them with one
``memoryview.tolist()`` (the loop reads a single pair in place). The mask is
computed in C the way ``selectors.EpollSelector`` computes it, and limited
to what the registration asked for.

A change refused by the kernel at ``select()`` time (on the completion-port
backends: a socket closed between ``register()`` and the next ``select()``)
never leaves the wait blocked: it is reported once as ready for the key's
events, like ``EPOLLERR``, so its owner's callback meets the error in
``recv``/``send``; the registration is dropped by the port.

Threads: as with ``selectors.EpollSelector``, ``register``, ``modify`` and
``unregister`` may be called from any thread while one thread is inside
``select``. The bookkeeping they share is guarded by a lock. The select
token (a lock, with the ident of the thread holding it) is held by a
select from the moment it takes the queued changes to the moment it has
read its answer, so a select refused because another thread is selecting
has touched nothing. A loop holds it for a whole run instead
(:meth:`NotifySelector.begin_run`, taken after asyncio's own "already
running" check), since taking and giving it back at every iteration cost
as much as a fifth of an iteration's own work; the thread running the
loop may still call ``select()`` (debug mode does), any other raises
RuntimeError.

An exception may land between any two steps of a change (a signal
handler's, KeyboardInterrupt). Every change therefore starts by queueing a
re-check of its registration and ends by taking it back: if it never
ends, the next select makes the port's record match Python's (the
registration's ENABLE, or its REMOVE when Python no longer has it), so the
two agree by then, whichever step the exception cut.

Overlapped I/O completions (Windows only: handles associated with the
port, see :mod:`socknotify_loop._windows_io`) come out of the same call.
The selector does not interpret them: it hands their keys (OVERLAPPED
addresses) to :attr:`NotifySelector.io_completion_handler`, which the
Windows loop's proactor installs.
"""
from __future__ import annotations

import selectors
import threading
from _thread import get_ident as _get_ident
from collections.abc import Callable, Iterator, Mapping
from time import monotonic as _monotonic
from typing import Any, NamedTuple

from .port import (
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_OUT,
    OP_DISABLE,
    OP_ENABLE,
    OP_REMOVE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    Change,
    Port,
    fileno_of,
    wait_ms,
)

__all__ = ["WAKEUP_KEY", "IOCompletionHandler", "LoopView", "NotifySelector"]

#: The largest descriptor number a completion port's registration takes:
#: its key is 64 bits wide.
_MAX_DESCRIPTOR = (1 << 64) - 1

EVENT_READ = selectors.EVENT_READ
EVENT_WRITE = selectors.EVENT_WRITE
SelectorKey = selectors.SelectorKey

_ONESHOT_LEVEL = TRIGGER_ONESHOT | TRIGGER_LEVEL

#: A key for ``selector.port.post(WAKEUP_KEY)``: it makes a waiting
#: select() return (with ``[]`` if nothing else is ready). Any posted key
#: does: a posted packet travels under the port's own reserved completion
#: key with this one beside it, so it can equal any other key
#: (``socknotify_loop/_core/sn_keys.h`` lists the reserved ones). This one
#: is kept for the loop's wake-ups.
WAKEUP_KEY = 0

#: What :attr:`NotifySelector.io_completion_handler` is called with: the
#: OVERLAPPED addresses of the overlapped I/O completions one wait dequeued.
IOCompletionHandler = Callable[[list[int]], None]

# Port event filter for each selector mask. HANGUP goes with READ: a
# reader meets EOF when the peer hangs up. A write-only registration does
# not ask for it: a peer's half-close does not make a full send buffer
# writable. modify() accepts any events value, as EpollSelector's does:
# only these two bits are watched (0 watches nothing: the registration is
# disabled).
_FILTER_OF_MASK = {
    EVENT_READ: EVENT_IN | EVENT_HANGUP,
    EVENT_WRITE: EVENT_OUT,
    EVENT_READ | EVENT_WRITE: EVENT_IN | EVENT_HANGUP | EVENT_OUT,
}
_WATCHED = EVENT_READ | EVENT_WRITE

# The largest descriptor epoll takes: a C int.
_MAX_EPOLL_FD = 0x7FFFFFFF

# sn_port_select()'s answer (Port.select_function): one pair in the value
# itself when its low two bits (the mask) are not 0; otherwise, shifted
# right by two, pairs in the low 32 bits and I/O keys above.
_ONE = 3
_SHIFT = 2
_PAIRS = 0xFFFFFFFF
_WORDS_PER_PAIR = 2     # (tag, selector mask), each a uint64

# The op of a re-check in the queue of changes: never sent as it is; the
# select that takes it sends what Python's record says then (see the
# module docstring on exceptions).
_RECHECK = -1

#: An entry of the queue: a :class:`Change`, or a re-check, the same five
#: numbers ``(fd, tag, 0, _RECHECK, 0)`` as a plain tuple. Every change
#: leaves one for its duration, and on epoll a register and an unregister
#: make nothing else: a plain tuple costs a fraction of a named one (about
#: 2,300 of the 29,000 instructions of a register and unregister together,
#: counted under callgrind on CPython 3.11), so the queue is read by index.
_Queued = tuple[int, int, int, int, int]


class LoopView:
    """What a loop's iteration reads of a :class:`NotifySelector`
    (``selector.loop_view``, one object for the selector's whole life): the
    loop makes the select call itself and reads the answer in place,
    without the list and tuples :meth:`NotifySelector.select` builds. The
    loop writes none of it (a benchmark wraps ``prepare`` to count). The
    iteration, run between :meth:`NotifySelector.begin_run` and
    :meth:`NotifySelector.end_run`, is::

        got = (view.select(view.port, view.prepare(), wait_ms) if view.queued
               else view.wait(view.port, wait_ms))    # or poll/block, below
        # got & 3: one pair, tag got >> 2, mask got & 3
        # else got >>= 2; got > 0xFFFFFFFF: got = view.io_completed(got)
        # pairs (tag, mask): view.out[2*i], view.out[2*i + 1];
        # the key is view.keys[tag] (KeyError: unregistered meanwhile);
        # an answer of view.room pairs or more: view.grow() after reading it
        # got < 0: view.raise_for(got)

    ``queued`` is the list of changes the next select hands to the port
    (all of them on the completion-port backends; on epoll, where changes
    are made at once, only the re-checks an interrupted change left): when
    it is not empty, ``prepare()`` moves them into the bound buffer and
    returns their count. ``port`` is the port's address
    (:attr:`Port.address`); ``poll(port)``, ``block(port)`` and
    ``wait(port, wait_ms)`` are ``select(port, 0, 0)``, ``select(port, 0,
    -1)`` and ``select(port, 0, wait_ms)``. ``out`` and ``room`` always
    name the bound answer buffer."""

    __slots__ = ("select", "poll", "block", "wait", "port", "queued", "prepare", "keys",
                 "out", "room", "grow", "io_completed", "raise_for")

    select: Callable[[int, int, float], int]
    poll: Callable[[int], int]
    block: Callable[[int], int]
    wait: Callable[[int, float], int]
    port: int
    queued: list[_Queued]
    prepare: Callable[[], int]
    keys: dict[int, SelectorKey]
    out: Any
    room: int
    grow: Callable[[], None]
    io_completed: Callable[[int], int]
    raise_for: Callable[[int], None]


class _Record(NamedTuple):
    """One registration: its selector key and its tag (the key the port
    answers with)."""

    key: SelectorKey
    tag: int


# Named tuples made without the Python-level __new__ of namedtuple (a
# call frame each): register() and modify() are on asyncio's hot path
# for sock_recv/sock_sendall, which add and remove a reader per call.
_new_record = tuple.__new__
_new_change = tuple.__new__


class _SelectorMapping(Mapping[Any, SelectorKey]):
    """The read-only view returned by :meth:`NotifySelector.get_map`."""

    __slots__ = ("_selector",)

    def __init__(self, selector: NotifySelector) -> None:
        self._selector = selector

    def __len__(self) -> int:
        return len(self._selector._records)

    def __getitem__(self, fileobj: Any) -> SelectorKey:
        fd = self._selector._fileobj_lookup(fileobj)
        try:
            return self._selector._records[fd].key
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    def get(self, fileobj: Any, default: Any = None) -> Any:
        """``fileobj``'s key, or ``default`` if it is not registered.

        asyncio 3.14+ looks keys up this way on every add/remove of a reader
        or writer (``get_map().get(fd)``); Mapping.get would go through
        __getitem__ and a KeyError with a formatted message on every miss."""
        record = self._selector._records.get(self._selector._fileobj_lookup(fileobj))
        return default if record is None else record.key

    def __iter__(self) -> Iterator[int]:
        return iter(self._selector._records)


class NotifySelector(selectors.BaseSelector):
    """A selector on one notification :class:`~socknotify_loop.port.Port`.

    Same contract as the stdlib selectors (``select()`` returns
    ``[(key, mask & key.events)]``; ``None`` blocks, ``<= 0`` polls, a
    positive timeout is rounded up to milliseconds; ERR wakes both
    directions; unregistering a closed socket does not raise). On epoll,
    every change is applied at once, unregister included (errors raise
    where ``EpollSelector`` raises them). On the completion-port backends
    every change goes with the next :meth:`select`, where an unregister
    followed by a register of the same descriptor is one modification, and
    a descriptor that is not an open socket is still refused at
    :meth:`register`.

    ``backend`` chooses the port's backend (see :class:`Port`); ``None``
    takes ``SOCKNOTIFY_BACKEND`` or the best one available. One thread at a
    time may be inside :meth:`select` (a second raises RuntimeError), and
    while a loop runs on the selector, only the loop's thread.
    """

    def __init__(self, backend: str | None = None) -> None:
        self._port = port = Port(backend)
        self._at_once = port.changes_at_once
        self._change_now = port.change_function()
        self._port_address = port.address
        # fd -> _Record: the one record per registration.
        self._records: dict[int, _Record] = {}
        # tag -> SelectorKey: the hot path's index from the port's answer
        # to the key. Tags are never reused; 0 is never one.
        self._keys: dict[int, SelectorKey] = {}
        self._next_tag = 1
        # Changes for the next select(): every change on the completion-port
        # backends, the re-checks of interrupted changes on both.
        self._pending: list[_Queued] = []
        self._unsent: set[int] = set()   # tags whose first ENABLE is still queued
        # True while prepare() hands the queue to the port: a change made
        # meanwhile (a signal handler's, in this thread) only appends.
        self._preparing = False
        # How many changes the last prepare() moved into the bound buffer:
        # the next one puts them back if no select took them.
        self._packed = 0
        # Guards the bookkeeping above against other threads' changes.
        # Reentrant: a Python signal handler runs in the thread it
        # interrupts, between two bytecodes, so one that pauses, resumes or
        # closes a transport (a change of its registration) may run while
        # that thread is inside a change with the lock held. A plain lock
        # would block that thread on itself for good; the stdlib selectors
        # take no lock and let the handler's change run inside the other
        # one. So does this one: each change leaves its re-check in the
        # queue until it has settled, which keeps the port in line with
        # Python's record whatever runs between its steps.
        self._lock = threading.RLock()
        # The select token: {"owner": ident} while a thread holds it. Taken
        # by one dict.setdefault, which is atomic, so that the claim and the
        # claimant's name are one step: a signal handler raising between
        # two bytecodes (Ctrl+C) can land after a lock's acquire and before
        # its owner is written down, and would leave a lock held by nobody
        # for good. Here a cut leaves the token named after its thread,
        # which gives it back (see _take_token, _give_token).
        self._token: dict[str, int] = {}
        self._claimed = False    # a loop runs on this selector
        self._map: _SelectorMapping | None = _SelectorMapping(self)
        #: Called with the keys (OVERLAPPED addresses) of the overlapped I/O
        #: completions each wait dequeues (Windows handles associated with
        #: ``port.os_handle``), by whoever started that I/O: the Windows
        #: loop's proactor installs its own. ``None``: nobody did, and a
        #: completion arriving anyway makes the select raise RuntimeError
        #: (its owner would otherwise wait for it forever).
        self.io_completion_handler: IOCompletionHandler | None = None
        self._room = 0
        self._changes_room = 0
        #: What a loop's iteration reads (see :class:`LoopView`): the same
        #: object for the selector's whole life.
        view = self.loop_view = self._view = LoopView()
        view.select = port.select_function()
        view.port = self._port_address
        view.poll, view.block, view.wait = port.wait_functions()
        view.queued = self._pending
        view.prepare = self._prepare
        view.keys = self._keys
        view.io_completed = self._io_completed
        view.raise_for = self._raise_for
        view.grow = self._grow
        self._bind(256, 64)

    # -- buffers -----------------------------------------------------------------

    def _bind(self, room: int, changes_room: int) -> bool:
        """Have the port bind buffers for ``room`` ready registrations per
        select and ``changes_room`` changes (the caller holds the select
        token, or is ``__init__``). False if a select is running in
        another thread (the old buffers stay bound)."""
        bound = self._port.bind_select_buffers(room + changes_room, changes_room)
        if bound is None:
            return False
        self._out, self._changes_room = bound
        self._view.out = self._out
        self._view.room = self._room = room
        return True

    def _grow(self) -> None:
        """Room for every registration to be ready at once, if there is not
        (the select token held): after a register(), or after an answer
        that filled the buffer (a register() made while another thread held
        the token could not bind it)."""
        room = self._room
        if len(self._records) > room:
            while room < len(self._records):
                room *= 2
            self._bind(room, self._changes_room)

    # -- who selects --------------------------------------------------------------------

    def claim_for_loop(self) -> None:
        """Mark this selector as a loop's (the loop's ``__init__`` calls
        it). RuntimeError if it is closed (asyncio's own "Selector is
        closed"), already serves another loop, or a select() runs in
        another thread right now."""
        if self._map is None:
            raise RuntimeError("Selector is closed")
        if self._claimed:
            raise RuntimeError("the selector already serves another event loop")
        if not self._no_select_elsewhere():
            raise RuntimeError("the selector is inside a select() in another thread")
        self._claimed = True

    def release_claim(self) -> None:
        """Undo :meth:`claim_for_loop` (a loop whose making failed)."""
        self._claimed = False

    def begin_run(self) -> None:
        """Take the select token for a loop's run in this thread (the loop's
        ``run_forever`` calls it after asyncio's own checks): from now until
        :meth:`end_run` this thread alone selects, and it may call
        :meth:`select` too. RuntimeError if another thread selects."""
        if not self._take_token(_get_ident()):
            raise RuntimeError("select() is already running in another thread")

    def end_run(self) -> None:
        """Give back the token :meth:`begin_run` took, if this thread holds
        it: the loop calls it in a ``finally`` that also covers a
        begin_run() refused or cut short by a signal handler's exception."""
        self._give_token(_get_ident())

    def _take_token(self, me: int) -> bool:
        """Take the token for thread ``me``, or find it already ``me``'s;
        False if another thread holds it."""
        return self._token.setdefault("owner", me) == me

    def _give_token(self, me: int) -> None:
        """Give the token back if thread ``me`` holds it (no other thread
        can take it meanwhile, so the look and the removal need no lock)."""
        if self._token.get("owner") == me:
            del self._token["owner"]

    def _no_select_elsewhere(self) -> bool:
        """No other thread is inside a select: the token is free, or this
        thread holds it (and is not selecting, since it is here)."""
        me = _get_ident()
        return self._token.get("owner", me) == me

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
        if type(fileobj) is int and fileobj >= 0:
            # What fileno_of answers for a valid descriptor number (the
            # loop's own calls pass numbers), without its call.
            return fileobj
        try:
            # Validated as selectors do: any number that is not negative
            # (one too wide for the port is refused by register()).
            return fileno_of(fileobj, bounded=False)
        except ValueError:
            # A copy: other threads may be changing the dict.
            for record in list(self._records.values()):
                if record.key.fileobj is fileobj:
                    return record.key.fd
            raise

    def get_map(self) -> Mapping[Any, SelectorKey] | None:  # type: ignore[override]
        """A read-only mapping of file objects to keys (None once closed,
        as with the stdlib selectors, whatever typeshed says)."""
        return self._map

    def get_key(self, fileobj: Any) -> SelectorKey:
        """The key of a registered file object: KeyError if it is not
        registered, RuntimeError if the selector is closed."""
        key = self._key_or_none(fileobj)
        if key is None:
            raise KeyError(f"{fileobj!r} is not registered")
        return key

    def _key_or_none(self, fileobj: Any) -> SelectorKey | None:
        """:meth:`get_key`'s answer, or None where it raises KeyError (the
        loop's add and remove of readers and writers ask this on every
        call, and a miss is common: no exception for it). RuntimeError if
        the selector is closed, ValueError for an invalid file object."""
        if self._map is None:
            raise RuntimeError("Selector is closed")
        record = self._records.get(self._fileobj_lookup(fileobj))
        return None if record is None else record.key

    # -- changes -------------------------------------------------------------------

    def _change(self, fd: int, tag: int, events: int, op: int, trigger: int) -> None:
        """Apply a change now (epoll) or queue it for the next select()
        (``_lock`` held). Raises for a refused ENABLE; a refused REMOVE
        means the descriptor was closed first (which the stdlib selectors
        ignore too), or the port is closed or inherited from the parent of
        a forked child: the registration is gone either way."""
        if self._at_once:
            code = self._change_now(self._port_address, fd, tag, events, op, trigger)
            if code and op != OP_REMOVE:
                raise self._port.change_error(code)
        else:
            self._pending.append(_new_change(Change, (fd, tag, events, op, trigger)))

    def _enable(self, fd: int, tag: int, events: int) -> None:
        """The port change that makes a registration watch ``events``
        (``_lock`` held): an ENABLE of their filter, or a DISABLE when they
        hold neither READ nor WRITE (modify() accepts that, as
        EpollSelector does)."""
        watched = events & _WATCHED
        if watched:
            self._change(fd, tag, _FILTER_OF_MASK[watched], OP_ENABLE, _ONESHOT_LEVEL)
        else:
            self._change(fd, tag, 0, OP_DISABLE, 0)

    def _settle(self, recheck: _Queued, change: Change | None = None) -> None:
        """A change finished: take its re-check out of the queue, or put
        ``change`` in its place (``_lock`` held). From the back: it is the
        last entry, or one of the last."""
        pending = self._pending
        for i in range(len(pending) - 1, -1, -1):
            if pending[i] is recheck:
                if change is None:
                    del pending[i]
                else:
                    pending[i] = change
                return

    def _resolve(self, recheck: _Queued) -> Change:
        """The change a re-check stands for now (``_lock`` held): what makes
        the port's record of its tag match Python's."""
        fd, tag = recheck[0], recheck[1]
        record = self._records.get(fd)
        if record is None or record.tag != tag:
            # Gone from Python's record: gone from the port's too (a REMOVE
            # naming a tag the port's record does not carry changes nothing).
            return _new_change(Change, (fd, tag, 0, OP_REMOVE, 0))
        watched = record.key.events & _WATCHED
        if watched:
            return _new_change(Change, (fd, tag, _FILTER_OF_MASK[watched], OP_ENABLE,
                                        _ONESHOT_LEVEL))
        return _new_change(Change, (fd, tag, 0, OP_DISABLE, 0))

    def register(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        """Register ``fileobj`` for ``events``.

        Raises ValueError for invalid events or file object, KeyError if it
        is already registered, OverflowError for a descriptor epoll cannot
        take (above a C int, as EpollSelector), and OSError for a
        descriptor the port refuses (on epoll, what ``epoll_ctl`` says:
        PermissionError for a regular file; elsewhere, a descriptor that is
        not an open socket).
        """
        if not events or events & ~_WATCHED:
            raise ValueError(f"Invalid events: {events!r}")
        fd = self._fileobj_lookup(fileobj)
        with self._lock:
            records = self._records
            if fd in records:
                raise KeyError(f"{fileobj!r} (FD {fd}) is already registered")
            if self._map is None:
                # What EpollSelector raises: its epoll object is closed.
                raise self._port.closed_error()
            at_once = self._at_once
            if fd > (_MAX_EPOLL_FD if at_once else _MAX_DESCRIPTOR):
                # The interpreter's words for a number its poller cannot
                # take (epoll's and select()'s descriptors are C ints).
                raise self._port.too_wide_error(fd)
            if not at_once:
                code = self._port.probe(fd)
                if code:
                    raise self._port.change_error(code)
            keys = self._keys
            pending = self._pending
            key = SelectorKey(fileobj, fd, events, data)
            # Not while another thread selects: an answer in flight naming
            # the tag (a readiness, or the failure of a change it carried)
            # is about the old registration, and the number may now name
            # another socket (closed and reused at once). The port then
            # gets a REMOVE and an ENABLE under a new tag, and holds the
            # ENABLE back until the REMOVE event: correct, only dearer.
            # Nor inside a prepare() that this thread is running (a signal
            # handler's change): it hands the queue as it was to the port,
            # and a change made meanwhile may only add to its end.
            taken_back = (self._find_take_back(fd)
                          if pending and not at_once and not self._preparing
                          and self._no_select_elsewhere()
                          else None)
            if taken_back is None:
                tag = self._next_tag
                self._next_tag = tag + 1
            else:
                tag = taken_back[1]   # the REMOVE's
            # First the re-check, last its settling: an exception landing
            # anywhere between leaves the next select to make the port agree
            # with what Python recorded (module docstring).
            recheck = (fd, tag, 0, _RECHECK, 0)
            pending.append(recheck)
            if at_once:
                # The key is recorded before the port hears of it: the item
                # is in the kernel as soon as the call returns, and a select
                # running in another thread may report it at once.
                records[fd] = _new_record(_Record, (key, tag))
                keys[tag] = key
                code = self._change_now(self._port_address, fd, tag, _FILTER_OF_MASK[events],
                                        OP_ENABLE, _ONESHOT_LEVEL)
                if code:
                    # Refused: the port holds nothing, neither does Python.
                    del records[fd]
                    del keys[tag]
                    self._settle(recheck)
                    raise self._port.change_error(code)
                # The re-check is the last entry unless a signal handler's
                # change came since (other threads wait for the lock): taken
                # back without a call (_settle is the general case), and
                # with no call between the test and the removal, where
                # a handler could run.
                if pending[-1] is recheck:
                    del pending[-1]
                else:
                    self._settle(recheck)
            else:
                if taken_back is not None:
                    # Unregistered and registered again before the next
                    # select (what asyncio's sock_recv does: its reader goes
                    # in a done callback, the next sock_recv adds it back),
                    # wherever its REMOVE sits in the queue: the port still
                    # has the registration, so the pair is one modification
                    # of it, under its tag. A new tag would be a new
                    # completion key for a live socket, which Windows does
                    # not allow before the REMOVE event ("deregister, wait for
                    # SOCK_NOTIFY_EVENT_REMOVE, and then re-register"): the
                    # port would REMOVE, hold the ENABLE back for the event,
                    # and on AFD cancel and remake the poll. Found again by
                    # identity: a signal handler's change since may have
                    # moved it.
                    self._settle(taken_back)
                records[fd] = _new_record(_Record, (key, tag))
                keys[tag] = key
                if taken_back is None:
                    self._unsent.add(tag)
                change = _new_change(
                    Change, (fd, tag, _FILTER_OF_MASK[events], OP_ENABLE, _ONESHOT_LEVEL))
                if pending[-1] is recheck:
                    pending[-1] = change
                else:
                    self._settle(recheck, change)
        if len(records) > self._room and not self._token:
            # Room for every registration to be ready at once. Not while
            # a select or a loop's run holds the token: the loop grows the
            # buffer when an answer fills it.
            me = _get_ident()
            held = True   # until known otherwise: never give back what was not taken
            try:
                held = "owner" in self._token
                if not held and self._take_token(me):
                    self._grow()
            finally:
                if not held:
                    self._give_token(me)
        return key

    def unregister(self, fileobj: Any) -> SelectorKey:
        """Unregister ``fileobj``; KeyError if it is not registered.

        Never fails for a socket closed meanwhile (as with the stdlib
        selectors, the port's refusal to remove it is ignored), nor in a
        forked child, whose port is the parent's. On epoll the
        registration leaves the kernel now, while the descriptor is still
        open: asyncio closes a socket right after removing its reader, and
        a removal made after the close could not reach an item whose file
        lives on in a dup() or a forked child. An answer in flight that
        names it is dropped: no later registration carries its tag.
        """
        with self._lock:
            return self._forget(fileobj)

    def _forget(self, fileobj: Any) -> SelectorKey:
        """unregister() with ``_lock`` held."""
        fd = self._fileobj_lookup(fileobj)
        try:
            key, tag = self._records[fd]
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        pending = self._pending
        recheck = (fd, tag, 0, _RECHECK, 0)
        pending.append(recheck)
        del self._records[fd]
        self._keys.pop(tag, None)
        if tag in self._unsent and not self._preparing:
            # The port never heard of it: forget its queued changes (the
            # re-check among them). In place, from the back, testing each
            # entry just before removing it: a signal handler's change
            # landing in this loop adds to the end, and a list built and
            # assigned back would drop it.
            self._unsent.discard(tag)
            for i in range(len(pending) - 1, -1, -1):
                if pending[i][1] == tag:
                    del pending[i]
        elif self._at_once:
            # A refused REMOVE is ignored (see _change).
            self._change_now(self._port_address, fd, tag, 0, OP_REMOVE, 0)
            if pending[-1] is recheck:
                del pending[-1]
            else:
                self._settle(recheck)
        else:
            # Made before the test: a handler running as the call returns
            # may queue changes, and the test must be the last step
            # before the replacement.
            remove = _new_change(Change, (fd, tag, 0, OP_REMOVE, 0))
            if pending[-1] is recheck:
                pending[-1] = remove
            else:
                self._settle(recheck, remove)
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        """Change the events and/or data of a registered file object.

        As with EpollSelector, any events value is accepted: the READ and
        WRITE bits are watched, and the key keeps the value given. Only an
        events change costs a port operation; one the port refuses
        unregisters the file object and raises.
        """
        with self._lock:
            try:
                fd = self._fileobj_lookup(fileobj)
                key, tag = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            recheck = None
            if events != key.events:
                if (events ^ key.events) & _WATCHED:
                    recheck = (fd, tag, 0, _RECHECK, 0)
                    self._pending.append(recheck)
                    try:
                        self._enable(fd, tag, events)
                    except OSError:
                        # What EpollSelector does: a refused modify unregisters.
                        self._settle(recheck)
                        self._forget(fileobj)
                        raise
                key = key._replace(events=events, data=data)
            elif data != key.data:
                key = key._replace(data=data)
            else:
                return key
            self._records[fd] = _new_record(_Record, (key, tag))
            self._keys[tag] = key
            if recheck is not None:
                self._settle(recheck)
        return key

    def _find_take_back(self, fd: int) -> _Queued | None:
        """If the last queued change of ``fd`` is its REMOVE: that change,
        whose tag the registration takes back (``_lock`` held;
        completion-port backends)."""
        pending = self._pending
        for i in range(len(pending) - 1, -1, -1):
            change = pending[i]
            if change[0] != fd:
                continue
            if change[3] != OP_REMOVE:
                return None
            return change
        return None

    def _prepare(self) -> int:
        """Start a select (the select token held): hand the queued changes
        to the port; returns how many the select carries. On epoll the
        re-checks left by interrupted changes are applied here, and the
        select carries none."""
        with self._lock:
            pending = self._pending
            if self._packed:
                # Changes the last prepare() moved into the bound buffer
                # that no select took (an exception landed between): first.
                again = self._port.unseen_bound_changes(self._packed)
                self._packed = 0
                if again:
                    pending[:0] = again
            if self._at_once:
                while pending:
                    self._apply_now(self._resolve(pending[0]))
                    del pending[0]
                return 0
            count = len(pending)
            if not count:
                return 0
            # A signal handler may change registrations while this runs
            # (this thread holds the lock, which is reentrant): its changes
            # go to the end of the queue (_preparing keeps them from
            # reaching back into it), and stay there for the next select.
            # What this select carries is the queue's first `count`.
            self._preparing = True
            try:
                return self._prepare_queued(pending, count)
            finally:
                self._preparing = False

    def _prepare_queued(self, pending: list[_Queued], count: int) -> int:
        """prepare() on a completion port: hand the first ``count`` queued
        changes to the port, re-checks resolved (``_lock`` held)."""
        queued = pending[:count]
        rechecks = [change for change in queued if change[3] == _RECHECK]
        if rechecks:
            # Last: a re-check stands for Python's record as it is now,
            # the end of whatever the changes queued after it did.
            changes = [change for change in queued if change[3] != _RECHECK]
            last = {change[1]: i for i, change in enumerate(changes)}
            # A re-check whose change the queue already ends with adds
            # nothing but a second ENABLE of an armed registration,
            # which Windows may refuse ("must not be re-enabled until
            # the SOCK_NOTIFY_EVENT_DISABLE notification is received").
            # One that differs from an ENABLE or DISABLE the queue ends
            # with (a modify cut after it queued its ENABLE and before
            # Python recorded the new events) takes its place: sent
            # after it, it would be a second ENABLE of that
            # registration in one call, which the OS may refuse as
            # well, and whose retry leaves the first filter's
            # notification queued ahead of the second's.
            extra: list[_Queued] = []
            for change in map(self._resolve, rechecks):
                i = last.get(change[1])
                if i is None:
                    extra.append(change)
                elif changes[i] == change:
                    continue
                elif changes[i][3] != OP_REMOVE and change[3] != OP_REMOVE:
                    changes[i] = change
                else:
                    extra.append(change)
            queued = changes + extra
        sent = len(queued)
        if sent > self._changes_room:
            room = self._changes_room
            while room < sent:
                room *= 2
            # Cannot be refused: this thread holds the select token.
            self._bind(self._room, room)
        self._port.pack_bound_changes(queued)
        self._packed = sent
        # The queue's first `count` are in the port's hands now;
        # anything behind them came from a handler and waits.
        del pending[:count]
        # A handler's first ENABLE left behind counts as sent from now on:
        # its unregister then queues a REMOVE behind it instead of deleting
        # it, which the port applies in order. Dearer, never wrong.
        self._unsent.clear()
        return sent

    def _apply_now(self, change: Change) -> None:
        """A re-check's change on epoll (``_lock`` held): an ENABLE the port
        refuses now ends the registration in Python too, as a refused
        register() would have."""
        code = self._change_now(self._port_address, *change)
        if code and change.op != OP_REMOVE:
            record = self._records.get(change.fd)
            if record is not None and record.tag == change.key:
                del self._records[change.fd]
                self._keys.pop(change.key, None)

    # -- the one call ---------------------------------------------------------------

    def _io_completed(self, got: int) -> int:
        """Hand the I/O completion keys of a select's answer (they follow
        the pairs in the buffer) to :attr:`io_completion_handler`; returns
        the number of pairs."""
        pairs = got & _PAIRS
        handler = self.io_completion_handler
        if handler is None:
            raise RuntimeError(
                f"the port dequeued {got >> 32} overlapped I/O completion(s) "
                "but nothing handles them (NotifySelector.io_completion_handler "
                "is None: a handle was associated with the port behind the "
                "loop's back)")
        start = _WORDS_PER_PAIR * pairs
        handler(self._out[start:start + (got >> 32)].tolist())
        return pairs

    def _raise_for(self, got: int) -> None:
        """Raise the exception for a negative select answer; nothing for
        an interrupted wait (the signal handler runs when Python resumes).

        A select that failed as a whole applied none of the changes it
        carried ("the entire operation failed, and no changes occurred"):
        they go back to the front of the queue for the next select, before
        what other threads queued meanwhile, so nothing is lost."""
        error = self._port.select_error(-got)
        if error is None:
            return
        # Only a select that ran (not one refused as busy or closed).
        again = self._port.unapplied_select_changes(-got) if isinstance(error, OSError) else []
        if again:
            with self._lock:
                self._pending[:0] = again
        raise error

    def _wait(self, wait_ms: float) -> int:
        """Apply queued changes and re-arms, wait, and return how many
        (tag, mask) pairs are at the front of ``self._out``. I/O
        completions go to :attr:`io_completion_handler`; a wait interrupted
        by a signal before anything arrived returns -1 (the signal's Python
        handler runs as soon as Python resumes)."""
        view = self._view
        count = view.prepare() if view.queued else 0
        got: int = (view.select(view.port, count, wait_ms) if count else
                    view.wait(view.port, wait_ms))
        if got < 0:
            self._raise_for(got)
            return -1
        if got & _ONE:
            # One pair, carried in the answer: put it where the caller
            # reads pairs.
            self._out[0] = got >> _SHIFT
            self._out[1] = got & _ONE
            return 1
        got >>= _SHIFT
        if got > _PAIRS:
            return self._io_completed(got)
        return got

    def select(self, timeout: float | None = None) -> list[tuple[SelectorKey, int]]:
        """Apply the recorded changes and re-arms, wait, return ready keys.

        ``timeout``: None blocks, ``<= 0`` polls, a positive number of
        seconds is rounded up to whole milliseconds. Returns a list of
        ``(key, events)`` with ``events`` a subset of ``key.events``.
        """
        wait = wait_ms(timeout)
        deadline = _monotonic() + timeout if wait > 0 else None  # type: ignore[operator]
        me = _get_ident()
        # Held already: this thread runs the loop that holds the token
        # (debug mode's iteration selects through here). Until that is
        # known, assumed, so that a cut before it gives nothing back.
        held = True
        try:
            held = self._token.get("owner") == me
            if not held and not self._take_token(me):
                raise RuntimeError("select() is already running in another thread")
            got = self._wait(wait)
            if got < 0:
                got = self._wait_again(wait, deadline)
            if not got:
                return []
            values = self._out[:got * _WORDS_PER_PAIR].tolist()
            if got >= self._room:
                self._grow()
        finally:
            if not held:
                self._give_token(me)
        keys = self._keys
        # Masked with the key read now, as EpollSelector does: the port
        # limited the mask to the registration's events at the wait, and a
        # modify() in another thread may have changed them since.
        return [(key, ready) for tag, mask in zip(values[::2], values[1::2])
                if (key := keys.get(tag)) is not None and (ready := mask & key.events)]

    def _wait_again(self, wait: float, deadline: float | None) -> int:
        """A signal cut the wait short and its Python handler did not raise:
        wait for the time left, as the stdlib selectors do (PEP 475). The
        one retry the core cannot make itself (it returns so that the
        handler runs); the core rounds the milliseconds left, as it
        rounded the first wait."""
        if wait == 0:
            return 0
        while True:
            if deadline is not None:
                left = deadline - _monotonic()
                if left <= 0:
                    return 0
                wait = left * 1e3
            got = self._wait(wait)
            if got >= 0:
                return got

    # -- life cycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the port and forget every registration. Idempotent."""
        with self._lock:
            self._records.clear()
            self._keys.clear()
            self._pending.clear()
            self._unsent.clear()
            self._packed = 0
            self._map = None
        self._port.close()

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"{len(self._records)} registered"
        return f"<{type(self).__name__} backend={self._port.backend} {state}>"

