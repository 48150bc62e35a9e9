"""Run an unmodified asyncio program on socknotify_loop.

::

    python -m socknotify_loop script.py [args...]
    python -m socknotify_loop -m package.module [args...]
    python -m socknotify_loop --info

The program is run with :mod:`runpy` as ``__main__`` with ``sys.argv`` and
``sys.path[0]`` set as ``python script.py`` / ``python -m module`` would set
them. Before it starts, :func:`use_socknotify_loop` makes ``asyncio.run``,
``asyncio.Runner`` (without a ``loop_factory``) and
``asyncio.new_event_loop`` create a :class:`~socknotify_loop.loop.Loop`:

- Python 3.9-3.13: through an event loop policy, which is what all three
  consult there (``asyncio.run`` -> ``Runner`` -> ``events.new_event_loop``
  -> the policy), so ``get_event_loop`` and ``get_event_loop_policy()``
  agree with them.
- Python 3.14+: policies are deprecated, so instead of setting one (and
  warning in the user's program) ``asyncio.new_event_loop`` and
  ``asyncio.events.new_event_loop``, which ``Runner`` calls when it has no
  factory, are replaced by our factory.
"""
from __future__ import annotations

import os
import platform
import runpy
import sys
from typing import List, Optional, TextIO

__all__ = ["main", "use_socknotify_loop", "describe_environment"]

USAGE = """\
usage: python -m socknotify_loop [--info] [-h] [--version] (script.py | -m module) [args ...]

Run an asyncio program unchanged on socknotify_loop: asyncio.run(),
asyncio.Runner() and asyncio.new_event_loop() create socknotify_loop loops.

  script.py [args]   run a script as __main__ (like `python script.py`)
  -m module [args]   run a module as __main__ (like `python -m module`)
  --info             print the notification backend in use and why, the OS
                     build and the Python version, then exit
  --version          print socknotify_loop's version and exit
"""


def use_socknotify_loop() -> None:
    """Make asyncio create :class:`~socknotify_loop.loop.Loop` loops by default
    (see the module docstring for how, per Python version)."""
    import asyncio
    import asyncio.events

    from . import new_event_loop
    from .loop import EventLoopPolicy

    if sys.version_info < (3, 14):
        asyncio.set_event_loop_policy(EventLoopPolicy())
        return

    def patched_new_event_loop() -> asyncio.AbstractEventLoop:
        """A new socknotify_loop loop (installed by ``python -m socknotify_loop``)."""
        return new_event_loop()

    asyncio.events.new_event_loop = patched_new_event_loop
    asyncio.new_event_loop = patched_new_event_loop


def describe_environment() -> List[str]:
    """The lines ``--info`` prints: backend and why, OS build, Python."""
    from . import __version__
    from .port import backend_info

    lines = [f"socknotify_loop {__version__}"]
    try:
        info = backend_info()
    except (OSError, ValueError) as exc:
        lines.append(f"backend: none ({exc})")
        available = {}
    else:
        lines.append(f"backend: {info['backend']}")
        lines.append(f"reason: {info['reason']}")
        available = info["available"]
    forced = os.environ.get("SOCKNOTIFY_BACKEND")
    if forced:
        lines.append(f"forced by SOCKNOTIFY_BACKEND={forced}")
    for name, (ok, why) in available.items():
        lines.append(f"  {name}: {'available' if ok else 'unavailable'} - {why}")
    if sys.platform == "win32":
        # The build number is what decides the backend (ProcessSocket-
        # Notifications needs 20348+). Read it from the kernel's own answer:
        # platform.platform() asks WMI on Python 3.13+, which hangs under
        # Wine 8 (propsys.VariantToString is a stub there).
        win = sys.getwindowsversion()  # type: ignore[attr-defined]
        lines.append(f"os: Windows {win.major}.{win.minor} build {win.build} "
                     f"({os.environ.get('PROCESSOR_ARCHITECTURE', 'unknown machine')})")
        lines.append(f"windows build: {win.major}.{win.minor}.{win.build} "
                     f"(platform {win.platform}, service pack {win.service_pack!r})")
    else:
        lines.append(f"os: {platform.platform()}")
    lines.append(f"python: {platform.python_implementation()} {sys.version.split()[0]} "
                 f"({sys.executable})")
    return lines


def _run_script(path: str, args: List[str]) -> None:
    # As `python script.py` does: argv[0] is the path as given and the
    # script's directory comes first on sys.path, replacing ours.
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    runpy.run_path(path, run_name="__main__")


def _run_module(module: str, args: List[str]) -> None:
    # As `python -m module` does: the current directory stays sys.path[0]
    # (it already is, since we were started with -m), and runpy sets
    # sys.argv[0] to the module's file.
    sys.argv[:] = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: Optional[List[str]] = None, out: TextIO = sys.stdout) -> int:
    """The command line; returns the exit status (the program's own
    ``SystemExit`` propagates, as it would without the launcher)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        out.write(USAGE)
        return 0 if args else 2
    first = args[0]
    if first == "--info":
        out.write("\n".join(describe_environment()) + "\n")
        return 0
    if first == "--version":
        from . import __version__
        out.write(f"socknotify_loop {__version__}\n")
        return 0
    if first == "-m":
        if len(args) < 2:
            sys.stderr.write("socknotify_loop: -m needs a module name\n" + USAGE)
            return 2
        use_socknotify_loop()
        _run_module(args[1], args[2:])
        return 0
    if first.startswith("-"):
        sys.stderr.write(f"socknotify_loop: unknown option {first}\n" + USAGE)
        return 2
    if not os.path.exists(first):
        sys.stderr.write(f"socknotify_loop: can't open file {first!r}: no such file\n")
        return 2
    use_socknotify_loop()
    _run_script(first, args[1:])
    return 0
