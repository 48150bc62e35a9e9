"""NotifySelector: a :mod:`selectors` selector on one notification port.

What the selector keeps, per descriptor: its registration as the user
wants it (the :class:`selectors.SelectorKey` and the registration's tag),
what the port holds of it, and whether the two may differ (the *dirty*
set). ``register``, ``modify`` and ``unregister`` change what is wanted and
mark the descriptor; they never write down what the port holds. The
changes the port needs are computed from the two states, at most one per
descriptor, by whoever holds the select token, right before a wait
(``_flush``). So the port's view is *reconciled* with Python's, never
replayed from a log of changes: whatever cut a change short (an exception
a signal handler raises between two bytecodes, KeyboardInterrupt), its
descriptor stays marked, and the next reconcile computes the change from
the states as they are then. That is how wepoll (``sock_update``, flushed
by ``port__update_events``), mio (its ``update_queue``) and trio
(``_refresh_afd``) keep a socket's registration, and what
``selectors._PollLikeSelector`` does with epoll's own state.

Where the change goes. On the completion-port backends the Winsock model
applies changes and waits in ONE kernel call
(``ProcessSocketNotifications``): the reconcile packs the changes into the
buffer bound to the port and the select call carries them; what the port
holds is written down once that call has taken them. On epoll every
change is a system call of its own wherever it is made, so a change is
applied at once and reported where ``selectors.EpollSelector`` reports it
(a regular file: ``PermissionError`` at ``register()``); the port then
holds what is wanted, except for a descriptor a cut left marked, which the
next reconcile sets to what is wanted.

Why re-arms need nothing here: registrations are one-shot and
level-triggered, and the C core re-enables what it delivered at the start
of the next select, inside the same kernel call that waits. A selector
user (asyncio) expects level semantics, and gets them without a change
crossing the FFI.

Why a tag per registration: the port answers with the caller's key of a
registration (``sn_record_t.user_key``). Each registration takes a tag, a
number this selector never hands out for another registration, and the
answer comes back as ``(tag, mask)``: one dict lookup gives the
:class:`selectors.SelectorKey`, and an answer reaches the registration it
was made for or none, whatever a signal handler, another thread or an
exception did between the wait's return and the reading of the answer.
The one continuation on purpose: on the completion-port backends a
``register`` of a descriptor whose previous registration the port still
holds (an ``unregister`` and a ``register`` between two selects, what
asyncio's ``sock_recv`` does) continues that registration under its tag,
since Windows keeps a socket's first completion key until its REMOVE event.

The answer. One cffi call waits: the port writes ``(tag, selector mask)``
pairs into a buffer bound to it once (one pair travels in the call's
return value instead), the mask computed in C as
``selectors.EpollSelector`` computes it and limited to what the
registration asked for. :class:`LoopView` is the loop's window onto all
this; ``LoopView.answer`` is the one decoder of the call's answer.

A change refused by the kernel at select time (on the completion-port
backends: a socket closed between ``register()`` and the next
``select()``) never leaves the wait blocked: it is reported once as ready
for the key's events, like ``EPOLLERR``, so its owner's callback meets the
error in ``recv``/``send``.

Threads: as with ``selectors.EpollSelector``, ``register``, ``modify`` and
``unregister`` may be called from any thread while one thread is inside
``select``, and reach it: on epoll the kernel applies them to the waiting
call; on the completion-port backends a change made while another thread
holds the select token wakes that thread's wait (a packet posted to the
port), which reconciles and waits again for the time left. The state is
guarded by a lock. The select token (a dict entry holding the ident of the
thread that has it) is held by a select from its reconcile to the reading
of its answer, so a select refused because another thread is selecting
has touched nothing. A loop holds it for a whole run instead
(:meth:`NotifySelector.begin_run`, taken after asyncio's own "already
running" check); the thread running the loop may still call ``select()``
(debug mode does), any other raises RuntimeError.

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
    Port,
    fileno_of,
    wait_ms,
)

__all__ = ["WAKEUP_KEY", "ONE_PAIR", "TAG_SHIFT", "IOCompletionHandler", "LoopView",
           "NotifySelector"]

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
#: is kept for wake-ups.
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

# The select call's answer (Port.select_function): minus an error code;
# or one pair carried in the value itself, when its low two bits (the
# mask) are not 0: tag ``answer >> TAG_SHIFT``, mask ``answer & ONE_PAIR``;
# or else, shifted right by TAG_SHIFT, the number of pairs in the bound
# buffer in the low 32 bits and the number of I/O keys after them above.
#: The bits of a one-pair answer that hold its mask (never 0 for one pair).
ONE_PAIR = 3
#: How far a one-pair answer's tag (or another answer's counts) is shifted.
TAG_SHIFT = 2
_PAIRS = 0xFFFFFFFF
_IO_SHIFT = 32
_WORDS_PER_PAIR = 2     # (tag, selector mask), each a uint64


class LoopView:
    """What a loop's iteration reads of its :class:`NotifySelector`
    (``selector.loop_view``, one object for the selector's whole life), so
    that it can make the port's call itself and read the answer in place,
    without the list and tuples :meth:`NotifySelector.select` builds. The
    loop assigns none of the attributes; of the functions, ``flush`` and
    ``answer`` change the selector's state as a select does (they
    reconcile, grow the answer buffer, hand I/O completions over). An iteration,
    run between :meth:`NotifySelector.begin_run` and
    :meth:`NotifySelector.end_run`, is::

        got = view.flush(ms) if view.pending else view.wait(view.port, ms)
                                      # or view.poll(view.port), view.block(view.port)
        if got > 0 and got & ONE_PAIR:   # one pair
            key = view.keys.get(got >> TAG_SHIFT)   # None: unregistered meanwhile
        elif got:
            values = view.answer(got)    # [tag, mask, tag, mask, ...]

    ``port`` is the port's address (:attr:`Port.address`); ``poll(port)``,
    ``block(port)`` and ``wait(port, ms)`` wait without changes: 0, for
    ever, or ``ms`` milliseconds (a float, rounded up in C). ``pending``
    is true when some registration may differ from what the port holds
    (on the completion-port backends, any change since the last wait; on
    epoll, only one an exception cut short): then ``flush(ms)`` hands the
    port what reconciles them and waits, in one call. ``keys`` maps a tag
    to its key (read only). ``answer(got)`` decodes any answer the one-pair
    test does not take: it hands I/O completions to their handler, raises
    for an error (nothing for an interrupted wait) and returns the pairs
    as one flat list. ``key(fd)`` is ``fd``'s key or None (RuntimeError
    once the selector is closed), for the loop's add and remove of readers
    and writers."""

    __slots__ = ("port", "poll", "block", "wait", "pending", "flush", "answer", "keys", "key")

    port: int
    poll: Callable[[int], int]
    block: Callable[[int], int]
    wait: Callable[[int, float], int]
    pending: set[int]
    flush: Callable[[float], int]
    answer: Callable[[int], list[int]]
    keys: dict[int, SelectorKey]
    key: Callable[[Any], SelectorKey | None]


class _Record(NamedTuple):
    """One registration as the user wants it: its selector key and its tag
    (the key the port answers with)."""

    key: SelectorKey
    tag: int


# A named tuple made without the Python-level __new__ of namedtuple (a
# call frame each): register() and modify() are on asyncio's hot path
# for sock_recv/sock_sendall, which add and remove a reader per call.
_new_record = tuple.__new__

#: What the port holds of a descriptor (completion-port backends): the
#: registration's tag and the events it watches (0: disabled), or -1 for
#: events it must be sent again (a registration continued under its tag).
_Held = tuple[int, int]
_RESEND = -1

#: Not a descriptor: in the dirty set, a reconcile not yet written down
#: (its changes to be computed again).
_UNSETTLED = -1


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
    the port hears of changes at the next :meth:`select` (a descriptor that
    is not an open socket is still refused at :meth:`register`), and only
    of what differs then: a register and a modify before it are one
    ENABLE, a register and an unregister nothing.

    ``backend`` chooses the port's backend (see :class:`Port`); ``None``
    takes ``SOCKNOTIFY_BACKEND`` or the best one available. One thread at a
    time may be inside :meth:`select` (a second raises RuntimeError), and
    while a loop runs on the selector, only the loop's thread.
    """

    def __init__(self, backend: str | None = None) -> None:
        self._port = port = Port(backend)
        self._at_once = port.changes_at_once
        self._change_now = port.change_function()
        self._select_now = port.select_function()
        self._port_address = port.address
        # fd -> _Record: the registrations as the user wants them.
        self._records: dict[int, _Record] = {}
        # tag -> SelectorKey: the answer's index. Tags are never reused for
        # another registration; 0 is never one.
        self._keys: dict[int, SelectorKey] = {}
        self._next_tag = 1
        # fd -> _Held: what the port holds (completion-port backends; on
        # epoll the port holds what is wanted once a change returns).
        self._held: dict[int, _Held] = {}
        # Descriptors whose wanted state may differ from what the port
        # holds: marked by every change before it writes anything, cleared
        # (on epoll) once the port agrees, swapped out by a reconcile. Two
        # sets that trade places, so that a change a signal handler makes
        # while a reconcile runs lands in the set it is not reading.
        self._dirty: set[int] = set()
        # The descriptors a reconcile took: emptied once the select has
        # taken their changes and what the port holds is written down. One
        # left full (an exception, a select that failed as a whole) is
        # taken again by the next reconcile: it recomputes every change.
        self._taken: set[int] = set()
        # A wake-up packet is on its way to the thread holding the select
        # token, posted by a change from another thread since the last
        # reconcile (completion-port backends): one is enough.
        self._woken = False
        # Guards the state above against other threads' changes.
        # Reentrant: a Python signal handler runs in the thread it
        # interrupts, between two bytecodes, so one that pauses, resumes or
        # closes a transport (a change of its registration) may run while
        # that thread is inside a change with the lock held; a plain lock
        # would block that thread on itself for good. The stdlib selectors
        # take no lock and let the handler's change run inside the other
        # one; so does this one.
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
        view.port = self._port_address
        view.poll, view.block, view.wait = port.wait_functions()
        view.pending = self._dirty
        view.flush = self._flush
        view.answer = self._answer
        view.keys = self._keys
        view.key = self._key_or_none
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
        self._room = room
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
        if self._token.get("owner", _get_ident()) != _get_ident():
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

    def _wake_the_selecting_thread(self) -> None:
        """The end of a change on the completion-port backends (``_lock``
        held, the descriptor marked): if another thread holds the select
        token, its wait may be on and would not see the change before it
        ends, so a packet posted to the port ends it, and that thread
        reconciles and waits again. One packet until that thread's next
        reconcile, which comes before its next wait: the flag is set with
        the mark it answers for, and a reconcile clears both in one step. A
        thread that takes the token after this look reconciles after the
        mark."""
        owner = self._token.get("owner")
        if owner is None or owner == _get_ident() or self._woken:
            return
        self._woken = True
        try:
            self._port.post(WAKEUP_KEY)
        except ValueError:
            pass   # the port is closed: nobody waits on it any more

    # -- introspection ---------------------------------------------------------

    @property
    def port(self) -> Port:
        """The notification port this selector waits on."""
        return self._port

    @property
    def backend(self) -> str:
        """The port's backend: ``'epoll'``, ``'psn'``, ``'afd'`` or
        ``'strict'``."""
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
        call, through ``LoopView.key``, and a miss is common: no exception
        for it). RuntimeError if the selector is closed, ValueError for an
        invalid file object."""
        if self._map is None:
            raise RuntimeError("Selector is closed")
        record = self._records.get(self._fileobj_lookup(fileobj))
        return None if record is None else record.key

    # -- changes: what the user wants -------------------------------------------------

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
                # CPython's words for a number its poller cannot take
                # (epoll's and select()'s descriptors are C ints).
                raise OverflowError("Python int too large to convert to C int")
            if not at_once:
                code = self._port.probe(fd)
                if code:
                    raise self._port.change_error(code)
            # Marked first: a cut anywhere after it leaves the next
            # reconcile to make the port agree with what is recorded here.
            self._dirty.add(fd)
            if at_once:
                tag = self._next_tag
                self._next_tag = tag + 1
            else:
                tag = self._tag_for(fd)
            key = SelectorKey(fileobj, fd, events, data)
            # Recorded before the port hears of it: on epoll the item is in
            # the kernel as soon as the call returns, and a select running
            # in another thread may report it at once.
            records[fd] = _new_record(_Record, (key, tag))
            self._keys[tag] = key
            if at_once:
                code = self._change_now(self._port_address, fd, tag, _FILTER_OF_MASK[events],
                                        OP_ENABLE, _ONESHOT_LEVEL)
                if code:
                    # Refused: the port holds nothing, neither does Python.
                    del records[fd]
                    del self._keys[tag]
                    self._dirty.discard(fd)
                    raise self._port.change_error(code)
                self._dirty.discard(fd)
            else:
                self._wake_the_selecting_thread()
        if len(records) > self._room and not self._token:
            self._grow_now()
        return key

    def _tag_for(self, fd: int) -> int:
        """The tag of a new registration of ``fd`` (``_lock`` held): a new
        one; or, on the completion-port backends, the tag of the
        registration the port still holds for ``fd`` (unregistered since
        the last select: asyncio's sock_recv removes its reader in a done
        callback and the next call adds it back), which it continues. A new
        tag there would be a new completion key for a live socket, which
        Windows does not allow before the REMOVE event ("deregister, wait
        for SOCK_NOTIFY_EVENT_REMOVE, and then re-register"): the port
        would REMOVE and hold the ENABLE back for that event. Its events
        are sent again (the number may name another socket by now: the
        port then checks). Not while another thread selects: an answer in
        flight would name the tag, for the old registration."""
        held = self._held.get(fd)
        if held is not None and self._no_select_elsewhere():
            self._held[fd] = (held[0], _RESEND)
            return held[0]
        tag = self._next_tag
        self._next_tag = tag + 1
        return tag

    def _grow_now(self) -> None:
        """Room for every registration in the answer buffer, after a
        register(): only while no select or loop's run holds the token
        (the loop grows the buffer when an answer fills it)."""
        me = _get_ident()
        held = True   # until known otherwise: never give back what was not taken
        try:
            held = "owner" in self._token
            if not held and self._take_token(me):
                self._grow()
        finally:
            if not held:
                self._give_token(me)

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
            fd = self._fileobj_lookup(fileobj)
            try:
                key, tag = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            self._dirty.add(fd)
            if self._at_once:
                # Removed before Python forgets it: a cut between leaves a
                # registration Python still has, which the next reconcile
                # enables again. A refused REMOVE is ignored (see above).
                self._change_now(self._port_address, fd, tag, 0, OP_REMOVE, 0)
            del self._records[fd]
            self._keys.pop(tag, None)
            if self._at_once:
                self._dirty.discard(fd)
            else:
                self._wake_the_selecting_thread()
        return key

    def modify(self, fileobj: Any, events: int, data: Any = None) -> SelectorKey:
        """Change the events and/or data of a registered file object.

        As with EpollSelector, any events value is accepted: the READ and
        WRITE bits are watched, and the key keeps the value given. Only an
        events change costs a port operation; one the port refuses (on
        epoll) unregisters the file object and raises.
        """
        with self._lock:
            try:
                fd = self._fileobj_lookup(fileobj)
                key, tag = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            if events == key.events:
                if data == key.data:
                    return key
                key = key._replace(data=data)
                self._records[fd] = _new_record(_Record, (key, tag))
                self._keys[tag] = key
                return key
            watched = events & _WATCHED
            changed = watched != key.events & _WATCHED
            key = key._replace(events=events, data=data)
            if changed:
                self._dirty.add(fd)
            self._records[fd] = _new_record(_Record, (key, tag))
            self._keys[tag] = key
            if changed and self._at_once:
                code = (self._change_now(self._port_address, fd, tag, _FILTER_OF_MASK[watched],
                                         OP_ENABLE, _ONESHOT_LEVEL) if watched else
                        self._change_now(self._port_address, fd, tag, 0, OP_DISABLE, 0))
                if code:
                    # What EpollSelector does: a refused modify unregisters.
                    self.unregister(fileobj)
                    raise self._port.change_error(code)
                self._dirty.discard(fd)
            elif changed:
                self._wake_the_selecting_thread()
        return key

    # -- reconciling: what the port holds -------------------------------------------------

    def _change_for(self, fd: int) -> tuple[tuple[int, int, int, int, int] | None,
                                            _Held | None]:
        """The one change that makes the port hold what is wanted of
        ``fd``, or None, and what the port holds once it is made (None:
        nothing); completion-port backends, ``_lock`` held."""
        held = self._held.get(fd)
        record = self._records.get(fd)
        if record is None:
            if held is None:
                return None, None
            # Removed: a REMOVE naming the tag (the port ignores it if its
            # record carries another tag by now).
            return (fd, held[0], 0, OP_REMOVE, 0), None
        key, tag = record
        watched = key.events & _WATCHED
        if held is not None and held[0] == tag and held[1] == watched:
            return None, held
        if watched:
            # A new registration, or one the port holds under another tag
            # (the port re-keys it), or other events: one ENABLE.
            return (fd, tag, _FILTER_OF_MASK[watched], OP_ENABLE, _ONESHOT_LEVEL), (tag, watched)
        if held is None:
            return None, None          # nothing watched, nothing held
        if held[0] != tag:
            return (fd, held[0], 0, OP_REMOVE, 0), None
        return (fd, tag, 0, OP_DISABLE, 0), (tag, 0)

    def _flush(self, ms: float) -> int:
        """Reconcile, then wait up to ``ms`` milliseconds: the general
        select call (the select token held); returns the call's answer.

        The dirty set is swapped out first, so that a change a signal
        handler makes meanwhile lands in the fresh one (and waits for the
        next reconcile). On the completion-port backends each descriptor
        taken becomes at most one change in the select call's batch; what
        the port holds is written down once the call took them. On epoll
        the descriptors taken are those a cut left marked: each gets what
        is wanted of it, at once."""
        with self._lock:
            taken = self._taken
            # What a flush cut short left taken goes with this one.
            self._dirty |= taken
            taken.clear()
            # The fresh set starts marked, so that the selector's users see
            # a reconcile to make until this one is written down (a select
            # that failed as a whole, or a cut, leaves it there).
            taken.add(_UNSETTLED)
            self._woken = False
            # One step: the sets trade places (no call between the stores).
            self._taken, self._dirty, self._view.pending = self._dirty, taken, taken
            if self._at_once:
                self._enable_taken()
                count = 0
                sent: list[tuple[int, _Held | None]] = []
            else:
                sent = self._pack_taken()
                count = len(sent)
            if not count:
                self._settled()
        got: int = self._select_now(self._port_address, count, ms)
        if got >= 0 and count:
            # The call took the batch (one that failed as a whole answers
            # an error and applied none of it: left taken, it is computed
            # again).
            with self._lock:
                held = self._held
                for fd, state in sent:
                    if state is None:
                        held.pop(fd, None)
                    else:
                        held[fd] = state
                self._settled()
        return got

    def _settled(self) -> None:
        """The taken descriptors' changes are made and written down
        (``_lock`` held)."""
        self._taken.clear()
        self._dirty.discard(_UNSETTLED)

    def _pack_taken(self) -> list[tuple[int, _Held | None]]:
        """The taken descriptors' changes into the bound buffer
        (completion-port backends, ``_lock`` and the token held); returns,
        per change, its descriptor and what the port holds once it is
        made."""
        changes = []
        sent = []
        for fd in self._taken:
            change, state = self._change_for(fd)
            if change is not None:
                changes.append(change)
                sent.append((fd, state))
        if not changes:
            return sent
        if len(changes) > self._changes_room:
            room = self._changes_room
            while room < len(changes):
                room *= 2
            # Cannot be refused: this thread holds the select token.
            self._bind(self._room, room)
        self._port.pack_bound_changes(changes)
        return sent

    def _enable_taken(self) -> None:
        """Epoll, ``_lock`` held: each taken descriptor Python has gets its
        ENABLE (or DISABLE) again, at once; the port holds nothing of one
        Python no longer has (its REMOVE came before Python forgot it). An
        ENABLE the port refuses now ends the registration in Python too, as
        a refused register() would have."""
        for fd in self._taken:
            record = self._records.get(fd)
            if record is None:
                continue
            key, tag = record
            watched = key.events & _WATCHED
            code = (self._change_now(self._port_address, fd, tag, _FILTER_OF_MASK[watched],
                                     OP_ENABLE, _ONESHOT_LEVEL) if watched else
                    self._change_now(self._port_address, fd, tag, 0, OP_DISABLE, 0))
            if code and self._records.get(fd) is record:
                del self._records[fd]
                self._keys.pop(tag, None)

    # -- the answer ---------------------------------------------------------------------

    def _answer(self, got: int) -> list[int]:
        """The select call's answer as a flat list ``[tag, mask, tag, mask,
        ...]``: the one decoder of it. The keys of overlapped I/O
        completions go to :attr:`io_completion_handler`; an answer that
        filled the buffer grows it (the select token held); an error
        raises, and an interrupted wait is no pairs (the signal's Python
        handler runs as soon as Python resumes)."""
        if got < 0:
            error = self._port.select_error(-got)
            if error is not None:
                raise error
            return []
        if got & ONE_PAIR:
            return [got >> TAG_SHIFT, got & ONE_PAIR]
        got >>= TAG_SHIFT
        pairs = got & _PAIRS
        if got > _PAIRS:
            self._io_completed(pairs, got >> _IO_SHIFT)
        values: list[int] = self._out[:pairs * _WORDS_PER_PAIR].tolist()
        if pairs >= self._room:
            self._grow()
        return values

    def _io_completed(self, pairs: int, count: int) -> None:
        """Hand the ``count`` I/O completion keys that follow ``pairs``
        pairs in the buffer to :attr:`io_completion_handler`."""
        handler = self.io_completion_handler
        if handler is None:
            raise RuntimeError(
                f"the port dequeued {count} overlapped I/O completion(s) "
                "but nothing handles them (NotifySelector.io_completion_handler "
                "is None: a handle was associated with the port behind the "
                "loop's back)")
        start = _WORDS_PER_PAIR * pairs
        handler(self._out[start:start + count].tolist())

    def select(self, timeout: float | None = None) -> list[tuple[SelectorKey, int]]:
        """Reconcile the registrations, wait, return ready keys.

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
        had_token = True
        try:
            had_token = self._token.get("owner") == me
            if not had_token and not self._take_token(me):
                raise RuntimeError("select() is already running in another thread")
            values = self._wait(wait, deadline)
            keys = self._keys
            # Looked up before the token goes back: another thread's
            # register() may continue an unregistered registration's tag
            # once no select holds it. Masked with the key read now, as
            # EpollSelector does: the port limited the mask to the
            # registration's events at the wait, and a modify() in another
            # thread may have changed them since.
            return [(key, ready) for tag, mask in zip(values[::2], values[1::2])
                    if (key := keys.get(tag)) is not None and (ready := mask & key.events)]
        finally:
            if not had_token:
                self._give_token(me)

    def _wait(self, wait: float, deadline: float | None) -> list[int]:
        """select()'s waits (the token held): the pairs of the first answer
        that has any, or none once the time is up. A wait that ends with
        nothing before its time goes on for the time left when a signal
        cut it short and its Python handler did not raise (PEP 475, as the
        stdlib selectors do: the core returns so that the handler runs), or
        when changes came from another thread meanwhile (their wake-up
        ended it); not for a plain wake-up (WAKEUP_KEY)."""
        view = self._view
        while True:
            got = view.flush(wait) if view.pending else view.wait(view.port, wait)
            if got > 0:
                return self._answer(got)
            if got < 0:
                self._answer(got)          # raises, unless the wait was interrupted
            elif not view.pending:
                return []                  # the time is up, or a wake-up
            if wait == 0:
                return []
            if deadline is not None:
                left = deadline - _monotonic()
                if left <= 0:
                    return []
                wait = left * 1e3

    # -- life cycle ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the port and forget every registration. Idempotent."""
        with self._lock:
            self._records.clear()
            self._keys.clear()
            self._held.clear()
            self._dirty.clear()
            self._taken.clear()
            self._map = None
        self._port.close()

    def __repr__(self) -> str:
        state = "closed" if self._map is None else f"{len(self._records)} registered"
        return f"<{type(self).__name__} backend={self._port.backend} {state}>"
