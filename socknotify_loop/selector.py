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

Why a port key per registration: the port returns the caller's key with
each notification. A registration takes a small integer (a slot) and the
notification comes back as ``(slot, mask)``: one list index gives the
:class:`selectors.SelectorKey`. A slot is reused at once after
``unregister``: the core gives each registration its own kernel key
generation and drops whatever is still queued for a removed one, so the new
owner of a slot never sees the old one's events.

The hot path (``select()``, and :class:`~socknotify_loop.loop.Loop`, which
reads the same buffer) costs one cffi call with three arguments (the port,
the number of queued changes, the timeout in milliseconds, a float the C
side rounds up): the port writes ``(slot, selector mask)`` pairs into a
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
``select``. The bookkeeping they share is guarded by a lock; a select
holds the select token from the moment it takes the queued changes to the
moment it has read its answer, so a select refused because another thread
is selecting has touched nothing. A loop holds the token for its whole
life instead (:class:`FastPath`): it selects once per iteration, and taking
and giving back the token each time cost as much as a fifth of an
iteration's own work; the thread running it may still call ``select()``
between two iterations (debug mode does). A slot freed by ``unregister`` is
reused only from the next select on: an answer already in flight may still
name it, and must not be read as its next owner's (on epoll the selecting
thread frees it at once: it has no answer in flight).

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

__all__ = ["WAKEUP_KEY", "FastPath", "IOCompletionHandler", "NotifySelector"]

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
_WORDS_PER_PAIR = 2     # (slot, selector mask), each a uint64


class FastPath:
    """What a loop's iteration reads of a :class:`NotifySelector`, in one
    object it fetches once per iteration (``selector.fast_path``): the
    loop then makes the select call itself and reads the answer in place,
    without the list and tuples :meth:`NotifySelector.select` builds.

    A loop owns its selector: it takes the select token once, with
    ``fast.hold()`` (False if a select of another thread has it), and keeps
    it; ``fast.holder`` is then the ident of the thread that selects (the
    one running the loop, which the loop sets), and ``select()`` raises
    RuntimeError in any other thread. ``fast.let_go()`` gives the token
    back. The holding thread's iteration then is::

        got = (fast.select(fast.port, fast.prepare(), wait_ms) if fast.todo
               else fast.wait(fast.port, wait_ms))   # or poll/block, below
        # got & 3: one pair, slot got >> 2, mask got & 3
        # else got >>= 2; got > 0xFFFFFFFF: got = fast.io_completed(got)
        # pairs (slot, mask): fast.out[2*i], fast.out[2*i + 1];
        # the key is fast.keys[slot] (None: unregistered meanwhile);
        # an answer of fast.room pairs or more: fast.grow() after reading
        # it (room for every registration, which a register() in another
        # thread could not make while the token was held)
        # got < 0: fast.raise_for(got)

    ``select()`` follows the same protocol with the token taken for the
    one call (``fast.token``, a one-item list: ``pop()`` takes it).

    The attributes always name the selector's current objects (the lists
    are never replaced, ``out`` is updated when the buffers are bound
    anew). ``port`` is the port's address for these calls
    (:attr:`Port.address`); ``owner`` keeps the port alive with it.
    With nothing to prepare (``todo`` empty),
    ``fast.poll(fast.port)``, ``fast.block(fast.port)`` and
    ``fast.wait(fast.port, wait_ms)`` are ``fast.select(fast.port, 0, 0)``,
    ``fast.select(fast.port, 0, -1)`` and ``fast.select(fast.port, 0,
    wait_ms)``."""

    __slots__ = ("select", "poll", "block", "wait", "port", "owner", "token", "pending",
                 "released", "prepare", "out", "keys", "io_completed", "raise_for",
                 "holder", "hold", "let_go", "room", "grow", "todo")

    select: Callable[[int, int, float], int]
    poll: Callable[[int], int]
    block: Callable[[int], int]
    wait: Callable[[int, float], int]
    port: int
    owner: Port
    token: list[bool]
    pending: list[Change]
    released: list[int]
    prepare: Callable[[], int]
    out: Any
    keys: list[SelectorKey | None]
    io_completed: Callable[[int], int]
    raise_for: Callable[[int], None]
    holder: int
    hold: Callable[[], bool]
    let_go: Callable[[], None]
    room: int
    grow: Callable[[], None]
    todo: list[Any]


