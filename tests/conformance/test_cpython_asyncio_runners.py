"""CPython's test_asyncio.test_runners, run with our Loop as the default loop
(conftest.py makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_runners"))

# No test of this module makes a loop of ours up to 3.12 (conftest.py's check
# that each module made one does not apply): asyncio.run() and its Runner run
# on a policy of the test's own, whose loops are asyncio.BaseEventLoop with
# mocks; from 3.13 some of its tests make our Loop through the default policy.
MAKES_NO_LOOP = True
