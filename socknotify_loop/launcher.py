"""Run an unmodified asyncio program on socknotify_loop.

::

    python -m socknotify_loop script.py [args...]
    python -m socknotify_loop -m package.module [args...]
    python -m socknotify_loop -c "code" [args...]
    python -m socknotify_loop --info
    python -m socknotify_loop --probe-os

The program is run with :mod:`runpy` as ``__main__`` with ``sys.argv`` and
``sys.path[0]`` set as ``python script.py`` / ``python -m module`` would set
them. Before it starts, :func:`use_socknotify_loop` puts
:class:`socknotify_loop.Loop` under every way the standard library
offers to make an event loop (``docs/launcher.md`` lists them, and what
stays out of reach):

- ``asyncio.run``, ``asyncio.Runner`` without a ``loop_factory``,
  ``asyncio.new_event_loop`` and ``get_event_loop``. Python 3.9-3.13: through
  an event loop policy, which is what all of them consult there. Python
  3.14+: policies are deprecated, so instead of setting one (and warning in
  the user's program) ``asyncio.new_event_loop`` and
  ``asyncio.events.new_event_loop``, which ``Runner`` calls when it has no
  factory, are replaced by our factory.
- The loop classes a program may name itself: ``asyncio.SelectorEventLoop``,
  ``asyncio.ProactorEventLoop`` (Windows) and ``asyncio.EventLoop`` (3.13+),
  in ``asyncio`` and in the platform module (``asyncio.unix_events`` or
  ``asyncio.windows_events``), become *stand-ins* for asyncio's classes:

  * calling one without a selector (proactor) makes a Loop; with one, it
    makes asyncio's own loop on it, since the program chose its I/O
    mechanism explicitly;
  * ``isinstance``/``issubclass`` against one answer as against asyncio's
    class: a Loop is a ``SelectorEventLoop`` (it subclasses it; aiodns and
    pyzmq check this) and is not a ``ProactorEventLoop`` (psycopg refuses
    those);
  * a class statement subclassing one gets asyncio's class as its base,
    so a program's own loop class is exactly what it is without the
    launcher.
- The stock policies (``DefaultEventLoopPolicy``,
  ``WindowsSelectorEventLoopPolicy``, ``WindowsProactorEventLoopPolicy``)
  make their loops with the stand-ins, so a program that installs one of
  them (the usual Windows workaround for psycopg and pyzmq) still runs on a
  Loop. This is also how uvicorn is reached: ``--loop auto`` (without
  uvloop installed) and ``--loop asyncio`` return
  ``asyncio.SelectorEventLoop`` or, on Windows, ``asyncio.ProactorEventLoop``
  as uvicorn's loop factory (0.36+), or install the Windows policies
  (earlier versions).
- uvloop and winloop, when the program imports them: their ``Loop`` class
  becomes a stand-in as well (an import hook puts it in place as the package
  is imported), so ``new_event_loop()``, ``EventLoopPolicy``, ``install()``,
  ``run()`` and uvicorn's ``--loop auto`` (which picks uvloop whenever it is
  installed) make a Loop; see :class:`_OtherLoopStandIn`. A program's own
  subclass of their ``Loop`` stays theirs, and one line on stderr says so.
- ``multiprocessing`` children started by spawn or forkserver (uvicorn's
  ``--workers`` and ``--reload``) repeat this setup: see
  :func:`_cover_child_processes`. Forked children inherit it.

The program's uncaught exception is reported as Python reports it (through
``sys.excepthook``, status 1; SIGINT for a KeyboardInterrupt) with the
launcher's and runpy's frames left out of the traceback. A mistake on the
command line is one line saying what and one with a hint, status 2.
"""
from __future__ import annotations

import builtins
import errno
import os
import platform
import runpy
import signal
import sys
import types
from types import TracebackType
from typing import TYPE_CHECKING, Any, Callable, TextIO

from ._backends import ENVIRONMENT_VARIABLE, backend_from_environment

if TYPE_CHECKING:  # pragma: no cover - for type checkers only
    from .loop import Loop

__all__ = ["describe_environment", "main", "use_socknotify_loop"]

