"""Why the tests of a run were skipped, counted by kind: the one line
tests/conftest.py prints at the end of every pytest run, e.g.

    skipped 235: 174 backend not on this OS, 58 Windows only, 3 another Python version

A skip's reason is sorted into a kind by what it says (our own reasons:
_platform.py's marks, conftest.py's backend parameters, version checks,
servers.py's need(); CPython's, in the conformance suites). A reason no
rule knows is counted as "other" and printed as it is, so nothing hides.
Pure functions: tests/test_skips.py checks them.
"""
from __future__ import annotations

import re
import sys
from collections import Counter
from typing import Iterable

WINDOWS_ONLY = "Windows only"
NOT_WINDOWS = "Linux/POSIX only"
VERSION = "another Python version"
IMPLEMENTATION = "another Python implementation"
BACKEND = "backend not on this OS"
WINE = "not under Wine"
LIBRARY = "optional library missing"
EXCLUDED = "conformance exclusion"
MACHINE = "tool or OS feature missing here"
CHECKOUT = "developer run or partial tree"
CHANCE = "case not reproducible here"
UPSTREAM = "skipped by CPython's suite"
UVLOOP = "skipped by uvloop's suite"
UNEXPLAINED = "no reason given"
OTHER = "other"


def _search(pattern: str, text: str) -> bool:
    return re.search(pattern, text, re.IGNORECASE) is not None


# Reasons naming the case they skip, whatever the platform: (kind, pattern),
# the first match wins.
_FIXED_RULES = [
    # conftest.py's backend parameters; the tests of one backend's ways.
    (BACKEND, r"^backend '?\w+'? unavailable|^epoll only$|epoll applies each change"
              r"|strict model cannot see"),
    # tests/conformance/conftest.py: exclusions.txt's entries.
    (EXCLUDED, r"^excluded: "),
    (CHECKOUT, r"not shipped here|beside the tests|developer run"),
    # What the OS or this machine did not let the test set up.
    (CHANCE, r"never reused|no new socket took|refused synchronously|main thread only"
             r"|every backend is available"),
    # servers.py: no PostgreSQL or Redis server to test against.
    (MACHINE, r"no server address|could not be started"),
    (WINE, r"\bwine\b"),
    # CPython's suites skip some tests everywhere, as unreliable.
    # conformance/test_uvloop_suites.py: uvloop's own skips of its
    # Test_AIO_* tests, most without a reason (asyncio lacks the feature).
    (UVLOOP, r"^skipped by uvloop's suite"),
    (UPSTREAM, r"race condition|can hang|\bflaky\b|unreliable|unstable"),
]
# servers.py's need(), pytest.importorskip(), CPython's import_module(); a
# library version without the feature tested.
_LIBRARY = (r"is not installed|could not import|no module named|^no \w+ module$"
            r"|(needs?|requires?) (the )?(C )?\w+ module|modules are not available"
            r"|has no \w+ hook|may have dropped")
# Reasons naming a platform or an interpreter: what they mean depends on
# the one running (a Linux-only test is skipped here because this is Windows).
_WINDOWS = r"\bwindows\b|\bwin32\b|\bproactor|\boverlapped\b"
_POSIX = (r"\blinux\b|\bposix\b|\bunix\b|\bmacos\b|\bfork\b|setitimer|(?-i:\bSIG[A-Z]+\b)"
          r"|\bAF_UNIX\b|unix sockets|don't have|openpty|\bsignal\.\w+|/dev/")
# What Windows lacks, said without naming another OS.
_NOT_WINDOWS = (r"\b(on|for) windows\b|no windows port|stock windows selector"
                r"|windows (has|does) not|empty fd sets")
_IMPLEMENTATION = r"\bCPython\b|\bPyPy\b"
_VERSION = (r"\b3\.\d+\+|\bPython 3\.\d|\(3, \d+\)|\bnew in 3\.|\bfrom 3\.\d|\bon 3\.\d+"
            r"|versions? tested|one Python is enough|requires Python")
# A tool, an OS feature or an interpreter feature (a debug build's, -O's)
# that this machine or this Python lacks.
_MACHINE = (r"not found|no C compiler|cannot open|IPv6|not supported|does not support"
            r"|fdinfo|AddressSanitizer|has no attribute|optimized mode|limit reached"
            r"|failed to bind|thread-local context|\bneeds? \S|\brequires? \S|required for"
            r"|could not be downloaded"
            r"|(?-i:\bNo [A-Z][\w.]+)")


def classify(reason: str, platform: str = sys.platform,
             implementation: str = sys.implementation.name) -> str:
    """The kind of one skip, from its reason (pytest's, without the
    "Skipped: " prefix), as it applies on ``platform`` (sys.platform) with
    ``implementation`` (sys.implementation.name)."""
    reason = reason.strip()
    if not reason or reason == "Skipped":
        return UNEXPLAINED
    for kind, pattern in _FIXED_RULES:
        if _search(pattern, reason):
            return kind
    cpython = implementation == "cpython"
    if _search(r"CPython's test\.\S+ is not available", reason):
        # tests/conformance/_bind.py: PyPy has no CPython test package; a
        # CPython may ship it apart (Debian's libpythonX.Y-testsuite).
        return LIBRARY if cpython else IMPLEMENTATION
    if _search(_LIBRARY, reason):
        return LIBRARY
    windows = platform == "win32"
    if windows and (_search(_POSIX, reason) or _search(_NOT_WINDOWS, reason)):
        return NOT_WINDOWS
    if not windows and _search(_WINDOWS, reason):
        return WINDOWS_ONLY
    if not platform.startswith("linux") and _search(r"\blinux\b", reason):
        return NOT_WINDOWS
    if not cpython and _search(_IMPLEMENTATION, reason):
        return IMPLEMENTATION
    if _search(_VERSION, reason):
        return VERSION
    if _search(_MACHINE, reason):
        return MACHINE
    if cpython and _search(r"\bPyPy\b", reason):
        return IMPLEMENTATION
    return OTHER


def skip_reason(longrepr: object) -> str:
    """A skipped report's reason: pytest keeps (path, line, "Skipped: why")."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2])
    else:
        text = str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def summary_line(reasons: Iterable[str], platform: str = sys.platform,
                 implementation: str = sys.implementation.name) -> str:
    """``skipped N: a kind1, b kind2, ...``, the most frequent first; the
    "other" kind last, with each reason it holds quoted (and its count when
    more than one). An empty string when nothing was skipped."""
    reasons = [" ".join(reason.split()) for reason in reasons]
    if not reasons:
        return ""
    kinds: Counter = Counter()
    others: Counter = Counter()
    for reason in reasons:
        kind = classify(reason, platform, implementation)
        kinds[kind] += 1
        if kind == OTHER:
            others[reason] += 1
    parts = [f"{count} {kind}" for kind, count in
             sorted(kinds.items(), key=lambda item: (-item[1], item[0])) if kind != OTHER]
    if others:
        listed = "; ".join(f'"{reason}"' + (f" x{count}" if count > 1 else "")
                           for reason, count in others.most_common())
        parts.append(f"{kinds[OTHER]} {OTHER} ({listed})")
    return f"skipped {len(reasons)}: " + ", ".join(parts)
