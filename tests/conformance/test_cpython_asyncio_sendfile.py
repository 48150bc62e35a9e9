"""CPython's test_asyncio.test_sendfile, run with our Loop as the default loop
(conftest.py makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it). Its mixins are bound to our Loop in
test_cpython_asyncio_loop.py; the classes that bind them to stock loops are
excluded here (exclusions.txt)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_sendfile"))
