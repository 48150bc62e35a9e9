"""Conformance runs of CPython's own tests against NotifySelector and Loop.

- Exclusions: every test that cannot apply is listed in ``exclusions.txt``
  with its reason; it is skipped with that reason, nothing else is.
- Modules that build their loops with ``asyncio.new_event_loop()``, a
  policy, ``asyncio.EventLoop()`` or ``asyncio.SelectorEventLoop()`` (not a
  factory method of ours) are run with our Loop made what those give for
  the duration of each test, and every module one of whose tests ran must
  have created at least one of our loops, or the run fails: a binding that
  silently tested the stock loop would otherwise pass unnoticed. A module
  whose tests make no loop at all (asyncio's own code on mocks and
  simulated loops) says so with ``MAKES_NO_LOOP`` and why; one that binds
  our selector alone with ``BINDS_SELECTOR_ONLY``.
"""
from __future__ import annotations

import asyncio
import fnmatch
import importlib
import os
import sys

import pytest

from socknotify_loop import Loop
from socknotify_loop.selector import NotifySelector

HERE = os.path.dirname(os.path.abspath(__file__))
_created = {}   # module name -> number of our loops created by its tests


def _load_exclusions():
    """Lines: ``<pattern> [py<=X.Y|py>=X.Y|win32|linux|backend=B|transports=T ...] # reason``."""
    entries = []
    with open(os.path.join(HERE, "exclusions.txt"), encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            spec, _, reason = line.partition("#")
            words = spec.split()
            if not reason.strip():
                raise ValueError(f"exclusions.txt:{number}: an exclusion needs a reason")
            entries.append((words[0], words[1:], reason.strip()))
    return entries


def _applies(conditions) -> bool:
    version = sys.version_info[:2]
    for condition in conditions:
        if condition in ("win32", "linux"):
            if not sys.platform.startswith(condition):
                return False
        elif condition.startswith("py<="):
            if version > tuple(int(x) for x in condition[4:].split(".")):
                return False
        elif condition.startswith("py>="):
            if version < tuple(int(x) for x in condition[4:].split(".")):
                return False
        elif condition.startswith("transports="):
            # The loop's socket transports (Loop(transports=...)): its own
            # unless SOCKNOTIFY_TRANSPORTS says asyncio's.
            if (os.environ.get("SOCKNOTIFY_TRANSPORTS") or "own") != condition[11:]:
                return False
        elif condition.startswith("backend="):
            from socknotify_loop.port import backend_info
            if backend_info()["backend"] != condition[8:]:
                return False
        else:
            raise ValueError(f"unknown exclusion condition {condition!r}")
    return True


EXCLUSIONS = _load_exclusions()

#: SOCKNOTIFY_CONFORMANCE=light (tox.ini sets it on the middle Python
#: versions, to keep CI's time): only the modules that drive the loop's own
#: machinery (its selector, sockets, transports, subprocesses and pipes, SSL
#: over its transports; test_base_events' connections and endpoints made on
#: the loop's transports with mocked sockets, test_unix_events' signal
#: handlers and pipe transports on the loop, test_events' handles, policies
#: and get_event_loop() around it, all three a few seconds) run. The rest
#: test asyncio's own code on top of any loop (tasks, task groups, locks,
#: queues, timeouts, wait_for, to_thread, runners, contexts, staggered and
#: eager tasks) or on mocks and simulated loops only (futures, whose three
#: test_future_del_collect make a hundred full garbage collections each,
#: 20 s apiece in a process holding every conformance module; pep492,
#: protocols, transports, selector_events, proactor_events); they run
#: whole on the oldest and the newest version and on Windows. Unset or
#: ``full``: every module.
LIGHT_MODULES = frozenset({
    "test_cpython_selectors.py", "test_cpython_asyncio_loop.py",
    "test_cpython_asyncio_streams.py", "test_cpython_asyncio_sslproto.py",
    "test_cpython_asyncio_subprocess.py", "test_cpython_asyncio_windows_io.py",
    "test_cpython_asyncio_base_events.py", "test_cpython_asyncio_unix_events.py",
    "test_cpython_asyncio_events.py",
})


def _conformance_set() -> str:
    value = os.environ.get("SOCKNOTIFY_CONFORMANCE", "full")
    if value not in ("full", "light"):
        raise pytest.UsageError(
            f"SOCKNOTIFY_CONFORMANCE={value!r}: expected 'full' or 'light'")
    return value


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _conformance_set() == "light":
        terminalreporter.write_line(
            f"conformance: the light set, {len(LIGHT_MODULES)} modules "
            "(SOCKNOTIFY_CONFORMANCE=full runs every module)")
    # Every test that failed its first run, with the first line of that
    # failure's error (or the report's last line), whatever its second run
    # gave.
    for report in terminalreporter.stats.get("rerun", []):
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            why = crash.message.splitlines()[0] if crash.message else "?"
        else:
            text = str(report.longrepr or "").strip().splitlines()
            why = text[-1] if text else "?"
        terminalreporter.write_line(f"RERUN {report.nodeid}: the first run failed: {why}"[:600])


def pytest_ignore_collect(collection_path, config):
    name = collection_path.name
    # uvloop's suites (test_uvloop_suites.py) run with the full set only:
    # the oldest and newest Pythons are enough for a second opinion on the
    # transports that CPython's suites already drive on every version.
    if (_conformance_set() == "light"
            and (name.startswith("test_cpython_") or name == "test_uvloop_suites.py")
            and name.endswith(".py") and name not in LIGHT_MODULES):
        # A module named on the command line runs whatever the set.
        named = {os.path.basename(arg.split("::")[0]) for arg in config.args}
        return name not in named
    return None


def _reruns() -> int:
    """How many times a failed conformance test runs again (default 1)."""
    value = os.environ.get("SOCKNOTIFY_CONFORMANCE_RERUNS", "1")
    if not value.isdigit():
        raise pytest.UsageError(
            f"SOCKNOTIFY_CONFORMANCE_RERUNS={value!r}: expected a count (0 for none)")
    return int(value)


def pytest_collection_modifyitems(config, items):
    # CPython's and uvloop's suites bound to our loop hold tests with
    # timing bounds (SSL handshakes and shutdowns in a fraction of a
    # second, sleeps raced against callbacks) that can fail on a machine
    # running three suites on two cores. A failed one runs once more
    # (pytest-rerunfailures): a fault of the loop fails both runs, and the
    # summary names every test that needed the second (below), so a test
    # that only ever passes the second time is seen and looked into. The
    # project's own tests are never rerun.
    reruns = _reruns() if config.pluginmanager.hasplugin("rerunfailures") else 0
    for item in items:
        if not item.nodeid.startswith("tests/conformance/") and "conformance" not in item.nodeid:
            continue
        short = item.nodeid.split("conformance/", 1)[-1]
        for pattern, conditions, reason in EXCLUSIONS:
            if fnmatch.fnmatchcase(short, pattern) and _applies(conditions):
                item.add_marker(pytest.mark.skip(reason=f"excluded: {reason}"))
                break
        else:
            if reruns and not item.get_closest_marker("flaky"):
                item.add_marker(pytest.mark.flaky(reruns=reruns))


# Python 3.14+ deprecates the policy API: asyncio.DefaultEventLoopPolicy is
# served with a DeprecationWarning, and the default policy comes from the
# platform module's _DefaultEventLoopPolicy (events._init_event_loop_policy
# imports it from there), so that is the name to replace.
if sys.version_info >= (3, 14):
    _PLATFORM_EVENTS = importlib.import_module(
        "asyncio.windows_events" if sys.platform == "win32" else "asyncio.unix_events")
    _StockDefaultPolicy = _PLATFORM_EVENTS._DefaultEventLoopPolicy
    _set_policy = asyncio.events._set_event_loop_policy
else:
    _PLATFORM_EVENTS = None
    _StockDefaultPolicy = asyncio.DefaultEventLoopPolicy
    _set_policy = asyncio.set_event_loop_policy


_StockSelectorEventLoop = asyncio.SelectorEventLoop


class _SelectorEventLoopMeta(type):
    """What ``asyncio.SelectorEventLoop`` is while a conformance test runs.

    Called without a selector (what CPython's tests mean by the platform's
    selector loop: test_base_events', test_unix_events' and test_sslproto's
    set-ups, among others), it makes our Loop; with a NotifySelector, our
    Loop on it; with any other selector (a stock one, or a test's mock,
    which our Loop refuses), asyncio's own loop on it, the loop that test
    is about. ``isinstance`` and ``issubclass`` answer as for asyncio's
    class, of which our Loop is a subclass."""

    def __call__(cls, selector=None):
        if selector is None or isinstance(selector, NotifySelector):
            return Loop(selector)
        return _StockSelectorEventLoop(selector)

    def __instancecheck__(cls, instance) -> bool:
        return isinstance(instance, _StockSelectorEventLoop)

    def __subclasscheck__(cls, subclass) -> bool:
        return issubclass(subclass, _StockSelectorEventLoop)


class _SelectorEventLoop(metaclass=_SelectorEventLoopMeta):
    """asyncio.SelectorEventLoop's stand-in (see its metaclass)."""


class _ConformancePolicy(_StockDefaultPolicy):
    """The platform's default policy (child watchers and all on Unix),
    creating our Loop: what CPython's tests expect a default policy to be."""
    _loop_factory = Loop


@pytest.fixture(autouse=True)
def _our_loop_by_default(request, monkeypatch):
    """Make asyncio.new_event_loop() and the default policy give our Loop,
    and count our loops per module."""
    module = request.node.module.__name__
    original_init = Loop.__init__

    def counting_init(self, *args, **kwargs):
        _created[module] = _created.get(module, 0) + 1
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(Loop, "__init__", counting_init)
    if _PLATFORM_EVENTS is not None:
        # asyncio.DefaultEventLoopPolicy itself is left to asyncio's module
        # __getattr__, which serves this name of the platform module with
        # its DeprecationWarning (test_events' PolicyTests expects it): a
        # name put in asyncio's dict would hide both.
        monkeypatch.setattr(_PLATFORM_EVENTS, "_DefaultEventLoopPolicy", _ConformancePolicy)
    else:
        monkeypatch.setattr(asyncio, "DefaultEventLoopPolicy", _ConformancePolicy)
    monkeypatch.setattr(asyncio.events, "_event_loop_policy", None, raising=False)
    if hasattr(asyncio, "EventLoop"):
        # 3.13+: tests that build asyncio.EventLoop() themselves get ours.
        monkeypatch.setattr(asyncio, "EventLoop", Loop)
    # Tests that build asyncio.SelectorEventLoop() themselves get ours too.
    monkeypatch.setattr(asyncio, "SelectorEventLoop", _SelectorEventLoop)
    # CPython's suites run on a policy whose set_event_loop(None) has been
    # called by an earlier test's tearDown; some tests depend on that
    # (get_event_loop() then raises instead of creating a loop).
    asyncio.set_event_loop(None)
    yield
    _set_policy(None)


_ran = set()   # node ids of the tests that ran (not skipped, by a mark or at run time)


def pytest_runtest_logreport(report):
    if report.when == "call" and not report.skipped:
        _ran.add(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    # A module counts once one of its tests ran: one whose every test was
    # skipped (excluded, or skipped by CPython's suite on this platform)
    # made no loop because it ran nothing.
    ran = {item.module.__name__ for item in session.items
           if "conformance" in item.nodeid and item.nodeid in _ran
           and not getattr(item.module, "BINDS_SELECTOR_ONLY", False)
           and not getattr(item.module, "MAKES_NO_LOOP", False)}
    silent = sorted(m for m in ran if not _created.get(m))
    if silent and exitstatus == 0 and not session.config.option.collectonly:
        print(f"\nconformance: these modules never created a socknotify_loop Loop: {silent}")
        session.exitstatus = 1