USAGE_LINE = ("usage: python -m socknotify_loop [--info] [--probe-os] [-h] [--version] "
              "(script.py | -m module | -c command) [args ...]")
HINT = "hint: `python -m socknotify_loop --help` lists the options"

USAGE = USAGE_LINE + """

Run an asyncio program unchanged on socknotify_loop.

  script.py [args]   run a script as __main__ (like `python script.py`)
  -m module [args]   run a module as __main__ (like `python -m module`)
  -c command [args]  run a string of Python code (like `python -c command`)
  --info             print the notification backend in use and why, the OS
                     build and the Python version, then exit (status 1 if
                     no loop can be made here)
  --probe-os         Windows: ask the OS's ProcessSocketNotifications the
                     questions its documentation leaves open (key change
                     without REMOVE, delivery after DISABLE, a socket of
                     another port, a port closed with live registrations,
                     edge without draining) and print its answers beside
                     the strict model's; where the OS lacks the function
                     (Wine, Windows 10), the model's only
  --version          print socknotify_loop's version and exit

The program gets a socknotify_loop Loop from:
  asyncio.run(), asyncio.Runner() and asyncio.new_event_loop() without a
  loop factory, asyncio.get_event_loop();
  asyncio.SelectorEventLoop(), asyncio.ProactorEventLoop() (Windows) and
  asyncio.EventLoop() (3.13+) called without a selector/proactor, also as
  a loop_factory (uvicorn --loop asyncio|none, and auto without uvloop);
  the policies DefaultEventLoopPolicy, WindowsSelectorEventLoopPolicy and
  WindowsProactorEventLoopPolicy;
  uvloop and winloop: their Loop, new_event_loop(), install(),
  EventLoopPolicy and run() (uvicorn --loop auto|uvloop|winloop);
  all of these in multiprocessing children too (uvicorn --workers/--reload).
isinstance(loop, asyncio.SelectorEventLoop) is true for it and
isinstance(loop, asyncio.ProactorEventLoop) false.

Not covered (the program keeps the loop it asks for):
  any other loop package (tokio, rloop, ...);
  a program's own subclass of asyncio.SelectorEventLoop, ProactorEventLoop,
  BaseEventLoop (it stays a subclass of asyncio's class) or of uvloop.Loop /
  winloop.Loop (one line on stderr says that class runs on uvloop/winloop);
  SelectorEventLoop(selector) / ProactorEventLoop(proactor) given one
  explicitly; asyncio's private classes (_UnixSelectorEventLoop, ...);
  a policy or loop_factory of another package; a Python started with
  subprocess (start it through python -m socknotify_loop too);
  type(loop) is asyncio.SelectorEventLoop (the names are stand-ins for
  asyncio's classes, not classes: use isinstance).

SOCKNOTIFY_BACKEND=epoll|psn|afd forces a backend (case-insensitive).
More: docs/launcher.md.
"""


# -- the loop factory and the stand-ins for asyncio's loop classes -----------------

def _new_loop() -> Loop:
    """A new ``socknotify_loop.Loop``. Its selector is made first, so a backend that fails to
    open raises before a half-built loop exists (whose ``__del__`` would
    print noise about its missing state)."""
    from ._factory import loop_class
    from .selector import NotifySelector

    return loop_class()(NotifySelector())


