"""The loops under test, by name, and how to make one.

Runs in the worker (Linux CPython or Windows CPython under Wine), so only
the standard library is imported at module level; each peer is imported
when asked for, and a missing one is reported, not fatal.

Names: ``asyncio`` (the platform default), ``asyncio-aa`` (the same loop
again, the A/A control), ``uvloop``, ``trio``, ``socknotify`` and
``socknotify-asyncio-transports`` (the loop on asyncio's own socket
transports, ``Loop(transports="asyncio")``, beside its own) on Linux;
``proactor``, ``winselector``, ``winloop`` and ``socknotify-<backend>``
(``afd``, ``psn``: ``NotifySelector(backend=...)``) on Windows.
"""
from __future__ import annotations

import asyncio
import sys

LINUX_LOOPS = ["asyncio", "asyncio-aa", "uvloop", "trio", "socknotify",
               "socknotify-asyncio-transports"]
WINDOWS_LOOPS = ["proactor", "proactor-aa", "winselector", "winloop", "socknotify-psn",
                 "socknotify-afd"]
#: the A/A controls: a reference loop measured again under another name, so
#: control / reference shows, in every run, how far "equal" strays (noise)
CONTROLS = {"asyncio-aa": "asyncio", "proactor-aa": "proactor"}
OURS = ("socknotify", "socknotify-psn", "socknotify-afd", "socknotify-asyncio-transports")
#: the suffix of a name of ours that runs the loop on asyncio's transports
ASYNCIO_TRANSPORTS = "-asyncio-transports"
#: the loops every ratio of a platform's section is taken against
REFERENCES = {"linux": ["asyncio"], "wine": ["proactor", "winselector"],
              "windows": ["proactor", "winselector"]}


def loop_factory(name: str):
    """A zero-argument callable making a fresh loop (not for trio)."""
    if name in CONTROLS:
        return loop_factory(CONTROLS[name])
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        import uvloop
        return uvloop.new_event_loop
    if name == "winloop":
        import winloop
        return winloop.new_event_loop
    if name == "proactor":
        return asyncio.ProactorEventLoop
    if name == "winselector":
        return asyncio.SelectorEventLoop      # WindowsSelectorEventLoop on win32
    if name in OURS:
        import socknotify_loop
        backend = backend_of_name(name)
        transports = transports_of_name(name)

        def make():
            # The backend is asked of the selector by name: the port raises
            # when it is unavailable, never falls back to another one.
            return socknotify_loop.Loop(socknotify_loop.NotifySelector(backend=backend),
                                        transports=transports)
        return make
    raise ValueError(f"unknown loop {name!r}")


def backend_of_name(name: str):
    """The backend a loop name asks for (``socknotify-afd`` -> ``afd``), or
    None for ``socknotify``: the best one available (epoll on Linux)."""
    if name.endswith(ASYNCIO_TRANSPORTS):
        name = name[:-len(ASYNCIO_TRANSPORTS)]
    return name.partition("-")[2] or None


def transports_of_name(name: str) -> str:
    """Whose socket transports a loop name of ours asks for: ``asyncio``
    for ``...-asyncio-transports``, else the loop's own."""
    return "asyncio" if name.endswith(ASYNCIO_TRANSPORTS) else "own"


def describe(name: str) -> dict:
    """Version and availability of one loop, for the results file."""
    try:
        if name == "trio":
            import trio
            return {"available": True, "version": trio.__version__}
        if name in CONTROLS:
            return describe(CONTROLS[name])
        if name in ("asyncio", "proactor", "winselector"):
            if name != "asyncio" and sys.platform != "win32":
                return {"available": False, "error": "Windows only"}
            loop = loop_factory(name)()
            cls = type(loop).__name__
            loop.close()
            return {"available": True, "version": f"Python {sys.version.split()[0]}",
                    "class": cls}
        if name in ("uvloop", "winloop"):
            module = __import__(name)
            return {"available": True, "version": module.__version__}
        if name in OURS:
            import socknotify_loop
            from socknotify_loop import port
            backend = backend_of_name(name)
            if backend:
                ok, reason = port.available_backends()[backend]
                if not ok:
                    return {"available": False, "error": reason}
            loop = loop_factory(name)()
            actual = loop.backend
            loop.close()
            return {"available": True, "version": socknotify_loop.__version__,
                    "backend": actual or backend or port.backend_info()["backend"]}
    except Exception as exc:  # noqa: BLE001 (a missing peer is a finding, not a crash)
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"available": False, "error": "unknown loop"}
