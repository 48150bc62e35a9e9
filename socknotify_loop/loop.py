"""Loop: asyncio's selector event loop running on a :class:`NotifySelector`.

asyncio's ``SelectorEventLoop`` already takes its selector as an argument and
needs nothing from it beyond the :mod:`selectors` contract, so the loop is
the stock one with our selector plugged in. Subclassing it (rather than
writing a loop) keeps ``isinstance(loop, asyncio.SelectorEventLoop)`` true,
which libraries check before using ``add_reader``/``add_writer`` (aiodns,
psycopg, pyzmq), and keeps every transport, server and ``sock_*`` method
asyncio's own.

On Windows ``asyncio.SelectorEventLoop`` is ``_WindowsSelectorEventLoop``;
this subclasses it just the same. What Windows adds is Ctrl+C: the wait
happens inside the C core with the GIL released, and CPython runs Python
signal handlers only in the main thread between bytecodes, so a
KeyboardInterrupt would wait for the next event. ``run_forever`` therefore
points ``signal.set_wakeup_fd`` at the loop's self-pipe socket, as
asyncio's ProactorEventLoop does: the C-level handler writes a byte, the
port reports the self-pipe readable, ``select()`` returns and the handler
runs. On POSIX, asyncio already does this in ``add_signal_handler``.

Windows also gets what only ProactorEventLoop had: subprocesses, pipes and
named pipes, as overlapped I/O completing on the same port
(:mod:`socknotify_loop._windows_io`), and ``call_soon_threadsafe`` wakes
the loop with a packet posted to the port rather than a byte through the
self-pipe (which stays, for the signal wakeup fd).

The iteration. asyncio's ``_run_once`` asks the selector for a list of
``(key, mask)`` tuples and hands it to ``_process_events``, which looks the
reader and writer handles up again; it reads the clock after every wait.
:meth:`Loop._run_once` does the same work in one pass over the port's
answer: one cffi call writes ``(slot, mask)`` pairs into a buffer, and the
handles go straight from the registration's key to ``_ready``; the clock is
read only when a timer is scheduled. ``call_soon`` skips the debug-mode
bookkeeping when debug is off.

One wait fewer. asyncio polls the selector with a zero timeout in every
iteration that has callbacks ready. :meth:`Loop._run_once` skips that poll
in the iteration right after one that waited on the port: I/O that became
ready meanwhile is then taken up by the next iteration, exactly as if it
had arrived a moment later, which it always may (nothing orders readiness
against callbacks). At most every other iteration skips, so I/O is never
starved by callbacks that keep scheduling callbacks, and a stopping loop
always polls. On a ping-pong this halves the waits: two per round trip
instead of four. Both keep asyncio's semantics exactly: the
stock methods are the same in Python 3.9 to 3.13 (checked by
tests/test_loop.py against each version's source), and debug mode runs the
stock iteration. On other Python versions the stock methods are used.
"""
from __future__ import annotations

import asyncio
import contextvars
import heapq
import inspect
import signal
import sys
import threading
import warnings
from asyncio import base_events, events, format_helpers
from typing import Any, Callable, Optional

from .port import lib as _lib
from .selector import NotifySelector

_select = _lib.sn_port_select
_PAIRS = 0xFFFFFFFF
_Handle = events.Handle
_new_object = object.__new__
_copy_context = contextvars.copy_context
# Handles whose _run is asyncio's own, which the iteration runs inline;
# any other class (a subclass with its own _run) is run through _run().
_PLAIN_HANDLES = (events.Handle, events.TimerHandle)
_heappop = heapq.heappop
_MAXIMUM_SELECT_TIMEOUT = base_events.MAXIMUM_SELECT_TIMEOUT
_MIN_SCHEDULED_TIMER_HANDLES = base_events._MIN_SCHEDULED_TIMER_HANDLES
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION
_MAX_WAIT_MS = 0x7FFFFFFF

# The Python versions whose stock _run_once, _process_events, call_soon,
# _call_soon, Handle.__init__ and Handle._run this module's versions were
# checked against (tests/test_loop.py compares the sources). Elsewhere the
# stock methods run.
_FAST_PATH = (3, 9) <= sys.version_info[:2] <= (3, 13)


# Python 3.13 (and later 3.12 releases) format callbacks with a debug flag.
_FORMAT_TAKES_DEBUG = "debug" in inspect.signature(
    format_helpers._format_callback_source).parameters


