"""CPython's test_asyncio.test_tools (a newer Python's; skipped where the
running one has none), run with our Loop as the default loop (conftest.py
makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_tools"))

# No test of this module makes a loop of ours (conftest.py's check that each
# module made one does not apply): asyncio.tools builds the task trees and
# tables that `python -m asyncio ps` and `pstree` print, here from data the
# tests write out by hand, with no loop.
MAKES_NO_LOOP = True