class _StandIn:
    """A stand-in for one of asyncio's loop classes (``stock``), whose
    constructor takes one optional argument named ``explicit``
    (``selector``/``proactor``); see the module docstring.

    It is not a class itself, so that a class statement naming it as a base
    goes through :meth:`__mro_entries__` and gets asyncio's class, with
    whatever metaclass the program asks for. Attribute reads and writes go
    to asyncio's class (``asyncio.SelectorEventLoop.__init__(self)`` in a
    subclass, ``__name__``, monkeypatching); ``__class__`` is therefore
    asyncio's metaclass, so ``isinstance(asyncio.SelectorEventLoop, type)``
    and ``inspect.isclass`` stay true; and ``__bases__`` is ``(stock,)``,
    so ``issubclass(asyncio.SelectorEventLoop, X)`` answers as for a
    subclass of asyncio's class.
    """

    _OWN = frozenset(("_socknotify_stock", "_socknotify_explicit", "__mro_entries__",
                      "__bases__", "__repr__", "__call__", "__instancecheck__",
                      "__subclasscheck__"))

    def __init__(self, stock: type, explicit: str) -> None:
        object.__setattr__(self, "_socknotify_stock", stock)
        object.__setattr__(self, "_socknotify_explicit", explicit)

    def __getattribute__(self, name: str) -> Any:
        if name in _StandIn._OWN:
            if name == "__bases__":
                return (object.__getattribute__(self, "_socknotify_stock"),)
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_socknotify_stock"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._socknotify_stock, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._socknotify_stock, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        stock, explicit = self._socknotify_stock, self._socknotify_explicit
        if len(args) > 1 or (args and kwargs) or set(kwargs) - {explicit}:
            return stock(*args, **kwargs)   # asyncio's own TypeError
        chosen = args[0] if args else kwargs.get(explicit)
        if chosen is not None:
            # The program chose how to wait: asyncio's loop on that.
            return stock(chosen)
        return _new_loop()

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (self._socknotify_stock,)

    def __instancecheck__(self, instance: Any) -> bool:
        return isinstance(instance, self._socknotify_stock)

    def __subclasscheck__(self, subclass: type) -> bool:
        return issubclass(subclass, self._socknotify_stock)

    def __repr__(self) -> str:
        stock = self._socknotify_stock
        return (f"<class '{stock.__module__}.{stock.__qualname__}' "
                f"(python -m socknotify_loop: makes socknotify_loop.Loop)>")


def _install_stand_ins() -> None:
    """Replace asyncio's loop classes by stand-ins wherever asyncio exports
    them, and point the stock policies at the stand-ins. Idempotent."""
    import asyncio

    if sys.platform == "win32":
        from asyncio import windows_events as platform_module
    else:
        from asyncio import unix_events as platform_module

    # vars(), not getattr(): Python 3.14 serves deprecated names through a
    # module __getattr__ that warns.
    names = vars(platform_module)
    stand_ins = {}
    for name, explicit in (("SelectorEventLoop", "selector"), ("ProactorEventLoop", "proactor")):
        stock = names.get(name)
        # (a stand-in passes isinstance(stock, type): its __class__ is the
        # stock class's metaclass)
        if isinstance(stock, type) and type(stock) is not _StandIn:  # type: ignore[comparison-overlap]
            stand_ins[stock] = _StandIn(stock, explicit)
    # Every public name bound to one of those classes: SelectorEventLoop,
    # ProactorEventLoop and EventLoop (3.13+), in the platform module and
    # in the asyncio package, which re-exports them.
    for module in (platform_module, asyncio):
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and type(value) is not _StandIn \
                    and isinstance(value, type) and value in stand_ins:
                setattr(module, name, stand_ins[value])
    # The policies (public and, on 3.14+, underscored) keep the class they
    # make in _loop_factory; BaseDefaultEventLoopPolicy.new_event_loop calls it.
    for value in list(names.values()):
        if isinstance(value, type):
            factory = value.__dict__.get("_loop_factory")
            if type(factory) is not _StandIn and isinstance(factory, type) \
                    and factory in stand_ins:
                value._loop_factory = stand_ins[factory]  # type: ignore[attr-defined]


# -- uvloop and winloop: their loop class is a stand-in too ----------------------------

# Loop packages built like uvloop: a module-level ``Loop`` class that
# ``new_event_loop()``, ``EventLoopPolicy``, ``install()`` and ``run()`` all
# reach through the module's global name (uvloop's and winloop's
# __init__.py), which uvicorn's ``--loop auto|uvloop|winloop`` call.
_OTHER_LOOP_PACKAGES = ("uvloop", "winloop")