def _callback_failed(handle: events.Handle, exc: BaseException) -> None:
    """What asyncio's Handle._run does when its callback raises."""
    if _FORMAT_TAKES_DEBUG:
        source = format_helpers._format_callback_source(
            handle._callback, handle._args, debug=handle._loop.get_debug())
    else:
        source = format_helpers._format_callback_source(handle._callback, handle._args)
    context = {"message": f"Exception in callback {source}", "exception": exc,
               "handle": handle}
    if handle._source_traceback:
        context["source_traceback"] = handle._source_traceback
    handle._loop.call_exception_handler(context)

if sys.platform == "win32":
    # Pipes, subprocesses and port wake-ups: overlapped I/O on the same port.
    from ._windows_io import OverlappedIOMixin
    _LOOP_BASES: tuple = (OverlappedIOMixin, asyncio.SelectorEventLoop)
else:
    _LOOP_BASES = (asyncio.SelectorEventLoop,)

__all__ = ["Loop"]


class Loop(*_LOOP_BASES):  # type: ignore[misc, valid-type]
    """An asyncio event loop on socket state notifications.

    A :class:`asyncio.SelectorEventLoop` whose selector is a
    :class:`~socknotify_loop.selector.NotifySelector`: every iteration applies
    its registration changes and re-arms, and waits, in one port call.
    ``selector`` may be given (e.g. ``NotifySelector(backend="afd")``);
    by default one is made on the best backend available.
    """

    if sys.platform != "win32":
        #: Called right after each wait on the port; the Windows loop's
        #: (OverlappedIOMixin._after_wait) completes overlapped I/O there.
        _after_wait: Optional[Callable[[], None]] = None

    #: Whether the last iteration waited on the port (the fast path skips
    #: the zero-timeout poll of the iteration after one that did).
    _polled = False

    def __init__(self, selector: Optional[NotifySelector] = None) -> None:
        if selector is None:
            try:
                selector = NotifySelector()
            except BaseException:
                # asyncio's __init__ never ran: without this, __del__ would
                # add "Exception ignored ... '_closed'" to the real error.
                self._closed = True
                raise
        elif not isinstance(selector, NotifySelector):
            raise TypeError(f"Loop needs a NotifySelector, not {type(selector).__name__}")
        super().__init__(selector)
        if sys.platform == "win32":
            self._start_overlapped_io()

    @property
    def backend(self) -> str:
        """The notification backend: ``'epoll'``, ``'psn'`` or ``'afd'``."""
        return self._selector.backend  # type: ignore[attr-defined]

    if _FAST_PATH:
        def call_soon(self, callback: Callable[..., Any], *args: Any,
                      context: Any = None) -> events.Handle:
            """Arrange for ``callback(*args)`` to be called soon (FIFO)."""
            if self._debug:
                # Thread and callback checks, source tracebacks.
                return super().call_soon(callback, *args, context=context)
            if self._closed:
                raise RuntimeError('Event loop is closed')
            # Handle.__init__ without its two call frames (itself and
            # loop.get_debug()): the same slots, the same values as with
            # debug off.
            handle = _new_object(_Handle)
            handle._context = _copy_context() if context is None else context
            handle._loop = self
            handle._callback = callback
            handle._args = args
            handle._cancelled = False
            handle._repr = None
            handle._source_traceback = None
            self._ready.append(handle)
            return handle

        def _run_once(self) -> None:
            """One iteration: run timers due, wait on the port, queue the
            ready handles, run what is ready (see the module docstring)."""
            if self._debug:
                return super()._run_once()  # type: ignore[misc]
            scheduled = self._scheduled
            sched_count = len(scheduled) if scheduled else 0
            if (sched_count > _MIN_SCHEDULED_TIMER_HANDLES and
                    self._timer_cancelled_count / sched_count >
                    _MIN_CANCELLED_TIMER_HANDLES_FRACTION):
                # Many cancelled timers: rebuild the heap without them.
                new_scheduled = []
                for handle in scheduled:
                    if handle._cancelled:
                        handle._scheduled = False
                    else:
                        new_scheduled.append(handle)
                heapq.heapify(new_scheduled)
                scheduled = self._scheduled = new_scheduled
                self._timer_cancelled_count = 0
            else:
                while scheduled and scheduled[0]._cancelled:
                    self._timer_cancelled_count -= 1
                    handle = _heappop(scheduled)
                    handle._scheduled = False

            ready = self._ready
            got = 0
            if ready and self._polled and not self._stopping:
                # The previous iteration polled the port; this one runs
                # what it queued without a zero-timeout poll (see the
                # module docstring: at most every other iteration).
                self._polled = False
            else:
                if ready or self._stopping:
                    wait_ms = 0
                elif scheduled:
                    timeout = scheduled[0]._when - self.time()
                    if timeout > _MAXIMUM_SELECT_TIMEOUT:
                        timeout = _MAXIMUM_SELECT_TIMEOUT
                    # Rounded up, as the selectors round: never wake early.
                    wait_ms = -int(-timeout * 1000.0 // 1) if timeout > 0 else 0
                else:
                    wait_ms = -1
                self._polled = True
                selector = self._selector
                got = _select(selector._handle, selector._pack() if selector._pending else 0,
                              wait_ms)
            if got > 0:
                if got == 1:
                    # The common case, read without slicing the buffer.
                    out = selector._out
                    pairs: Any = ((out[0], out[1]),)
                else:
                    if got > _PAIRS:
                        got = selector._io_completed(got)
                    values = iter(selector._out[:got << 1].tolist())
                    pairs = zip(values, values)
                keys = selector._keys
                for slot, mask in pairs:
                    key = keys[slot]
                    if key is None:
                        continue
                    reader, writer = key.data
                    if mask & 1 and reader is not None:
                        if reader._cancelled:
                            self._remove_reader(key.fileobj)
                        else:
                            ready.append(reader)
                    if mask & 2 and writer is not None:
                        if writer._cancelled:
                            self._remove_writer(key.fileobj)
                        else:
                            ready.append(writer)
            elif got < 0:
                self._selector._raise_for(got)
            if self._after_wait is not None:
                self._after_wait()

            # Timers that are due.
            if scheduled:
                end_time = self.time() + self._clock_resolution
                while scheduled:
                    handle = scheduled[0]
                    if handle._when >= end_time:
                        break
                    handle = _heappop(scheduled)
                    handle._scheduled = False
                    ready.append(handle)

            # Run what is ready now; callbacks queued by these run next
            # time. asyncio's Handle._run, inline: one call frame less per
            # callback.
            popleft = ready.popleft
            for _ in range(len(ready)):
                handle = popleft()
                if handle._cancelled:
                    continue
                if handle.__class__ in _PLAIN_HANDLES:
                    try:
                        handle._context.run(handle._callback, *handle._args)
                    except (SystemExit, KeyboardInterrupt):
                        raise
                    except BaseException as exc:
                        _callback_failed(handle, exc)
                else:
                    handle._run()
            handle = None  # break cycles when an exception occurs

    if sys.platform == "win32":
        def run_forever(self) -> None:
            """Run until stop(); Ctrl+C wakes the port through the self-pipe."""
            wakeup_set = False
            if (threading.current_thread() is threading.main_thread()
                    and getattr(self, "_csock", None) is not None):
                try:
                    previous = signal.set_wakeup_fd(self._csock.fileno())
                    wakeup_set = True
                except (ValueError, OSError):
                    # Another thread's loop or a non-main interpreter:
                    # signals cannot reach us anyway.
                    pass
            try:
                super().run_forever()
            finally:
                if wakeup_set:
                    signal.set_wakeup_fd(previous)


# -- the policy API, for programs that pick their loop through a policy --------
# (Python 3.9-3.13). socknotify_loop.__getattr__ serves these two names and
# warns on 3.14+, where asyncio deprecates policies.

def _default_policy_class() -> type:
    """asyncio's default policy class for this platform (child watchers on
    Unix), fetched without the DeprecationWarning Python 3.14 attaches to it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return asyncio.DefaultEventLoopPolicy


class EventLoopPolicy(_default_policy_class()):  # type: ignore[misc]
    """asyncio's default event loop policy, making :class:`Loop` loops.

    ``asyncio.set_event_loop_policy(EventLoopPolicy())`` makes
    ``asyncio.run``, ``asyncio.new_event_loop`` and ``get_event_loop`` use
    socknotify_loop on Python 3.9-3.13.
    """

    def new_event_loop(self) -> Loop:
        """A new :class:`Loop`."""
        return Loop()


def install() -> None:
    """Make :class:`EventLoopPolicy` asyncio's event loop policy."""
    with warnings.catch_warnings():
        # Ours has been emitted already where it applies (3.14+).
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(EventLoopPolicy())
