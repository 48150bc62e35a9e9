"""CPython's test_asyncio.test_graph (a newer Python's; skipped where the
running one has none), run with our Loop as the default loop (conftest.py
makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_graph"))