class _OtherLoopStandIn(_StandIn):
    """``uvloop.Loop`` / ``winloop.Loop`` under the launcher: calling it
    makes a socknotify_loop Loop, and ``isinstance(loop, uvloop.Loop)`` is
    true for one (``uvloop.run`` refuses a loop that fails that check).
    A class statement subclassing it gets the package's own class, as
    with asyncio's; that loop runs on the other package, which one line on
    stderr says when the class is defined."""

    def __instancecheck__(self, instance: Any) -> bool:
        from .loop import Loop
        return isinstance(instance, (self._socknotify_stock, Loop))

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        stock = self._socknotify_stock
        sys.stderr.write(f"socknotify_loop: a class subclassing {stock.__module__}.Loop "
                         f"runs on {stock.__module__.split('.')[0]}, not on socknotify_loop\n")
        return (stock,)


def _take_over(module: Any) -> None:
    """Put the stand-in in place of ``module.Loop`` (idempotent)."""
    stock = vars(module).get("Loop")
    if isinstance(stock, type) and type(stock) is not _OtherLoopStandIn:  # type: ignore[comparison-overlap]
        module.Loop = _OtherLoopStandIn(stock, "")


class _TakeOverLoader:
    """Wraps the loader of uvloop/winloop: runs the package, then
    :func:`_take_over`. Anything else is the wrapped loader's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _take_over(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _OtherLoopFinder:
    """First on ``sys.meta_path``: finds uvloop and winloop through the
    other finders and hands their spec back with a :class:`_TakeOverLoader`,
    so the stand-in is in place before any code can read ``Loop``."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _OTHER_LOOP_PACKAGES:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if isinstance(finder, _OtherLoopFinder) or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _TakeOverLoader(spec.loader)
                return spec
        return None

    def invalidate_caches(self) -> None:
        pass


def _take_over_other_loops() -> None:
    """uvloop and winloop, imported now or later, make our loops. Idempotent."""
    for name in _OTHER_LOOP_PACKAGES:
        if name in sys.modules:
            _take_over(sys.modules[name])
    if not any(isinstance(finder, _OtherLoopFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OtherLoopFinder())


def use_socknotify_loop() -> None:
    """Make asyncio create :class:`socknotify_loop.Loop` loops by default
    and for the loop classes and policies a program names itself (see the
    module docstring for what is covered, and how, per Python version)."""
    import asyncio
    import asyncio.events

    from ._factory import event_loop_policy_class, loop_class

    # Loop subclasses asyncio.SelectorEventLoop: loop.py must be imported
    # before the name becomes a stand-in.
    loop_class()
    _install_stand_ins()
    _take_over_other_loops()
    if sys.version_info < (3, 14):
        asyncio.set_event_loop_policy(event_loop_policy_class()())
        return

    def patched_new_event_loop() -> asyncio.AbstractEventLoop:
        """A new socknotify_loop loop (installed by ``python -m socknotify_loop``)."""
        return _new_loop()

    asyncio.events.new_event_loop = patched_new_event_loop
    asyncio.new_event_loop = patched_new_event_loop


# -- multiprocessing children -------------------------------------------------------

class _ChildSetup:
    """Put into the preparation data multiprocessing sends a spawned (or
    forkserver) child: unpickling it there runs :func:`_setup_child` before
    the child re-imports the program's main module and unpickles its
    target, so the child runs on the launcher's terms too. (Forked
    children inherit the parent's state and need nothing.)"""

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return _setup_child, ()


def _setup_child() -> None:
    """In a multiprocessing child of a launched program: what the launcher
    did in the parent (the parent checked the backend already)."""
    _cover_child_processes()
    use_socknotify_loop()


def _cover_child_processes() -> None:
    """Make multiprocessing's spawned and forkserver children (uvicorn
    ``--reload``/``--workers``, ProcessPoolExecutor, ...) run
    :func:`use_socknotify_loop` too. Idempotent."""
    from multiprocessing import spawn

    original = spawn.get_preparation_data
    if getattr(original, "_socknotify_loop", False):
        return

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)
        # multiprocessing's prepare() ignores keys it does not know.
        data["socknotify_loop"] = _ChildSetup()
        return data

    get_preparation_data._socknotify_loop = True  # type: ignore[attr-defined]
    get_preparation_data.__doc__ = original.__doc__
    spawn.get_preparation_data = get_preparation_data


# -- the backend: checked before the program runs, described by --info ------------

