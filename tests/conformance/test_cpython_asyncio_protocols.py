"""CPython's test_asyncio.test_protocols, run with our Loop as the default loop
(conftest.py makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_protocols"))

# No test of this module makes a loop of ours (conftest.py's check that each
# module made one does not apply): the protocol base classes' default methods:
# no loop at all.
MAKES_NO_LOOP = True
