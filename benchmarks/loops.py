"""The loops under test, by name, and how to make one.

Runs in the worker (Linux CPython or Windows CPython under Wine), so only
the standard library is imported at module level; each peer is imported
when asked for, and a missing one is reported, not fatal.

Names: ``asyncio`` (the platform default), ``asyncio-aa`` (the same loop
again, the A/A control), ``uvloop``, ``trio`` and ``socknotify`` on Linux; ``proactor``, ``winselector``, ``winloop`` and
``socknotify-<backend>`` (``afd``, ``psn``) on Windows.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import sys

LINUX_LOOPS = ["asyncio", "asyncio-aa", "uvloop", "trio", "socknotify"]
WINDOWS_LOOPS = ["proactor", "proactor-aa", "winselector", "winloop", "socknotify-psn",
                 "socknotify-afd"]
#: the A/A controls: a reference loop measured again under another name, so
#: control / reference shows, in every run, how far "equal" strays (noise)
CONTROLS = {"asyncio-aa": "asyncio", "proactor-aa": "proactor"}
OURS = ("socknotify", "socknotify-psn", "socknotify-afd")


@contextlib.contextmanager
def _backend(name):
    """SOCKNOTIFY_BACKEND set while the loop (and so its Port) is created."""
    old = os.environ.get("SOCKNOTIFY_BACKEND")
    if name:
        os.environ["SOCKNOTIFY_BACKEND"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SOCKNOTIFY_BACKEND", None)
        else:
            os.environ["SOCKNOTIFY_BACKEND"] = old


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
        backend = name.partition("-")[2] or None

        def make():
            with _backend(backend):
                loop = socknotify_loop.new_event_loop()
            _check_backend(loop, backend)
            return loop
        return make
    raise ValueError(f"unknown loop {name!r}")


def _check_backend(loop, wanted):
    """Refuse to report figures under a backend other than the one named."""
    actual = backend_of(loop)
    if wanted and actual and actual != wanted:
        loop.close()
        raise RuntimeError(f"asked for backend {wanted!r}, the loop uses {actual!r}")


def backend_of(loop):
    """Our loop's backend name, found through its selector's port."""
    selector = getattr(loop, "_selector", None)
    for attr in ("backend", "_backend"):
        value = getattr(selector, attr, None)
        if isinstance(value, str):
            return value
    port = getattr(selector, "port", None) or getattr(selector, "_port", None)
    return getattr(port, "backend", None)


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
            backend = name.partition("-")[2] or None
            if backend:
                ok, reason = port.available_backends()[backend]
                if not ok:
                    return {"available": False, "error": reason}
            loop = loop_factory(name)()
            actual = backend_of(loop)
            loop.close()
            version = getattr(socknotify_loop, "__version__", None)
            if version is None:
                try:
                    from importlib.metadata import version as dist_version
                    version = dist_version("socknotify_loop")
                except Exception:
                    version = "source tree"
            return {"available": True, "version": version,
                    "backend": actual or backend or port.backend_info()["backend"]}
    except Exception as exc:  # a missing peer is a finding, not a crash
        return {"available": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"available": False, "error": "unknown loop"}
