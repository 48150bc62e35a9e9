"""uvloop's own TCP and UDP suites (``tests/test_tcp.py``, ``tests/test_udp.py``
of its sdist) on our Loop, judged against stock asyncio's loop.

uvloop writes each suite as a mixin bound twice: ``Test_UV_*`` on uvloop,
``Test_AIO_*`` on asyncio's loop (``uvloop._testbase.AIOTestCase``, whose
``new_loop``/``new_policy`` ask asyncio for its default). Only the
``Test_AIO_*`` classes apply here: they expect asyncio's behaviour, which
our Loop keeps. Each of their tests runs in three ways, one pytest item each:

- ``stock``: the class as uvloop wrote it, its loop asyncio's own
  ``SelectorEventLoop`` (the reference);
- ``own``: the same class with our ``Loop`` on its own transports;
- ``asyncio``: our ``Loop`` on asyncio's transports (``transports="asyncio"``).

A test failing on our Loop fails its item only when it passes on the stock
loop; when the stock loop fails it too, the item is an xfail that quotes the
stock loop's failure. The tests are not copied into this repository: they
are fetched from the package index for the installed uvloop's version
(``pip download --no-binary uvloop``) into a cache folder, and only the
sdist's ``tests/`` folder is unpacked. Without uvloop (PyPy, Windows: it has
no build there) or pyOpenSSL (``test_tcp.py`` imports it) the module skips,
naming what is missing.
"""
from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest
from importlib import metadata
from typing import Dict, List, Tuple

import pytest
import servers

from socknotify_loop import Loop

from .conftest import _ConformancePolicy, _StockDefaultPolicy

#: Names of the suites' files in uvloop's sdist, and the classes run from them.
SUITES = ("test_tcp.py", "test_udp.py")
CLASS_PREFIX = "Test_AIO_"
KINDS = ("stock", "own", "asyncio")


#: Where the ``integrations`` extra installs uvloop and pyOpenSSL (its
#: environment markers): elsewhere their absence is a skip even in CI.
UVLOOP_EXISTS = sys.platform != "win32" and sys.implementation.name == "cpython"


def _skip_module(reason: str) -> None:
    """Skip the module, or fail it where CI requires every integration."""
    if not UVLOOP_EXISTS:
        pytest.skip(reason, allow_module_level=True)
    try:
        servers.skip_or_fail(reason)
    except pytest.skip.Exception as exc:
        # skip_or_fail skips one test; a module-level skip needs the flag.
        pytest.skip(str(exc.msg), allow_module_level=True)


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "socknotify_loop", "uvloop-tests")


def _fetch_tests(version: str) -> str:
    """The ``tests/`` folder of uvloop ``version``'s sdist, fetched once into
    the cache folder; skips (or fails, in CI) when it cannot be had."""
    target = os.path.join(_cache_root(), version, "tests")
    if os.path.isfile(os.path.join(target, SUITES[0])):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(target)) as work:
        # --no-binary uvloop: the sdist, the only distribution with the
        # tests; its build requirements may come as wheels (building them
        # from source too takes minutes). pip prepares the sdist's metadata,
        # which needs those build requirements, not a compiler.
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                   "--no-binary", "uvloop", f"uvloop=={version}", "--dest", work]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            _skip_module(f"uvloop {version}'s sdist could not be fetched: pip download "
                         "took over 300 s")
        archives = [name for name in os.listdir(work) if name.endswith(".tar.gz")]
        if done.returncode != 0 or not archives:
            _skip_module(f"uvloop {version}'s sdist could not be fetched (pip download "
                         f"exited {done.returncode}): {done.stderr.strip()[-300:]}")
        unpacked = os.path.join(work, "unpacked")
        with tarfile.open(os.path.join(work, archives[0])) as archive:
            members = [m for m in archive.getmembers()
                       if m.name.split("/")[1:2] == ["tests"] and (m.isfile() or m.isdir())]
            if not members:
                _skip_module(f"uvloop {version}'s sdist ships no tests/ folder")
            archive.extractall(unpacked, members=members)   # noqa: S202 (files and folders only)
        source = os.path.join(unpacked, members[0].name.split("/")[0], "tests")
        try:
            # Atomic: two test runs side by side (tools/test_all.py runs
            # three environments at a time) may both fetch it.
            os.rename(source, target)
        except OSError:
            if not os.path.isfile(os.path.join(target, SUITES[0])):
                raise
        shutil.rmtree(unpacked, ignore_errors=True)
    return target


