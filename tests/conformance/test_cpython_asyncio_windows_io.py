"""CPython's Windows pipe and subprocess tests bound to socknotify_loop.Loop.

On Windows CPython runs these on ProactorEventLoop only (``ProactorTests``
in test_windows_events, ``SubprocessProactorTests`` in test_subprocess);
our Loop does the same overlapped I/O on its notification port, so the same
test bodies run with a setUp that makes our loop instead.
"""
import sys

import pytest

if sys.platform != "win32":
    pytest.skip("Windows overlapped I/O: CPython's Windows pipe and subprocess tests",
                allow_module_level=True)

from socknotify_loop import Loop  # noqa: E402

from ._bind import cpython_test_module  # noqa: E402

test_utils = cpython_test_module("test_asyncio.utils")
test_windows_events = cpython_test_module("test_asyncio.test_windows_events")
test_subprocess = cpython_test_module("test_asyncio.test_subprocess")


class NotifyPipeTests(test_windows_events.ProactorTests):
    """Named pipes, wait_for_handle and the self-pipe, on our Loop."""

    def setUp(self):
        # ProactorTests.setUp's parent (WindowsEventsTestCase on 3.12+,
        # test_utils.TestCase before), skipping the ProactorEventLoop it makes.
        super(test_windows_events.ProactorTests, self).setUp()
        self.loop = Loop()
        self.set_event_loop(self.loop)


class NotifySubprocessTests(test_subprocess.SubprocessMixin, test_utils.TestCase):
    """asyncio.subprocess (create_subprocess_exec/shell, streams), on our Loop."""

    def setUp(self):
        super().setUp()
        self.loop = Loop()
        self.set_event_loop(self.loop)

