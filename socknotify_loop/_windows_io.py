"""The Windows loop: overlapped I/O (pipes, subprocesses) and wake-ups on
the notification port.

Why this module exists. On Windows, asyncio makes users choose:
``SelectorEventLoop`` has ``add_reader`` but no subprocesses or pipes;
``ProactorEventLoop`` has subprocesses and pipes (overlapped I/O on an I/O
completion port) but no ``add_reader``. Our port IS an I/O completion port,
and socket state notifications are just packets on it. So overlapped
operations can complete on the very same port, and one dequeue serves both.

What is here, and only here. :class:`WindowsLoop` is the portable
:class:`socknotify_loop.loop.Loop` plus what only Windows needs: a
:class:`PortProactor` on the loop's own port, the pipe and subprocess
methods of ``ProactorEventLoop``, wake-ups posted to the port, and Ctrl+C
reaching a wait that runs with the GIL released. ``socknotify_loop.Loop``
is this class on Windows (``socknotify_loop._factory.loop_class()`` picks
it). The
proactor and the loop that owns it live in one module because neither
makes sense without the other: the loop's ``close()`` must drain the
proactor before the port closes, and the proactor dequeues only through
the loop's selector.

How the two kinds of packet are told apart (see docs/design.md, "One port,
two kinds of completion"): pipe handles are associated with the port under
``IO_COMPLETION_KEY``, and ``RegisterWaitWithQueue`` (process exit) posts
under completion key 0; the C core turns both into ``(OVERLAPPED address,
EVENT_IO)`` notifications, while socket notifications carry kernel keys that
are never 0 nor ``IO_COMPLETION_KEY``. The selector hands the EVENT_IO ones
to its ``io_completion_handler``, which is :meth:`PortProactor.complete`:
the one function that finishes overlapped operations, whoever waited (the
loop's iteration, a ``select()`` in debug mode, or ``close()`` draining).

What is reused. Everything above the dequeue is asyncio's own:
``IocpProactor``'s operations (``recv``, ``recv_into``, ``send``,
``accept_pipe``, ``connect_pipe``, ``wait_for_handle``), its futures
(``_OverlappedFuture``, ``_WaitHandleFuture``), ``PipeServer``, the
subprocess transport and the proactor pipe transports, so pipes and
subprocesses behave exactly as on ``ProactorEventLoop``. What is ours: no
completion port of its own (``_iocp`` is the port's handle, which this
class never closes), the association key, and the dequeue.

Kernel-owned memory. An ``_overlapped.Overlapped`` object holds the
OVERLAPPED structure and the buffer the kernel writes into. From the moment
an operation is started until its completion packet has been dequeued, the
kernel owns that memory: the object must stay alive (``_cache`` holds it,
keyed by its address) even if its future is cancelled (``ov.cancel()`` only
asks; the aborted completion still arrives). :meth:`PortProactor.close`
therefore cancels everything and drains completions until ``_cache`` is
empty, BEFORE the loop closes the port. A proactor dropped without close()
parks its pending operations in ``_ABANDONED`` forever rather than free
memory the kernel may still write.
"""
from __future__ import annotations

import sys

# Windows only; the rest of the module is not even type-checked elsewhere.
assert sys.platform == "win32", "socknotify_loop._windows_io is Windows only"

import _overlapped  # no typeshed stub (pyproject.toml: ignore_missing_imports)
import signal
import socket
import threading
import time
import weakref
from asyncio import events, proactor_events, windows_events
from asyncio.log import logger
from typing import Any

from .loop import Loop
from .port import IO_COMPLETION_KEY
from .selector import WAKEUP_KEY, NotifySelector

__all__ = ["PortProactor", "WindowsLoop"]

# Pending operations of proactors garbage-collected without close(): the
# kernel may still write into them, so they are never freed.
_ABANDONED: list[dict[int, Any]] = []

# asyncio's ProactorEventLoop methods borrowed as they are (typed Any: their
# self is declared as ProactorEventLoop's).
_BaseProactorLoop: Any = proactor_events.BaseProactorEventLoop
_ProactorLoop: Any = windows_events.ProactorEventLoop
# asyncio's private future of a cancelled wait (not in typeshed).
_WaitCancelFuture: type = windows_events._WaitCancelFuture  # type: ignore[attr-defined]


