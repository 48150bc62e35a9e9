"""NotifySelector: a :mod:`selectors` selector on one notification port.

Per descriptor the selector keeps what the user *wants* (the
:class:`selectors.SelectorKey` and the registration's tag) and what the
port *holds*, and a *dirty* set of the descriptors where the two may
differ. ``register``, ``modify`` and ``unregister`` mark the descriptor
and change what is wanted; right before a wait, whoever holds the select
token swaps the dirty set out and turns each descriptor into at most one
change computed from the two states (``_flush``). Nothing is replayed
from a log: a change cut short by an exception (a signal handler's,
KeyboardInterrupt) leaves its descriptor marked, and the next reconcile
recomputes it, as wepoll (``sock_update``), mio (``update_queue``) and
trio (``_refresh_afd``) keep a socket's registration.

On the completion-port backends the changes ride in the one call that
waits (``ProcessSocketNotifications`` applies, then dequeues), and what
the port holds is written down once that call took them; a change from a
thread that does not hold the select token wakes the waiting thread,
which reconciles and waits again. On epoll every change is a system call
of its own wherever it is made, so it is applied at once, reported where
``selectors.EpollSelector`` reports it, and reaches a waiting
``epoll_wait`` there. The C core re-arms the one-shot registrations it
delivered inside the call that waits. The port answers with ``(tag,
mask)`` pairs, a tag naming one registration for good, so an answer
reaches the registration it was made for or none. docs/design.md ("A
registration's life") has the whole story and a drawing of what each
layer owns.
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
#: would (a posted packet travels under a reserved completion key of the
#: port's, ``_core/sn_keys.h``); this one is kept for wake-ups.
WAKEUP_KEY = 0

#: What :attr:`NotifySelector.io_completion_handler` is called with: the
#: OVERLAPPED addresses of the overlapped I/O completions one wait dequeued.
IOCompletionHandler = Callable[[list[int]], None]

# Port event filter for each selector mask. HANGUP goes with READ (a
# reader meets EOF), not with WRITE alone (a peer's half-close does not
# make a full send buffer writable). Only these two bits are watched;
# none watched: the registration is disabled.
_FILTER_OF_MASK = {
    EVENT_READ: EVENT_IN | EVENT_HANGUP,
    EVENT_WRITE: EVENT_OUT,
    EVENT_READ | EVENT_WRITE: EVENT_IN | EVENT_HANGUP | EVENT_OUT,
}
_WATCHED = EVENT_READ | EVENT_WRITE

# The largest descriptor epoll takes: a C int.
_MAX_EPOLL_FD = 0x7FFFFFFF

# The select call's answer (Port.select_function): minus an error code;
# or one pair in the value itself when its ONE_PAIR bits (the mask) are
# not 0, its tag above TAG_SHIFT; or, above TAG_SHIFT, the number of pairs
# in the bound buffer (low 32 bits) and of I/O keys after them (above).
#: The bits of a one-pair answer that hold its mask.
ONE_PAIR = 3
#: How far a one-pair answer's tag (or another answer's counts) is shifted.
TAG_SHIFT = 2
_PAIRS = 0xFFFFFFFF
_IO_SHIFT = 32
_WORDS_PER_PAIR = 2     # (tag, selector mask), each a uint64


class LoopView:
    """What a loop's iteration reads of its :class:`NotifySelector`
    (``selector.loop_view``, one object for the selector's life), to make
    the port's call itself and read the answer in place. The loop assigns
    none of it; ``flush`` and ``answer`` change the selector's state as a
    select does. An iteration, between :meth:`NotifySelector.begin_run`
    and :meth:`NotifySelector.end_run`::

        got = view.flush(ms) if view.pending else view.wait(view.port, ms)
        if got > 0 and got & ONE_PAIR:       # one pair, in the value itself
            key = view.keys.get(got >> TAG_SHIFT)   # None: unregistered since
        elif got:
            values = view.answer(got)        # [tag, mask, tag, mask, ...]

    ``poll(port)``, ``block(port)`` and ``wait(port, ms)`` wait without
    changes (0, for ever, ``ms`` milliseconds: a float the core rounds up);
    ``pending`` is true when a registration may differ from what the port
    holds, and ``flush(ms)`` then reconciles and waits in one call.
    ``answer(got)`` decodes any other answer: I/O completions to their
    handler, an exception for an error (nothing for an interrupted wait).
    ``keys`` maps a tag to its key (read only); ``key(fd)`` is ``fd``'s
    key or None, for the loop's add and remove of readers and writers."""

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


# A named tuple made without namedtuple's Python-level __new__ (a frame):
# asyncio's sock_recv and sock_sendall add and remove a reader per call.
_new_record = tuple.__new__

#: What the port holds of a descriptor (completion-port backends): the
#: registration's tag and the events it watches (0: disabled), or -1 for
#: events it must be sent again (a registration continued under its tag).
_Held = tuple[int, int]
_RESEND = -1

#: Not a descriptor: in the dirty set, a reconcile not yet written down
#: (its changes to be computed again).
_UNSETTLED = -1

_Change = tuple[int, int, int, int, int]    # port.Change's five numbers


def _watching(fd: int, tag: int, watched: int) -> _Change:
    """The change that makes registration ``tag`` of ``fd`` watch the
    selector mask ``watched``: an ENABLE of its filter, one-shot and
    level-triggered, or a DISABLE for none (register() builds its ENABLE
    inline: it is on asyncio's hot path)."""
    if watched:
        return (fd, tag, _FILTER_OF_MASK[watched], OP_ENABLE, _ONESHOT_LEVEL)
    return (fd, tag, 0, OP_DISABLE, 0)


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
        """``fileobj``'s key, or ``default``: without Mapping.get's KeyError
        per miss (asyncio 3.14+ asks on every add/remove of a reader)."""
        record = self._selector._records.get(self._selector._fileobj_lookup(fileobj))
        return default if record is None else record.key

    def __iter__(self) -> Iterator[int]:
        return iter(self._selector._records)



class NotifySelector(selectors.BaseSelector):
    """A selector on one notification :class:`~socknotify_loop.port.Port`.

    Same contract as the stdlib selectors (``select()`` returns
    ``[(key, mask & key.events)]``; ``None`` blocks, ``<= 0`` polls, a
    positive timeout is rounded up to milliseconds; ERR wakes both
    directions; unregistering a closed socket does not raise). On epoll
    every change is applied at once (errors raise where ``EpollSelector``
    raises them). On the completion-port backends the port hears at the
    next :meth:`select` of what differs then (a register and a modify are
    one ENABLE, a register and an unregister nothing); a descriptor that is
    not an open socket is still refused at :meth:`register`.

    ``backend`` chooses the port's backend (see :class:`Port`); ``None``
    takes ``SOCKNOTIFY_BACKEND`` or the best one available. One thread at a
    time may be in :meth:`select` (a second raises RuntimeError); while a
    loop runs on the selector, only the loop's thread.
    """

    def __init__(self, backend: str | None = None) -> None:
        self._port = port = Port(backend)
        self._at_once = port.changes_at_once
        self._change_now = port.change_function()
        self._select_now = port.select_function()
        self._port_address = port.address
        # Wanted: fd -> (key, tag), and tag -> key for the answer (a tag
        # never names another registration; 0 is never one).
        self._records: dict[int, _Record] = {}
        self._keys: dict[int, SelectorKey] = {}
        self._next_tag = 1
        # Held: fd -> (tag, events watched), on the completion-port
        # backends; on epoll the port holds what is wanted once a change
        # returned.
        self._held: dict[int, _Held] = {}
        # Dirty: marked by a change before it writes anything. It trades
        # places with the taken set at each reconcile, so that a signal
        # handler's change lands in the set not being read; the taken set
        # is emptied once what the port holds is written down, and one
        # left full (a cut, a select that failed as a whole) is taken again.
        self._dirty: set[int] = set()
        self._taken: set[int] = set()
        # A wake-up is on its way to the select token's holder since its
        # last reconcile (completion-port backends): one is enough.
        self._woken = False
        # Reentrant: a signal handler runs in the thread it interrupts and
        # may change a registration (pause, close a transport) while that
        # thread is inside a change; a plain lock would block it on itself.
        self._lock = threading.RLock()
        # The select token: {"owner": ident}. Taken by one setdefault, so
        # that a signal handler's exception cannot land between the claim
        # and the owner's name (see _take_token, _give_token).
        self._token: dict[str, int] = {}
        self._claimed = False    # a loop runs on this selector
        self._map: _SelectorMapping | None = _SelectorMapping(self)
        #: Called with the keys (OVERLAPPED addresses) of the overlapped I/O
        #: completions a wait dequeued (Windows): the Windows loop's
        #: proactor installs it. ``None``: a completion arriving anyway
        #: makes the select raise RuntimeError (its owner would wait for ever).
        self.io_completion_handler: IOCompletionHandler | None = None
        # Answers whose I/O completions went to that handler: select() asks
        # whether an answer had any without decoding it a second time.
        self._io_answers = 0
        self._room = 0
        self._changes_room = 0
        #: What a loop's iteration reads (see :class:`LoopView`).
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
        """Bind buffers for ``room`` ready registrations and
        ``changes_room`` changes (the select token held, or ``__init__``).
        False if a select runs in another thread (the old ones stay)."""
        bound = self._port.bind_select_buffers(room + changes_room, changes_room)
        if bound is None:
            return False
        self._out, self._changes_room = bound
        self._room = room
        return True

    def _grow(self) -> None:
        """Room for every registration to be ready at once (the select
        token held): after a register(), or an answer that filled the
        buffer (a register() while another thread held the token could not
        bind it)."""
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
        """Take the select token for a loop's run in this thread (after
        asyncio's own checks): until :meth:`end_run` this thread alone
        selects. RuntimeError if another thread selects."""
        if not self._take_token(_get_ident()):
            raise RuntimeError("select() is already running in another thread")

    def end_run(self) -> None:
        """Give back the token :meth:`begin_run` took, if this thread holds
        it (the loop's ``finally`` also covers a begin_run() refused or cut
        short)."""
        self._give_token(_get_ident())

    def _take_token(self, me: int) -> bool:
        """Take the token for thread ``me``, or find it already ``me``'s;
        False if another thread holds it."""
        return self._token.setdefault("owner", me) == me

    def _give_token(self, me: int) -> None:
        """Give the token back if thread ``me`` holds it (no other thread
        can take it meanwhile: no lock needed)."""
        if self._token.get("owner") == me:
            del self._token["owner"]

    def _no_select_elsewhere(self) -> bool:
        """No other thread is inside a select: the token is free, or this
        thread holds it (and is not selecting, since it is here)."""
        me = _get_ident()
        return self._token.get("owner", me) == me

    def _wake_the_selecting_thread(self) -> None:
        """The end of a change on the completion-port backends (``_lock``
        held, the descriptor marked): another thread holding the select
        token may be waiting, blind to the change; a posted packet ends
        its wait, and it reconciles and waits again. One packet until its
        next reconcile, which comes before its next wait (the flag is set
        with the mark it answers for; a reconcile clears both). A thread
        that takes the token after this look reconciles after the mark."""
        owner = self._token.get("owner")
        if owner is None or owner == _get_ident() or self._woken:
            return
        self._woken = True
        try:
            self._port.post_quiet_wakeup()
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
            return fileobj    # fileno_of's answer, without its call
        try:
            # As selectors validate: any number that is not negative.
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
        """Register ``fileobj`` for ``events``: ValueError for invalid
        events or file object, KeyError if registered, OverflowError for a
        descriptor epoll cannot take (above a C int, as EpollSelector),
        OSError for one the port refuses (epoll: what ``epoll_ctl`` says,
        PermissionError for a regular file; elsewhere: not an open socket).
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
            # Marked first: a cut anywhere after it leaves the next
            # reconcile to make the port agree with what is recorded here.
            self._dirty.add(fd)
            if at_once:
                tag = self._next_tag
                self._next_tag = tag + 1
            else:
                tag = self._tag_for(fd)
            key = SelectorKey(fileobj, fd, events, data)
            # Recorded before the port hears of it: a select in another
            # thread may report the epoll item as soon as it is made.
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
        """A new registration's tag (``_lock`` held): a new one, or on the
        completion-port backends the tag of the registration the port
        still holds for ``fd`` (unregistered since the last select, as
        asyncio's sock_recv does), which it continues with its events sent
        again: Windows keeps a socket's first completion key until the
        REMOVE event, so a new tag would make the port REMOVE and hold the
        ENABLE back for that event. Not while another thread selects: an
        answer in flight may name the tag."""
        held = self._held.get(fd)
        if held is not None and self._no_select_elsewhere():
            self._held[fd] = (held[0], _RESEND)
            return held[0]
        tag = self._next_tag
        self._next_tag = tag + 1
        return tag

    def _grow_now(self) -> None:
        """Room for every registration in the answer buffer, after a
        register(), if no select or run holds the token (the loop grows it
        when an answer fills it)."""
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

        Never fails for a socket closed meanwhile, nor in a forked child
        (the port's refusal to remove it is ignored, as by the stdlib
        selectors). On epoll the item leaves the kernel now, while the
        descriptor is still open: asyncio closes a socket right after
        removing its reader, and a removal after the close could not reach
        an item whose file lives on in a dup() or a forked child.
        """
        with self._lock:
            fd = self._fileobj_lookup(fileobj)
            try:
                key, tag = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            self._dirty.add(fd)
            if self._at_once:
                # Before Python forgets it: a cut between leaves a
                # registration Python has, which the reconcile enables.
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

        As with EpollSelector, any events value is accepted (the READ and
        WRITE bits are watched; the key keeps the value given). Only a
        change of the watched bits reaches the port; one the port refuses
        (epoll) unregisters the file object and raises.
        """
        with self._lock:
            try:
                fd = self._fileobj_lookup(fileobj)
                key, tag = self._records[fd]
            except KeyError:
                raise KeyError(f"{fileobj!r} is not registered") from None
            if events == key.events and data == key.data:
                return key
            changed = (events ^ key.events) & _WATCHED
            key = key._replace(events=events, data=data)
            if changed:
                self._dirty.add(fd)
            self._records[fd] = _new_record(_Record, (key, tag))
            self._keys[tag] = key
            if not changed:
                return key
            if not self._at_once:
                self._wake_the_selecting_thread()
                return key
            code = self._change_now(self._port_address, *_watching(fd, tag, events & _WATCHED))
            if code:
                # What EpollSelector does: a refused modify unregisters.
                self.unregister(fileobj)
                raise self._port.change_error(code)
            self._dirty.discard(fd)
        return key

    # -- reconciling: what the port holds -------------------------------------------------

    def _change_for(self, fd: int) -> tuple[_Change | None, _Held | None]:
        """The one change that makes the port hold what is wanted of
        ``fd`` (None if it does), and what the port holds once it is made
        (None: nothing). Completion-port backends, ``_lock`` held."""
        held = self._held.get(fd)
        record = self._records.get(fd)
        if record is None:
            # A REMOVE names its tag: the port ignores it for another.
            return (None if held is None else (fd, held[0], 0, OP_REMOVE, 0)), None
        key, tag = record
        watched = key.events & _WATCHED
        if held is not None and held[0] == tag and held[1] == watched:
            return None, held
        if not watched and (held is None or held[0] != tag):
            # Nothing to watch: the port holds nothing of it, or must not.
            return (None if held is None else (fd, held[0], 0, OP_REMOVE, 0)), None
        # A new registration, other events, or one the port holds under
        # another tag (the port re-keys it): one ENABLE, or a DISABLE.
        return _watching(fd, tag, watched), (tag, watched)

    def _flush(self, ms: float) -> int:
        """Reconcile, then wait up to ``ms`` milliseconds: the general
        select call (the select token held); returns its answer.

        The dirty set trades places with the taken one first, so that a
        signal handler's change made meanwhile waits for the next
        reconcile. On the completion-port backends each descriptor taken
        becomes at most one change of the call's batch, and what the port
        holds is written down once the call took them (one that failed as
        a whole applied none: they stay taken). On epoll those a cut left
        marked get what is wanted of them, at once."""
        with self._lock:
            taken = self._taken
            self._dirty |= taken     # what a reconcile cut short left taken
            taken.clear()
            # Marked until this reconcile is written down: one cut short
            # or failed leaves the dirty set showing a reconcile to make.
            taken.add(_UNSETTLED)
            self._woken = False
            # One step: the sets trade places (no call between the stores).
            self._taken, self._dirty, self._view.pending = self._dirty, taken, taken
            sent: list[tuple[int, _Held | None]] = []
            if self._at_once:
                self._enable_taken()
            else:
                sent = self._pack_taken()
            if not sent:
                self._settled()
        got: int = self._select_now(self._port_address, len(sent), ms)
        if got >= 0 and sent:
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
        """The taken descriptors' changes into the bound buffer (``_lock``
        and the token held); per change, its descriptor and what the port
        holds once it is made."""
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
        ENABLE (or DISABLE) again, at once (one Python no longer has was
        removed before Python forgot it). One the port refuses ends in
        Python too, as a refused register() would."""
        for fd in self._taken:
            record = self._records.get(fd)
            if record is None:
                continue
            key, tag = record
            code = self._change_now(self._port_address,
                                    *_watching(fd, tag, key.events & _WATCHED))
            if code and self._records.get(fd) is record:
                del self._records[fd]
                self._keys.pop(tag, None)

    # -- the answer ---------------------------------------------------------------------

    def _answer(self, got: int) -> list[int]:
        """The select call's answer as ``[tag, mask, tag, mask, ...]``: its
        one decoder. I/O completion keys go to
        :attr:`io_completion_handler`; an answer that filled the buffer
        grows it (the select token held); an error raises; an interrupted
        wait is no pairs (its signal handler runs when Python resumes)."""
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
        self._io_answers += 1
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
        # Held already by this thread's loop (debug mode selects through
        # here); assumed until known, so that a cut gives nothing back.
        had_token = True
        try:
            had_token = self._token.get("owner") == me
            if not had_token and not self._take_token(me):
                raise RuntimeError("select() is already running in another thread")
            return self._wait(wait, deadline)
        finally:
            if not had_token:
                self._give_token(me)

    def _wait(self, wait: float, deadline: float | None) -> list[tuple[SelectorKey, int]]:
        """select()'s waits (the token held): the ready keys of the first
        answer that has any, or none once the time is up. A wait that ends
        with nothing to report before its time goes on for the time left:
        when its pairs all named registrations changed since their events
        were queued (another thread's unregister() or modify(), which
        EpollSelector's waiting call never reports), when a signal
        cut it short and its Python handler did not raise (PEP 475, as the
        stdlib selectors do: the core returns so that the handler runs), or
        when the selector's own wake-up ended it (changes came from another
        thread meanwhile: the next wait takes them); not for a packet of
        ``port.post()`` (WAKEUP_KEY), even one dequeued with that wake-up."""
        view = self._view
        while True:
            got = view.flush(wait) if view.pending else view.wait(view.port, wait)
            if got > 0:
                io_answers = self._io_answers
                ready = self._ready(self._answer(got))
                if ready or self._io_answers != io_answers:
                    # Ready keys, or I/O completions handed to their
                    # handler: the caller's loop runs what they scheduled.
                    return ready
            elif got < 0:
                self._answer(got)          # raises, unless the wait was interrupted
            if got >= 0 and self._port.select_was_posted():
                return []                  # a caller's wake-up
            if wait == 0:
                return []
            if deadline is not None:
                left = deadline - _monotonic()
                if left <= 0:
                    return []
                wait = left * 1e3

    def _ready(self, values: list[int]) -> list[tuple[SelectorKey, int]]:
        """The answer's pairs as ready keys (the token held). Looked up
        before the token goes back (then another thread's register() may
        continue a tag); masked with the key read now, as EpollSelector
        does (a modify() may have come since)."""
        keys = self._keys
        return [(key, ready) for tag, mask in zip(values[::2], values[1::2])
                if (key := keys.get(tag)) is not None and (ready := mask & key.events)]

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
