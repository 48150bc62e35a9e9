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

The peers users compare with, on Linux: ``rloop`` and ``veloxloop``
(Rust), ``zuvloop`` (Zig on libuv; CPython 3.14 and later only, so it is
measured by pythons.py in the chroot), and aiofastnet's compiled
transports on three loops: ``aiofastnet-asyncio``, ``aiofastnet-uvloop``
and ``aiofastnet-socknotify`` (``aiofastnet.loop_factory(base)``). A peer
that is not installed, or not for this Python, is reported unavailable
with the reason (its pip requirement is in PEER_REQUIREMENTS; peers.py
tries to install it).
"""
from __future__ import annotations

import asyncio
import sys

LINUX_LOOPS = ["asyncio", "asyncio-aa", "uvloop", "trio", "socknotify",
               "socknotify-asyncio-transports", "rloop", "veloxloop", "zuvloop",
               "aiofastnet-asyncio", "aiofastnet-uvloop", "aiofastnet-socknotify"]
WINDOWS_LOOPS = ["proactor", "proactor-aa", "winselector", "winloop", "socknotify-psn",
                 "socknotify-afd"]
#: the A/A controls: a reference loop measured again under another name, so
#: control / reference shows, in every run, how far "equal" strays (noise)
CONTROLS = {"asyncio-aa": "asyncio", "proactor-aa": "proactor"}
OURS = ("socknotify", "socknotify-psn", "socknotify-afd", "socknotify-asyncio-transports")
#: the suffix of a name of ours that runs the loop on asyncio's transports
ASYNCIO_TRANSPORTS = "-asyncio-transports"
#: aiofastnet's transports on another loop: name -> the base loop's name
AIOFASTNET = {"aiofastnet-asyncio": "asyncio", "aiofastnet-uvloop": "uvloop",
              "aiofastnet-socknotify": "socknotify"}
#: the import name of each peer a pip requirement brings (peers.py)
PEER_MODULES = {"uvloop": "uvloop", "rloop": "rloop", "veloxloop": "veloxloop",
                "zuvloop": "zuvloop", "winloop": "winloop", "aiofastnet": "aiofastnet",
                "trio": "trio"}
#: the oldest Python a peer publishes for (its Requires-Python)
PEER_MIN_PYTHON = {"zuvloop": (3, 14), "veloxloop": (3, 11), "rloop": (3, 10)}
#: the loops every ratio of a platform's section is taken against
REFERENCES = {"linux": ["asyncio"], "wine": ["proactor", "winselector"],
              "windows": ["proactor", "winselector"]}


def uses_our_package(name: str) -> bool:
    """Whether a loop name runs socknotify_loop (ours, or a peer on it)."""
    return name in OURS or AIOFASTNET.get(name) in OURS


def packages_of(name: str) -> list:
    """The peer packages a loop name needs (import names)."""
    if name in CONTROLS:
        return packages_of(CONTROLS[name])
    if name in AIOFASTNET:
        return ["aiofastnet", *packages_of(AIOFASTNET[name])]
    return [name] if name in PEER_MODULES else []


def loop_factory(name: str):
    """A zero-argument callable making a fresh loop (not for trio)."""
    if name in CONTROLS:
        return loop_factory(CONTROLS[name])
    if name in AIOFASTNET:
        import aiofastnet
        # Its factory patches each loop it makes (and sets it as the
        # current loop, as asyncio.Runner's factory contract asks).
        return aiofastnet.loop_factory(loop_factory(AIOFASTNET[name]))
    if name in ("rloop", "veloxloop", "zuvloop"):
        return __import__(name).new_event_loop
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
    too_old = [(p, PEER_MIN_PYTHON[p]) for p in packages_of(name)
               if p in PEER_MIN_PYTHON and sys.version_info[:2] < PEER_MIN_PYTHON[p]]
    if too_old:
        package, (major, minor) = too_old[0]
        return {"available": False,
                "error": f"{package} is for CPython {major}.{minor} and later "
                         f"(this is {sys.version.split()[0]})"}
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
        if name in ("uvloop", "winloop", "rloop", "veloxloop", "zuvloop"):
            module = __import__(name)
            loop = loop_factory(name)()
            loop.close()
            return {"available": True, "version": _version(name, module)}
        if name in AIOFASTNET:
            import aiofastnet
            base = describe(AIOFASTNET[name])
            if not base.get("available"):
                return {"available": False,
                        "error": f"its base loop {AIOFASTNET[name]}: {base.get('error')}"}
            loop = loop_factory(name)()
            patched = "create_connection" in getattr(loop, "_aiofastnet_patched_methods", ())
            loop.close()
            asyncio.set_event_loop(None)   # aiofastnet's factory set it
            if not patched:
                return {"available": False, "error": "aiofastnet did not patch the loop"}
            return {"available": True,
                    "version": f"aiofastnet {aiofastnet.__version__} on "
                               f"{AIOFASTNET[name]} {base.get('version')}"}
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


def _version(name: str, module) -> str:
    """A peer's version: its __version__, else its distribution's."""
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as distribution_version
        return distribution_version(name)
    except Exception:  # noqa: BLE001
        return "?"