class PortProactor(windows_events.IocpProactor):
    """asyncio's IocpProactor on a :class:`NotifySelector`'s port.

    Only handles (pipes, processes) take part: sockets are served by the
    selector's notifications, and a socket can belong to one port only
    once, so the socket operations of the base class are refused.
    Installs :meth:`complete` as the selector's ``io_completion_handler``.
    """

    # IocpProactor's private state, declared for type checkers only.
    _loop: events.AbstractEventLoop | None
    _results: list[Any]
    _iocp: int | None
    _cache: dict[int, Any]
    _registered: weakref.WeakSet[Any]
    _unregistered: list[Any]
    _stopped_serving: weakref.WeakSet[Any]

    def __init__(self, selector: NotifySelector) -> None:
        # Not IocpProactor.__init__: it would create a completion port.
        self._loop = None
        self._results = []
        self._selector = selector
        self._iocp = selector.port.os_handle
        self._cache = {}
        self._registered = weakref.WeakSet()
        self._unregistered = []
        self._stopped_serving = weakref.WeakSet()
        selector.io_completion_handler = self.complete

    def _register_with_iocp(self, obj: Any) -> None:
        # Associate a handle with the port, under the key the C core reports
        # as EVENT_IO. Once per handle, as in IocpProactor.
        if obj not in self._registered:
            if isinstance(obj, socket.socket):
                raise TypeError("socknotify_loop serves sockets with notifications, "
                                "not overlapped I/O (use the loop's sock_* methods)")
            self._registered.add(obj)
            _overlapped.CreateIoCompletionPort(obj.fileno(), self._iocp, IO_COMPLETION_KEY, 0)

    def complete(self, addresses: list[int]) -> None:
        """Finish the operations whose completion packets were dequeued:
        ``addresses`` are their OVERLAPPED addresses. Futures get their
        results (their callbacks are scheduled, to run this iteration)."""
        cache = self._cache
        for address in addresses:
            try:
                f, ov, obj, callback = cache.pop(address)
            except KeyError:
                # Unregistered meanwhile (a wait-handle future whose wait was
                # cancelled), or not ours at all.
                if self._loop is not None and self._loop.get_debug():
                    self._loop.call_exception_handler({
                        "message": "the port returned an unexpected I/O completion",
                        "status": f"address={address:#x}",
                    })
                continue
            # The packet is dequeued: the kernel is done with ov's memory.
            if obj in self._stopped_serving:
                f.cancel()
            elif not f.done():
                # Not read already by _register(), not cancelled: its result
                # (ov.getresult(), errors mapped as IocpProactor does).
                try:
                    value = callback(None, None, ov)
                except OSError as exc:
                    f.set_exception(exc)
                else:
                    f.set_result(value)
            f = ov = obj = callback = None

    def take_unregistered(self) -> list[Any]:
        """The operations unregistered (their futures cancelled) since the
        last call, for :meth:`forget` once the next wait has dequeued any
        packet already queued for them (IocpProactor's order)."""
        unregistered = self._unregistered
        if unregistered:
            self._unregistered = []
        return unregistered

    def forget(self, unregistered: list[Any]) -> None:
        """Drop unregistered operations from the cache (no memory of theirs
        is in kernel hands any more)."""
        cache = self._cache
        for ov in unregistered:
            cache.pop(ov.address, None)

    def _poll(self, timeout: float | None = None) -> None:
        # Only close() and select() of the base class come here: wait on the
        # port; the selector hands the completions to complete(). Socket
        # readiness seen meanwhile stays armed for the next select, which
        # reports it again: level-triggered.
        self._selector.select(timeout)
        self.forget(self.take_unregistered())

    @property
    def pending(self) -> int:
        """Operations whose completion has not been dequeued yet."""
        return len(self._cache)

    def close(self) -> None:
        """Cancel every operation and wait for all their completions (the
        kernel owns their memory until then). Leaves the port open."""
        if self._iocp is None:
            return
        for fut, _ov, _obj, _callback in list(self._cache.values()):
            if fut.cancelled() or isinstance(fut, _WaitCancelFuture):
                continue
            try:
                fut.cancel()
            except OSError as exc:
                if self._loop is not None:
                    self._loop.call_exception_handler({
                        "message": "Cancelling a future failed",
                        "exception": exc,
                        "future": fut,
                    })
        start = time.monotonic()
        next_message = start + 1.0
        while self._cache:
            if next_message <= time.monotonic():
                logger.debug("%r is running after closing for %.1f seconds",
                             self, time.monotonic() - start)
                next_message = time.monotonic() + 1.0
            self._poll(1.0)
        self._results = []
        self._iocp = None   # the port's, closed by the selector
        self._selector.io_completion_handler = None

    def __del__(self) -> None:
        if getattr(self, "_iocp", None) is not None and self._cache:
            _ABANDONED.append(self._cache)
            self._cache = {}
            self._iocp = None


def _restore_wakeup_fd(previous: int | None) -> None:
    """Point the signal wakeup descriptor back where it was before a run
    set it: ``previous``, or nowhere when that is unknown (a cut between
    the setting and the reading of its answer) or no longer a socket (a
    run cut before it could restore its own left it to a self-pipe since
    closed, which Windows' set_wakeup_fd refuses)."""
    try:
        signal.set_wakeup_fd(-1 if previous is None else previous)
    except (ValueError, OSError):
        signal.set_wakeup_fd(-1)


