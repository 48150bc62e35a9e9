"""CPython's Lib/test/test_selectors.py bound to NotifySelector."""
import sys
import unittest

from socknotify_loop.selector import NotifySelector

from ._bind import cpython_test_module

test_selectors = cpython_test_module("test_selectors")

# Tests the selector alone: conftest.py's check that every module created
# one of our loops does not apply.
BINDS_SELECTOR_ONLY = True


class NotifySelectorTestCase(test_selectors.BaseSelectorTestCase,
                             test_selectors.ScalableSelectorMixIn,
                             unittest.TestCase):
    SELECTOR = NotifySelector


if sys.platform.startswith("linux") and hasattr(test_selectors, "EpollSelectorTestCase"):
    # Linux: CPython's epoll-specific tests too (test_register_file: a
    # regular file is refused at register() and leaves no key behind), so
    # NotifySelector is held to exactly what EpollSelector does there.
    class NotifySelectorAsEpollTestCase(test_selectors.EpollSelectorTestCase):
        SELECTOR = NotifySelector