def _reason(exc: BaseException) -> str:
    """An exception as one line, without the ``[Errno N]`` prefix."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _usable_backend(forced: str | None) -> dict[str, Any]:
    """``backend_info`` for the backend a Loop would use, after opening and
    closing a port on it; raises OSError/ValueError/ImportError with the
    reason when no loop can be made."""
    from .port import Port, backend_info

    info = backend_info(forced)
    ok, why = info["available"][info["backend"]]
    if not ok:
        raise OSError(errno.ENOSYS, f"backend {info['backend']!r} is not available: {why}")
    Port(info["backend"]).close()
    return info


def _forced_suffix() -> str:
    value = os.environ.get(ENVIRONMENT_VARIABLE, "")
    return f" (forced by {ENVIRONMENT_VARIABLE}={value})" if value.strip() else ""


def _backend_problem() -> str | None:
    """None if a Loop can be made here, else why not (one line). Also
    writes the canonical backend name back to ``SOCKNOTIFY_BACKEND``, for
    the port, which reads it again, and for child processes."""
    try:
        forced = backend_from_environment()
        if forced is not None:
            os.environ[ENVIRONMENT_VARIABLE] = forced
        _usable_backend(forced)
    except (OSError, ValueError, ImportError) as exc:
        return _reason(exc) + _forced_suffix()
    return None


def _describe() -> tuple[list[str], bool]:
    """``--info``'s lines, and whether a loop can be made here."""
    from ._version import __version__

    lines = [f"socknotify_loop {__version__}"]
    available: dict[str, Any] = {}
    usable = False
    try:
        from .port import available_backends
        available = available_backends()
        info = _usable_backend(backend_from_environment())
    except (OSError, ValueError, ImportError) as exc:
        lines.append(f"backend: none ({_reason(exc)})")
    else:
        lines.append(f"backend: {info['backend']}")
        lines.append(f"reason: {info['reason']}")
        usable = True
    forced = os.environ.get(ENVIRONMENT_VARIABLE, "")
    if forced.strip():
        lines.append(f"forced by {ENVIRONMENT_VARIABLE}={forced}")
    for name, (ok, why) in available.items():
        lines.append(f"  {name}: {'available' if ok else 'unavailable'} - {why}")
    if sys.platform == "win32":
        # The build number is what decides the backend (ProcessSocket-
        # Notifications needs 20348+). Read it from the kernel's own answer:
        # platform.platform() asks WMI on Python 3.13+, which hangs under
        # Wine 8 (propsys.VariantToString is a stub there).
        win = sys.getwindowsversion()
        lines.append(f"os: Windows {win.major}.{win.minor} build {win.build} "
                     f"({os.environ.get('PROCESSOR_ARCHITECTURE', 'unknown machine')})")
        lines.append(f"windows build: {win.major}.{win.minor}.{win.build} "
                     f"(platform {win.platform}, service pack {win.service_pack!r})")
    else:
        lines.append(f"os: {platform.platform()}")
    lines.append(f"python: {platform.python_implementation()} {sys.version.split()[0]} "
                 f"({sys.executable})")
    return lines, usable


def describe_environment() -> list[str]:
    """The lines ``--info`` prints: backend and why (or why none can be
    used), OS build, Python."""
    return _describe()[0]