def _load_suites() -> Dict[str, type]:
    """uvloop's ``Test_AIO_*`` classes, by ``<file>::<class>``."""
    try:
        version = metadata.version("uvloop")
        importlib.import_module("uvloop._testbase")
    except (ImportError, metadata.PackageNotFoundError) as exc:
        _skip_module(f"uvloop is not installed ({exc}): it has no Windows or PyPy build; "
                     "elsewhere pip install -e '.[test,integrations]'")
    try:
        importlib.import_module("OpenSSL")
    except ImportError as exc:
        _skip_module(f"pyOpenSSL is not installed ({exc}): uvloop's test_tcp.py "
                     "imports it; pip install -e '.[test,integrations]'")
    folder = _fetch_tests(version)
    classes = {}
    for filename in SUITES:
        name = f"_uvloop_{version.replace('.', '_')}_{filename[:-3]}"
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, filename))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        for attr, value in vars(module).items():
            if attr.startswith(CLASS_PREFIX) and isinstance(value, type):
                classes[f"{filename}::{attr}"] = value
    if not classes:
        pytest.fail(f"uvloop {version}'s {SUITES} define no {CLASS_PREFIX}* class",
                    pytrace=False)
    return classes


def _bound(base: type, kind: str) -> type:
    """``base`` with its loop and policy made for ``kind``.

    The conformance conftest makes asyncio's default policy and
    ``new_event_loop()`` create our Loop, so the stock reference names
    asyncio's loop and policy explicitly instead of asking for the default.
    """
    if kind == "stock":
        def new_loop(self):
            return asyncio.SelectorEventLoop()

        def new_policy(self):
            return _StockDefaultPolicy()
    else:
        def new_loop(self):
            return Loop(transports=kind)

        def new_policy(self):
            return _ConformancePolicy()
    # uvloop's is_asyncio_loop() asks whether the loop's class comes from
    # the asyncio package; ours is asyncio's SelectorEventLoop subclassed
    # elsewhere, and must take the tests' asyncio branches (one of them
    # otherwise waits in an executor thread for a datagram asyncio's
    # transports never send, and the process cannot exit).
    return type(f"{base.__name__}_{kind}", (base,),
                {"new_loop": new_loop, "new_policy": new_policy,
                 "is_asyncio_loop": lambda self: True, "__module__": __name__})


CLASSES = _load_suites()
CASES: List[str] = [f"{where}::{method}" for where, cls in CLASSES.items()
                    for method in unittest.TestLoader().getTestCaseNames(cls)]
#: The stock loop's outcome per case: ("passed"|"failed"|"skipped", detail).
_REFERENCE: Dict[str, Tuple[str, str]] = {}


def _run(case: str, kind: str) -> Tuple[str, str]:
    """Run one of uvloop's tests in unittest's own way; its outcome and text."""
    where, method = case.rsplit("::", 1)
    test = _bound(CLASSES[where], kind)(method)
    result = unittest.TestResult()
    test.run(result)
    problems = result.failures + result.errors
    if problems:
        return "failed", "\n".join(text for _, text in problems)
    if result.unexpectedSuccesses:
        return "failed", "an unexpected success"
    if result.skipped:
        return "skipped", result.skipped[0][1] or "no reason given"
    return "passed", ""


def _reference(case: str) -> Tuple[str, str]:
    if case not in _REFERENCE:
        _REFERENCE[case] = _run(case, "stock")
    return _REFERENCE[case]


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind,case", [(kind, case) for kind in KINDS for case in CASES])
def test_uvloop_suite(kind: str, case: str) -> None:
    """One of uvloop's tests on ``kind``'s loop; on ours, no failure the
    stock loop does not have too."""
    outcome, detail = _reference(case) if kind == "stock" else _run(case, kind)
    if outcome == "skipped":
        pytest.skip(f"skipped by uvloop's suite on asyncio's loop: {detail}")
    if outcome == "passed":
        return
    if kind == "stock":
        pytest.xfail(f"stock asyncio's loop fails it (the reference): {_last_line(detail)}")
    reference, reference_detail = _reference(case)
    if reference == "failed":
        pytest.xfail(f"stock asyncio's loop fails it too: {_last_line(reference_detail)}")
    pytest.fail(f"fails on our Loop (transports={kind!r}), {reference} on stock "
                f"asyncio's loop:\n{detail}", pytrace=False)
