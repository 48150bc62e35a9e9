"""Bases for behaviour tests run against our Loop AND stock asyncio.

Each behaviour is written once as a mixin and bound twice, uvloop-style::

    class _TestTCP:                      # the behaviour, using self.loop
        def test_echo(self): ...

    class TestNotifyTCP(_TestTCP, NotifyTestCase): pass    # socknotify_loop
    class TestAsyncioTCP(_TestTCP, AsyncioTestCase): pass  # the reference

If the asyncio variant fails, the test is wrong; if only ours fails, the
loop is. tearDown fails a test whose loop reported an exception to its
exception handler that the test did not expect, or that left the loop
running or tasks pending.
"""
from __future__ import annotations

import asyncio
import gc
import sys
import unittest
from typing import Any, Dict, List

from socknotify_loop import Loop


class BaseLoopTestCase(unittest.TestCase):
    """Creates ``self.loop`` with :meth:`new_loop`, fails on unexpected
    exception-handler calls, closes the loop."""

    #: set by a test that expects the exception handler to be called
    expect_loop_exceptions = False

    def new_loop(self) -> asyncio.AbstractEventLoop:
        raise NotImplementedError

    def setUp(self) -> None:
        self.loop = self.new_loop()
        self.loop_exceptions: List[Dict[str, Any]] = []
        self.loop.set_exception_handler(self._record_loop_exception)
        asyncio.set_event_loop(None)

    def _record_loop_exception(self, loop, context: Dict[str, Any]) -> None:
        self.loop_exceptions.append(context)
        if not self.expect_loop_exceptions:
            loop.default_exception_handler(context)

    def tearDown(self) -> None:
        loop = self.loop
        try:
            self.assertFalse(loop.is_running(), "the test left the loop running")
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
            asyncio.set_event_loop(None)
            gc.collect()
        if not self.expect_loop_exceptions and self.loop_exceptions:
            self.fail(f"unexpected calls to the loop's exception handler: "
                      f"{self.loop_exceptions!r}")

    def run_loop(self, coro, timeout: float = 30.0):
        """Run ``coro`` to completion on ``self.loop``, at most ``timeout`` s."""
        return self.loop.run_until_complete(asyncio.wait_for(coro, timeout))


class NotifyTestCase(BaseLoopTestCase):
    """Runs the mixin's tests on socknotify_loop's Loop."""

    implementation = "socknotify"

    def new_loop(self) -> asyncio.AbstractEventLoop:
        return Loop()


class AsyncioTestCase(BaseLoopTestCase):
    """Runs the mixin's tests on stock asyncio's SelectorEventLoop (the reference)."""

    implementation = "asyncio"

    def new_loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop()


skip_unless_posix = unittest.skipIf(sys.platform == "win32", "POSIX only")