class _Record(NamedTuple):
    """One registration: its selector key and its port key (slot)."""

    key: SelectorKey
    slot: int


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
    registrations and modifications are applied at once (errors raise
    where ``EpollSelector`` raises them) and an unregister's kernel change
    goes with the next :meth:`select`, where an immediate register of the
    same descriptor turns the pair into one modification. On the
    completion-port backends every change goes with the next select, and a
    descriptor that is not an open socket is still refused at
    :meth:`register`.

    ``backend`` chooses the port's backend (see :class:`Port`); ``None``
    takes ``SOCKNOTIFY_BACKEND`` or the best one available. One thread at a
    time may be inside :meth:`select` (a second raises RuntimeError).
    """

    def __init__(self, backend: str | None = None) -> None:
        self._port = port = Port(backend)
        self._at_once = port.changes_at_once
        self._change_now = port.change_function()
        self._port_address = port.address
        # fd -> _Record: the one record per registration.
        self._records: dict[int, _Record] = {}
        # slot -> SelectorKey (None when free): the hot path's index from
        # the port's answer to the key. Slot 0 is never handed out.
        self._keys: list[SelectorKey | None] = [None]
        self._free: list[int] = []
        # Slots unregistered since the last select: free from the next one
        # on (see the module docstring on threads).
        self._released: list[int] = []
        # Changes for the next select() (completion-port backends only).
        self._pending: list[Change] = []
        self._unsent: set[int] = set()   # slots whose first ENABLE is still queued
        # Guards the bookkeeping above against other threads' changes.
        self._lock = threading.Lock()
        # The select token: popped by the thread entering select(), from
        # taking the queued changes to reading the answer out of the bound
        # buffer, and put back after. A one-item list rather than a Lock:
        # list.pop() and append() are as atomic as acquire(False) and
        # release(), and cost a fraction of them on the loop's hot path
        # (a Lock's acquire parses its arguments at every call).
        self._select_token: list[bool] = [True]
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
        #: The selector as a loop's iteration reads it (see :class:`FastPath`):
        #: the same object for the selector's whole life.
        fast = self.fast_path = self._fast = FastPath()
        fast.select = port.select_function()
        fast.port = self._port_address
        fast.poll, fast.block, fast.wait = port.wait_functions()
        fast.owner = port
        fast.token = self._select_token
        fast.pending = self._pending
        fast.released = self._released
        # The one list whose items mean the next select must prepare():
        # on epoll, slots to free (changes are made at once); on the
        # completion ports, queued changes (an unregister queues its
        # REMOVE; a slot released without one waits for the next change
        # to be freed, which only delays its reuse).
        fast.todo = self._released if self._at_once else self._pending
        fast.prepare = self._prepare
        fast.keys = self._keys
        fast.io_completed = self._io_completed
        fast.raise_for = self._raise_for
        fast.holder = 0
        fast.hold = self._hold
        fast.let_go = self._let_go
        fast.grow = self._grow
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
        self._fast.out = self._out
        self._fast.room = self._room = room
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

    # -- the select token held for a loop's life ----------------------------------

    def _hold(self) -> bool:
        """Take the select token until :meth:`_let_go` (a loop's whole
        life), this thread selecting; False if a select in another thread
        holds it."""
        try:
            self._select_token.pop()
        except IndexError:
            return False
        self._fast.holder = _get_ident()
        return True

    def _let_go(self) -> None:
        """Give back the token :meth:`_hold` took."""
        self._fast.holder = 0
        self._select_token.append(True)

    def _no_select_elsewhere(self) -> bool:
        """No other thread is inside a select: the token is free, or this
        thread holds it for its run (and is not selecting, since it is here)."""
        return bool(self._select_token) or self._fast.holder == _get_ident()

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
            return fileno_of(fileobj)   # validated as selectors do
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
        if self._map is None:
            raise RuntimeError("Selector is closed")
        try:
            return self._records[self._fileobj_lookup(fileobj)].key
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None

    # -- changes -------------------------------------------------------------------

    def _change(self, fd: int, slot: int, events: int, op: int, trigger: int) -> None:
        """Apply a change now (epoll) or queue it for the next select()
        (``_lock`` held). Raises for a refused ENABLE; a refused REMOVE
        means the descriptor was closed first, which the stdlib selectors
        ignore too."""
        if self._at_once:
            code = self._change_now(self._port_address, fd, slot, events, op, trigger)
            if code:
                error = self._port.change_error(code)
                if op != OP_REMOVE or isinstance(error, ValueError):
                    raise error
        else:
            self._pending.append(_new_change(Change, (fd, slot, events, op, trigger)))

    def _enable(self, fd: int, slot: int, events: int) -> None:
        """The port change that makes a registration watch ``events``
        (``_lock`` held): an ENABLE of their filter, or a DISABLE when they
        hold neither READ nor WRITE (modify() accepts that, as
        EpollSelector does)."""
        watched = events & _WATCHED
        if watched:
            self._change(fd, slot, _FILTER_OF_MASK[watched], OP_ENABLE, _ONESHOT_LEVEL)
        else:
            self._change(fd, slot, 0, OP_DISABLE, 0)

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
                raise ValueError("I/O operation on a closed selector")
            at_once = self._at_once
            if at_once:
                if fd > _MAX_EPOLL_FD:
                    raise OverflowError(f"file descriptor {fd} does not fit a C int")
            else:
                code = self._port.probe(fd)
                if code:
                    raise self._port.change_error(code)
            keys = self._keys
            free = self._free
            key = SelectorKey(fileobj, fd, events, data)
            pending = self._pending
            # Not while another thread selects: an answer in flight naming
            # the slot (a readiness, or the failure of a change it carried)
            # is about the old registration, and the number may now name
            # another socket (closed and reused at once). The port then
            # gets a REMOVE and an ENABLE under a new slot, and holds the
            # ENABLE back until the REMOVE event: correct, only dearer.
            taken_back = (self._take_back(fd)
                          if pending and not at_once and self._no_select_elsewhere()
                          else None)
            if taken_back is not None:
                # Unregistered and registered again before the next select
                # (what asyncio's sock_recv does: its reader goes in a done
                # callback, the next sock_recv adds it back), wherever its
                # REMOVE sits in the queue (unregister a, unregister b,
                # register a): the port still has the registration, so the
                # pair is one modification of it, under its slot. A new
                # slot would be a new completion key for a live socket,
                # which Windows does not allow before the REMOVE event
                # ("deregister, wait for SOCK_NOTIFY_EVENT_REMOVE, and then
                # re-register"): the port would REMOVE, hold the ENABLE back
                # for the event, and on AFD cancel and remake the poll.
                slot = taken_back
                keys[slot] = key
                pending.append(_new_change(
                    Change, (fd, slot, _FILTER_OF_MASK[events], OP_ENABLE, _ONESHOT_LEVEL)))
                known_to_port = True
            else:
                # The key takes its slot before the port hears of it: on
                # epoll the item is in the kernel as soon as _change
                # returns, and a select running in another thread may
                # report it at once and read the slot (without the lock)
                # before this thread is back.
                if free:
                    slot = free.pop()
                    keys[slot] = key
                else:
                    slot = len(keys)
                    keys.append(key)
                known_to_port = at_once
                try:
                    self._change(fd, slot, _FILTER_OF_MASK[events], OP_ENABLE, _ONESHOT_LEVEL)
                except BaseException:
                    # Refused: nothing is recorded, the slot is free again.
                    keys[slot] = None
                    free.append(slot)
                    raise
            records[fd] = _new_record(_Record, (key, slot))
            if not known_to_port:
                self._unsent.add(slot)
        if len(records) > self._room and self._select_token:
            # Room for every registration to be ready at once; when a
            # select is running, the next register tries again (and a loop
            # holding the token grows the buffer when an answer fills it).
            try:
                token = self._select_token.pop()
            except IndexError:
                return key
            try:
                self._grow()
            finally:
                self._select_token.append(token)
        elif len(records) > self._room and self._fast.holder == _get_ident():
            # This thread's loop holds the token and is between two selects.
            self._grow()
        return key

    def unregister(self, fileobj: Any) -> SelectorKey:
        """Unregister ``fileobj``; KeyError if it is not registered.

        Never fails for a socket closed meanwhile (as with the stdlib
        selectors, the port's refusal to remove it is ignored). On epoll
        the registration leaves the kernel now, while the descriptor is
        still open: asyncio closes a socket right after removing its
        reader, and a removal made after the close could not reach an item
        whose file lives on in a dup() or a forked child.
        """
        with self._lock:
            return self._forget(fileobj)

    def _forget(self, fileobj: Any) -> SelectorKey:
        """unregister() with ``_lock`` held."""
        try:
            key, slot = self._records.pop(self._fileobj_lookup(fileobj))
        except KeyError:
            raise KeyError(f"{fileobj!r} is not registered") from None
        self._keys[slot] = None
        if self._at_once and self._fast.holder == _get_ident():
            # epoll removes the item now and the core drops the record; and
            # this thread, a loop's between two of its selects, has no
            # answer in flight that could name the slot: free at once.
            self._free.append(slot)
        else:
            self._released.append(slot)
        if slot in self._unsent:
            # The port never heard of it: forget its queued changes.
            self._unsent.discard(slot)
            self._drop_pending(slot)
        else:
            self._change(key.fd, slot, 0, OP_REMOVE, 0)
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
                key, slot = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            if events != key.events:
                if (events ^ key.events) & _WATCHED:
                    try:
                        self._enable(fd, slot, events)
                    except OSError:
                        # What EpollSelector does: a refused modify unregisters.
                        self._forget(fileobj)
                        raise
                key = key._replace(events=events, data=data)
            elif data != key.data:
                key = key._replace(data=data)
            else:
                return key
            self._records[fd] = _new_record(_Record, (key, slot))
            self._keys[slot] = key
        return key

    def _take_back(self, fd: int) -> int | None:
        """If the last queued change of ``fd`` is its REMOVE: take that
        REMOVE out of the queue and its slot out of the released list, and
        return the slot (``_lock`` held; completion-port backends)."""
        pending = self._pending
        for i in range(len(pending) - 1, -1, -1):
            change = pending[i]
            if change.fd != fd:
                continue
            slot: int = change.key
            if change.op != OP_REMOVE or slot not in self._released:
                return None
            del pending[i]
            self._released.remove(slot)
            return slot
        return None

    def _drop_pending(self, slot: int) -> None:
        """Forget the queued changes of ``slot`` (``_lock`` held)."""
        self._pending[:] = [c for c in self._pending if c.key != slot]

    def _prepare(self) -> int:
        """Start a select (the select token held): free the slots released
        since the last one and move the queued changes into the bound
        buffer; returns how many changes there are."""
        with self._lock:
            if self._released:
                self._free.extend(self._released)
                self._released.clear()
            pending = self._pending
            count = len(pending)
            if not count:
                return 0
            if count > self._changes_room:
                room = self._changes_room
                while room < count:
                    room *= 2
                # Cannot be refused: this thread holds the select token.
                self._bind(self._room, room)
            self._port.pack_bound_changes(pending)
            pending.clear()
            self._unsent.clear()
            return count

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
        (slot, mask) pairs are at the front of ``self._out``. I/O
        completions go to :attr:`io_completion_handler`; a wait interrupted
        by a signal before anything arrived returns -1 (the signal's Python
        handler runs as soon as Python resumes)."""
        fast = self._fast
        count = fast.prepare() if fast.todo else 0
        got: int = (fast.select(fast.port, count, wait_ms) if count else
                     fast.wait(fast.port, wait_ms))
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
        try:
            token = self._select_token.pop()
        except IndexError:
            if self._fast.holder != _get_ident():
                raise RuntimeError("select() is already running in another thread") from None
            # This thread's loop holds the token for its run, and is here
            # between two of its own selects (debug mode's iteration).
            token = None
        try:
            got = self._wait(wait)
            if got < 0:
                got = self._wait_again(wait, deadline)
            if not got:
                return []
            values = self._out[:got * _WORDS_PER_PAIR].tolist()
            if got >= self._room:
                self._grow()
        finally:
            if token is not None:
                self._select_token.append(token)
        keys = self._keys
        # Masked with the key read now, as EpollSelector does: the port
        # limited the mask to the registration's events at the wait, and a
        # modify() in another thread may have changed them since.
        return [(key, ready) for slot, mask in zip(values[::2], values[1::2])
                if (key := keys[slot]) is not None and (ready := mask & key.events)]

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
            self._keys[:] = [None]
            self._free.clear()
            self._released.clear()
            self._pending.clear()
            self._unsent.clear()
            self._map = None
        self._port.close()

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"{len(self._records)} registered"
        return f"<{type(self).__name__} backend={self._port.backend} {state}>"

