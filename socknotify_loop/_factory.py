"""Which loop class this platform uses, and the ways asyncio is handed one.

``socknotify_loop.Loop`` is the platform's loop class: on Windows
``socknotify_loop._windows_io.WindowsLoop`` (pipes, subprocesses and
wake-ups as overlapped I/O on the same port), elsewhere the portable
``socknotify_loop.loop.Loop`` it subclasses. :func:`loop_class` is the one
place that chooses it; :func:`new_event_loop`, the policy, ``install()``
and the launcher all come here.

This module sits above the loop modules and imports them (and asyncio)
only on first use, so importing the package stays as cheap as importing
the port; nothing below imports it.
"""
from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from .loop import Loop


def loop_class() -> type[Loop]:
    """The class ``socknotify_loop.Loop`` names on this platform."""
    if sys.platform == "win32":
        from ._windows_io import WindowsLoop
        return WindowsLoop
    from .loop import Loop
    return Loop


def new_event_loop() -> Loop:
    """A new :class:`Loop`: the loop factory for ``asyncio.Runner``,
    ``asyncio.run(loop_factory=...)``, uvicorn's ``--loop`` and anyio."""
    return loop_class()()


# -- the policy API, for programs that pick their loop through a policy --------
# (Python 3.9-3.13). socknotify_loop.__getattr__ serves these two names and
# warns on 3.14+, where asyncio deprecates policies.

_policy_class: type | None = None


def event_loop_policy_class() -> type:
    """``socknotify_loop.EventLoopPolicy``: asyncio's default policy class for
    this platform (child watchers on Unix), making our loops. Made on first
    use, so that importing the package does not import asyncio, and fetched
    without the DeprecationWarning Python 3.14 attaches to the stock one."""
    global _policy_class
    if _policy_class is None:
        import asyncio

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            base: Any = asyncio.DefaultEventLoopPolicy

        class EventLoopPolicy(base):  # type: ignore[misc]
            """asyncio's default event loop policy, making
            ``socknotify_loop.Loop`` loops (the platform's class).

            ``asyncio.set_event_loop_policy(EventLoopPolicy())`` makes
            ``asyncio.run``, ``asyncio.new_event_loop`` and
            ``get_event_loop`` use socknotify_loop on Python 3.9-3.13.
            """

            def new_event_loop(self) -> Loop:
                """A new ``socknotify_loop.Loop``."""
                return new_event_loop()

        EventLoopPolicy.__module__ = "socknotify_loop"
        _policy_class = EventLoopPolicy
    return _policy_class


def install() -> None:
    """Make ``socknotify_loop.EventLoopPolicy`` asyncio's event loop policy."""
    import asyncio

    with warnings.catch_warnings():
        # Ours has been emitted already where it applies (3.14+).
        warnings.simplefilter("ignore", DeprecationWarning)
        asyncio.set_event_loop_policy(event_loop_policy_class()())
