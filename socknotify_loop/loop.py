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
"""
from __future__ import annotations

import asyncio
import signal
import sys
import threading
import warnings
from typing import Optional

from .selector import NotifySelector

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

    def __init__(self, selector: Optional[NotifySelector] = None) -> None:
        if selector is None:
            selector = NotifySelector()
        super().__init__(selector)
        if sys.platform == "win32":
            self._start_overlapped_io()

    @property
    def backend(self) -> str:
        """The notification backend: ``'epoll'``, ``'psn'`` or ``'afd'``."""
        return self._selector.backend  # type: ignore[attr-defined]

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
