"""socknotify_loop: an asyncio event loop on Winsock socket state notifications.

The public surface, in uvloop's shape::

    import socknotify_loop
    socknotify_loop.run(main())                        # like asyncio.run
    asyncio.run(main(), loop_factory=socknotify_loop.new_event_loop)   # 3.12+
    with asyncio.Runner(loop_factory=socknotify_loop.new_event_loop) as r:  # 3.11+
        r.run(main())

``EventLoopPolicy`` and ``install()`` exist for code that still selects its
loop through a policy (Python 3.9-3.13 users); they are served lazily and
warn on Python 3.14+, where asyncio deprecates policies.

Layers: :class:`Port` (the C core) -> :class:`NotifySelector` ->
:class:`Loop` -> this package (``_factory`` picks the platform's loop
class: ``WindowsLoop`` on Windows, the portable ``Loop`` elsewhere).
Importing the package loads only the port; the selector and the loop (and
asyncio) are imported on first use.
"""
from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from ._factory import loop_class as _loop_class
from ._factory import new_event_loop
from ._version import __version__
from .port import (
    EVENT_ERR,
    EVENT_HANGUP,
    EVENT_IN,
    EVENT_OUT,
    EVENT_REMOVE,
    OP_DISABLE,
    OP_ENABLE,
    OP_NONE,
    OP_REMOVE,
    TRIGGER_EDGE,
    TRIGGER_LEVEL,
    TRIGGER_ONESHOT,
    TRIGGER_PERSISTENT,
    Port,
    Registration,
    backend_info,
)

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    import asyncio

    from .loop import Loop
    from .selector import NotifySelector

# In the API reference's order (docs/api.md follows it).
__all__ = [
    "Loop", "new_event_loop", "run", "NotifySelector", "Port", "Registration",
    "backend_info",
    "EVENT_IN", "EVENT_OUT", "EVENT_HANGUP", "EVENT_ERR", "EVENT_REMOVE",
    "OP_NONE", "OP_ENABLE", "OP_DISABLE", "OP_REMOVE",
    "TRIGGER_ONESHOT", "TRIGGER_PERSISTENT", "TRIGGER_LEVEL", "TRIGGER_EDGE",
    "__version__",
]

_T = TypeVar("_T")

# asyncio deprecates event loop policies from 3.14 on; before that a policy
# is how most programs pick their loop, so it must work without a warning.
_POLICIES_DEPRECATED = sys.version_info >= (3, 14)

# Served by __getattr__ on first use: module name and attribute ("Loop"
# is served by _loop_class()).
_LAZY = {"NotifySelector": (".selector", "NotifySelector")}
_DEPRECATED = ("EventLoopPolicy", "install")


def run(main: Coroutine[Any, Any, _T], *, debug: bool | None = None, **run_kwargs: Any) -> _T:
    """Run coroutine ``main`` on a new :class:`Loop`, like :func:`asyncio.run`.

    On Python 3.12+ this is ``asyncio.run(main, loop_factory=new_event_loop,
    ...)``; on 3.11 an ``asyncio.Runner`` with that factory; on 3.9/3.10 the
    same steps asyncio.run takes there (cancel leftover tasks, shut down async
    generators and the default executor, close the loop). ``run_kwargs`` go
    to ``asyncio.run`` (3.12+; ``loop_factory`` may be overridden).
    """
    import asyncio

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = run_kwargs.pop(
        "loop_factory", new_event_loop)
    if sys.version_info >= (3, 12):
        return asyncio.run(main, debug=debug, loop_factory=loop_factory, **run_kwargs)
    if run_kwargs:
        raise TypeError(f"run() got unexpected keyword arguments {sorted(run_kwargs)}")
    if sys.version_info >= (3, 11):
        # Checked before the Runner exists, as asyncio.run does: entering
        # it would create a loop that could then not be shut down.
        if asyncio._get_running_loop() is not None:
            raise RuntimeError("asyncio.run() cannot be called from a running event loop")
        with asyncio.Runner(debug=debug, loop_factory=loop_factory) as runner:
            return runner.run(main)
    return _run_before_runner(main, debug, loop_factory)


def _run_before_runner(main: Coroutine[Any, Any, _T], debug: bool | None,
                       loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> _T:
    """asyncio.run's steps on Python 3.9/3.10, which has no loop factory."""
    import asyncio

    if asyncio._get_running_loop() is not None:
        raise RuntimeError("asyncio.run() cannot be called from a running event loop")
    if not asyncio.iscoroutine(main):
        raise ValueError(f"a coroutine was expected, got {main!r}")
    loop = loop_factory()
    try:
        asyncio.set_event_loop(loop)
        if debug is not None:
            loop.set_debug(debug)
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_leftover_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks main() left behind and wait for them, reporting
    their exceptions to the loop's handler (what asyncio.run does)."""
    import asyncio

    leftover = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not leftover:
        return
    for task in leftover:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
    for task in leftover:
        if task.cancelled():
            continue
        if task.exception() is not None:
            loop.call_exception_handler({
                "message": "unhandled exception during asyncio.run() shutdown",
                "exception": task.exception(),
                "task": task,
            })


def _deprecated_policy_api(name: str) -> Any:
    if _POLICIES_DEPRECATED:
        warnings.warn(
            f"socknotify_loop.{name} is deprecated: asyncio deprecates event loop "
            "policies since Python 3.14. Use socknotify_loop.run(main()) or "
            "asyncio.run(main(), loop_factory=socknotify_loop.new_event_loop).",
            DeprecationWarning, stacklevel=3)
    from . import _factory
    if name == "EventLoopPolicy":
        return _factory.event_loop_policy_class()
    return _factory.install


def __getattr__(name: str) -> Any:
    """Serve the loop and selector lazily, and the policy API with a
    DeprecationWarning on Python 3.14+."""
    if name == "Loop":
        value: Any = _loop_class()
        globals()[name] = value   # later lookups skip __getattr__
        return value
    if name in _LAZY:
        import importlib
        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name, __name__), attribute)
        globals()[name] = value   # later lookups skip __getattr__
        return value
    if name in _DEPRECATED:
        return _deprecated_policy_api(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"Loop"} | set(_LAZY) | set(_DEPRECATED))
