"""CPython's test_asyncio.test_threads, run with our Loop as the default loop
(conftest.py makes asyncio's default policy create it)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_threads"))