class WindowsLoop(Loop):
    """:class:`socknotify_loop.loop.Loop` with what ``ProactorEventLoop``
    adds for pipes and subprocesses, on the loop's own port:
    ``subprocess_exec``/``subprocess_shell``, ``connect_read_pipe``,
    ``connect_write_pipe``, ``start_serving_pipe`` and
    ``create_pipe_connection``, beside ``add_reader``/``add_writer``.

    The transports and the named-pipe server are asyncio's (borrowed from
    ProactorEventLoop); ``call_soon_threadsafe`` wakes the loop with a
    packet posted to the port instead of a byte through the self-pipe,
    which stays for Ctrl+C (see :meth:`run_forever`).
    """

    _proactor: PortProactor | None = None
    # A wake-up packet is on its way: more call_soon_threadsafe calls before
    # the loop's next iteration need none (one packet per call would leave
    # the port thousands of packets to dequeue after a burst).
    _wakeup_posted = False
    _csock: socket.socket | None

    def __init__(self, selector: NotifySelector | None = None, *,
                 transports: str | None = None) -> None:
        super().__init__(selector, transports=transports)
        proactor = PortProactor(self._selector)
        proactor.set_loop(self)
        self._proactor = proactor

    # asyncio's own methods, unchanged: they only call self._proactor.
    _make_duplex_pipe_transport = _BaseProactorLoop._make_duplex_pipe_transport
    _make_read_pipe_transport = _BaseProactorLoop._make_read_pipe_transport
    _make_write_pipe_transport = _BaseProactorLoop._make_write_pipe_transport
    _make_subprocess_transport = _ProactorLoop._make_subprocess_transport
    create_pipe_connection = _ProactorLoop.create_pipe_connection
    start_serving_pipe = _ProactorLoop.start_serving_pipe

    def _run_once(self) -> None:
        """One iteration of the portable loop (which calls no hook: Linux
        pays nothing for this), with the port's per-wait bookkeeping
        around it. Overlapped completions need none here: the selector
        hands them to the proactor during the wait's answer."""
        # Wake-ups: from here on, a callback queued by another thread needs
        # a new packet. One queued while the flag was still set went to
        # _ready before that thread read the flag, so this iteration's
        # check of _ready (after this line, before any wait) sees it.
        self._wakeup_posted = False
        proactor = self._proactor
        if proactor is None or not proactor._unregistered:
            super()._run_once()
            return
        # Operations unregistered before this wait are forgotten after it:
        # a packet of theirs already queued is then dequeued and ignored,
        # not reported as unexpected (IocpProactor's order).
        unregistered = proactor.take_unregistered()
        try:
            super()._run_once()
        finally:
            proactor.forget(unregistered)

    def _write_to_self(self) -> None:
        # May run in any thread, even while or after the loop closes.
        selector = self._selector
        if selector is None or self._wakeup_posted:
            return
        self._wakeup_posted = True
        try:
            selector.port.post(WAKEUP_KEY)
        except (OSError, ValueError):
            # The port is closed: nobody is waiting on it any more.
            pass

    def run_forever(self) -> None:
        """Run until stop(); Ctrl+C wakes the port through the self-pipe.

        The wait happens inside the C core with the GIL released, and
        CPython runs Python signal handlers only in the main thread between
        bytecodes, so a KeyboardInterrupt would wait for the next event.
        ``signal.set_wakeup_fd`` (which needs a socket on Windows) points at
        the self-pipe, as ProactorEventLoop does: the C-level handler writes
        a byte, the port reports the self-pipe readable, the wait returns
        and the handler runs.
        """
        ours = -1
        if (threading.current_thread() is threading.main_thread()
                and getattr(self, "_csock", None) is not None):
            ours = self._csock.fileno()  # type: ignore[union-attr]
        # Set inside the try: an exception a signal handler raises right
        # after the setting (Ctrl+C) still reaches the restoring finally.
        previous: int | None = None
        try:
            if ours != -1:
                try:
                    previous = signal.set_wakeup_fd(ours)
                except (ValueError, OSError):
                    # Another thread's loop or a non-main interpreter:
                    # signals cannot reach us anyway.
                    ours = -1
            super().run_forever()
        finally:
            if ours != -1:
                _restore_wakeup_fd(previous)

    def close(self) -> None:
        """Close the loop: first every overlapped operation is cancelled
        and its completion dequeued (so no kernel write outlives the port),
        then the selector and its port."""
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        # The proactor's close drains the port through select(), which
        # takes the select token for each call: the loop is not running.
        proactor, self._proactor = self._proactor, None
        if proactor is not None:
            proactor.close()
        super().close()
