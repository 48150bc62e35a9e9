"""CPython's test_asyncio.test_selector_events, run with our Loop as the default loop
(conftest.py makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_selector_events"))

# No test of this module makes a loop of ours (conftest.py's check that each
# module made one does not apply): unit tests of asyncio's own
# BaseSelectorEventLoop and selector transports, on a mocked selector and
# test_utils.TestLoop: the classes under test are asyncio's, which our Loop
# inherits or replaces (its own transports are held to asyncio's behaviour by
# tests/test_transports.py).
MAKES_NO_LOOP = True
