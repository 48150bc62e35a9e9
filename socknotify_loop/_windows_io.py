"""Overlapped I/O on the notification port: pipes, subprocesses, wake-ups.

Why this module exists. On Windows, asyncio makes users choose:
``SelectorEventLoop`` has ``add_reader`` but no subprocesses or pipes;
``ProactorEventLoop`` has subprocesses and pipes (overlapped I/O on an I/O
completion port) but no ``add_reader``. Our port IS an I/O completion port,
and socket state notifications are just packets on it. So overlapped
operations can complete on the very same port, and one dequeue serves both.

How the two kinds of packet are told apart (see docs/design.md, "One port,
two kinds of completion"): pipe handles are associated with the port under
``IO_COMPLETION_KEY``, and ``RegisterWaitWithQueue`` (process exit) posts
under completion key 0; the C core turns both into ``(OVERLAPPED address,
EVENT_IO)`` notifications, while socket notifications carry kernel keys that
are never 0 nor ``IO_COMPLETION_KEY``. :class:`~socknotify_loop.selector.
NotifySelector` sets the EVENT_IO ones aside in ``io_completions``; the
loop hands them to :meth:`PortProactor.complete` every iteration.

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

import socket
import time
import weakref
from asyncio import proactor_events, windows_events
from asyncio.log import logger

import _overlapped

from .port import IO_COMPLETION_KEY
from .selector import WAKEUP_KEY

__all__ = ["PortProactor", "OverlappedIOMixin"]

# Pending operations of proactors garbage-collected without close(): the
# kernel may still write into them, so they are never freed.
_ABANDONED: list = []


class PortProactor(windows_events.IocpProactor):
    """asyncio's IocpProactor on a :class:`NotifySelector`'s port.

    Only handles (pipes, processes) take part: sockets are served by the
    selector's notifications, and a socket can belong to one port only
    once, so the socket operations of the base class are refused.
    """

    def __init__(self, selector) -> None:
        # Not IocpProactor.__init__: it would create a completion port.
        self._loop = None
        self._results = []
        self._selector = selector
        self._iocp = selector.port.os_handle
        self._cache = {}
        self._registered = weakref.WeakSet()
        self._unregistered = []
        self._stopped_serving = weakref.WeakSet()

    def _register_with_iocp(self, obj) -> None:
        # Associate a handle with the port, under the key the C core reports
        # as EVENT_IO. Once per handle, as in IocpProactor.
        if obj not in self._registered:
            if isinstance(obj, socket.socket):
                raise TypeError("socknotify_loop serves sockets with notifications, "
                                "not overlapped I/O (use the loop's sock_* methods)")
            self._registered.add(obj)
            _overlapped.CreateIoCompletionPort(obj.fileno(), self._iocp, IO_COMPLETION_KEY, 0)

    def complete(self, addresses) -> None:
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
        self.forget_unregistered()

    def forget_unregistered(self) -> None:
        """Drop the operations unregistered since the last iteration (their
        futures were cancelled; no memory of theirs is in kernel hands)."""
        if self._unregistered:
            for ov in self._unregistered:
                self._cache.pop(ov.address, None)
            self._unregistered.clear()

    def _poll(self, timeout=None) -> None:
        # Only close() and select() of the base class come here: wait on the
        # port (socket readiness seen meanwhile stays armed for the next
        # select, which reports it again: level-triggered).
        selector = self._selector
        selector.select(timeout)
        addresses = selector.io_completions[:]
        selector.io_completions.clear()
        self.complete(addresses)

    @property
    def pending(self) -> int:
        """Operations whose completion has not been dequeued yet."""
        return len(self._cache)

    def close(self) -> None:
        """Cancel every operation and wait for all their completions (the
        kernel owns their memory until then). Leaves the port open."""
        if self._iocp is None:
            return
        for fut, ov, obj, callback in list(self._cache.values()):
            if fut.cancelled() or isinstance(fut, windows_events._WaitCancelFuture):
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

    def __del__(self) -> None:
        if getattr(self, "_iocp", None) is not None and self._cache:
            _ABANDONED.append(self._cache)
            self._cache = {}
            self._iocp = None


class OverlappedIOMixin:
    """What ``ProactorEventLoop`` adds for pipes and subprocesses, on the
    loop's own port; mixed into the Windows :class:`~socknotify_loop.Loop`.

    The transports and the named-pipe server are asyncio's (borrowed from
    ProactorEventLoop); ``call_soon_threadsafe`` wakes the loop with a
    packet posted to the port instead of a byte through the self-pipe.
    """

    _proactor = None
    # A wake-up packet is on its way: more call_soon_threadsafe calls before
    # the loop's next iteration need none (one packet per call would leave
    # the port thousands of packets to dequeue after a burst).
    _wakeup_posted = False

    def _start_overlapped_io(self) -> None:
        self._proactor = PortProactor(self._selector)
        self._proactor.set_loop(self)

    # asyncio's own methods, unchanged: they only call self._proactor.
    _make_duplex_pipe_transport = proactor_events.BaseProactorEventLoop._make_duplex_pipe_transport
    _make_read_pipe_transport = proactor_events.BaseProactorEventLoop._make_read_pipe_transport
    _make_write_pipe_transport = proactor_events.BaseProactorEventLoop._make_write_pipe_transport
    _make_subprocess_transport = windows_events.ProactorEventLoop._make_subprocess_transport
    create_pipe_connection = windows_events.ProactorEventLoop.create_pipe_connection
    start_serving_pipe = windows_events.ProactorEventLoop.start_serving_pipe

    def _after_wait(self) -> None:
        """Called by the loop right after each wait on the port."""
        # The wait has returned: a callback queued by another thread from
        # now on needs a new wake-up, and one queued before is run this
        # iteration (call_soon_threadsafe appends to _ready before
        # _write_to_self, and _run_once counts _ready after this).
        self._wakeup_posted = False
        # Overlapped completions first: their futures' callbacks then run in
        # this iteration, next to the socket callbacks.
        proactor = self._proactor
        if proactor is not None:
            completions = self._selector.io_completions
            if completions:
                addresses = completions[:]
                completions.clear()
                proactor.complete(addresses)
            else:
                proactor.forget_unregistered()

    def _process_events(self, event_list) -> None:
        # The stock iteration (debug mode) comes here after select().
        self._after_wait()
        super()._process_events(event_list)  # type: ignore[misc]

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

    def close(self) -> None:
        if self.is_running():
            raise RuntimeError("Cannot close a running event loop")
        if self.is_closed():
            return
        # Before the port closes: every overlapped operation is cancelled
        # and its completion dequeued, so no kernel write outlives it.
        proactor, self._proactor = self._proactor, None
        if proactor is not None:
            proactor.close()
        super().close()