def _run_script(path: str, args: list[str]) -> None:
    # As `python script.py` does: argv[0] is the path as given and the
    # script's directory comes first on sys.path, replacing ours.
    sys.argv[:] = [path, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    runpy.run_path(path, run_name="__main__")


def _raised_by_module_lookup(exc: ImportError) -> bool:
    """Whether runpy raised ``exc`` while looking the module up (no such
    module, a package without __main__, ...), before any of its code ran:
    `python -m` reports those in one line. An ImportError of the module's
    own code, or of its parent package's ``__init__``, has the raising
    frame further down and keeps its traceback, as under `python -m`."""
    if type(exc) is not ImportError:
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    lookup: Callable[..., Any] = getattr(runpy, "_get_module_details", None)  # type: ignore[assignment]
    return lookup is not None and tb.tb_frame.f_code is lookup.__code__


def _run_module(module: str, args: list[str]) -> int:
    # As `python -m module` does: the current directory stays sys.path[0]
    # (it already is, since we were started with -m), and runpy sets
    # sys.argv[0] to the module's file.
    sys.argv[:] = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except ImportError as exc:
        if not _raised_by_module_lookup(exc):
            raise
        # `python -m` prints "<python>: No module named x" and exits 1.
        sys.stderr.write(f"{sys.executable}: {exc}\n")
        return 1
    return 0


def _run_command(command: str, args: list[str]) -> None:
    # As `python -c command` does: argv[0] is "-c", the current directory
    # ("") first on sys.path, and the code runs in a fresh __main__ module.
    sys.argv[:] = ["-c", *args]
    sys.path[0] = ""
    main_module = types.ModuleType("__main__")
    main_module.__dict__["__builtins__"] = builtins
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main_module
    try:
        exec(compile(command, "<string>", "exec"), main_module.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _refuse(problem: str) -> int:
    sys.stderr.write(f"socknotify_loop: cannot run the program: {problem}\n")
    return 1


def _usage_error(message: str) -> int:
    """A command-line mistake: one line saying what, one with the way out."""
    sys.stderr.write(f"socknotify_loop: {message}\n{HINT}\n")
    return 2


def _program_frames(tb: TracebackType | None) -> TracebackType | None:
    """``tb`` without its leading frames in this module and in runpy: what
    `python script.py` would show for the same exception."""
    # By module name: runpy is frozen on Python 3.11+ ("<frozen runpy>").
    while tb is not None and tb.tb_frame.f_globals.get("__name__") in ("runpy", __name__):
        tb = tb.tb_next
    return tb


def _report_uncaught(exc: BaseException) -> int:
    """What Python does with an exception nobody caught, but with the
    launcher's own frames left out of the traceback: ``sys.excepthook``
    (which a program may have replaced), then status 1; a
    KeyboardInterrupt ends the process by SIGINT, as Python's does, so
    the parent shell sees the interruption."""
    exc = exc.with_traceback(_program_frames(exc.__traceback__))
    sys.excepthook(type(exc), exc, exc.__traceback__)
    if isinstance(exc, KeyboardInterrupt):
        sys.stdout.flush()
        sys.stderr.flush()
        if sys.platform == "win32":
            return 0xC000013A   # STATUS_CONTROL_C_EXIT, Python's status on Windows
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 128 + signal.SIGINT  # not reached: SIGINT's default action ends us
    return 1


def _launch(run: Callable[[], Any]) -> int:
    """Set the loop up, then ``run`` the program; its SystemExit
    propagates, as it would without the launcher."""
    problem = _backend_problem()
    if problem:
        return _refuse(problem)
    _cover_child_processes()
    use_socknotify_loop()
    try:
        status = run()
    except SystemExit:
        raise
    except BaseException as exc:
        return _report_uncaught(exc)
    return status if isinstance(status, int) else 0


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    """The command line; returns the exit status (the program's own
    ``SystemExit`` propagates, as it would without the launcher)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(f"{USAGE_LINE}\n{HINT}\n")
        return 2
    first = args[0]
    if first in ("-h", "--help"):
        out.write(USAGE)
        return 0
    if first == "--info":
        lines, usable = _describe()
        out.write("\n".join(lines) + "\n")
        return 0 if usable else 1
    if first == "--probe-os":
        from .probe import main as probe_main
        return probe_main(out)
    if first == "--version":
        from ._version import __version__
        out.write(f"socknotify_loop {__version__}\n")
        return 0
    if first == "-m":
        if len(args) < 2:
            return _usage_error("-m needs a module name (python -m socknotify_loop -m module)")
        return _launch(lambda: _run_module(args[1], args[2:]))
    if first == "-c":
        if len(args) < 2:
            return _usage_error("-c needs a command (python -m socknotify_loop -c 'code')")
        return _launch(lambda: _run_command(args[1], args[2:]))
    if first.startswith("-"):
        return _usage_error(f"unknown option {first}")
    if not os.path.exists(first):
        # What `python no_such_file.py` prints, with the same status.
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(first)!r}: "
                         f"[Errno {errno.ENOENT}] {os.strerror(errno.ENOENT)}\n")
        return 2
    return _launch(lambda: _run_script(first, args[1:]))
