"""Every module of CPython's test.test_asyncio that no file here is named
after, run with our Loop as the default loop (conftest.py makes asyncio's
default policy, asyncio.new_event_loop() and asyncio.SelectorEventLoop()
create it): whatever a newer Python adds to the suite runs from its first
day, before a file of its own takes it over.

A file ``test_cpython_asyncio_<name>.py`` takes ``test_asyncio.test_<name>``;
the rest are found here with ``pkgutil`` and their test classes copied in
under ``<name>__<class>``. A module that refuses to load on this platform
(Windows-only ones raise unittest.SkipTest on import) is left out.
"""
import os
import pkgutil
import unittest

from ._bind import cpython_test_module, reexport

HERE = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "test_cpython_asyncio_"

package = cpython_test_module("test_asyncio")
named_here = {"test_" + name[len(_PREFIX):-3] for name in os.listdir(HERE)
              if name.startswith(_PREFIX) and name.endswith(".py")}
#: The modules this file runs, for the summary and the tests of this file.
TAKEN = []
for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
    if not info.name.startswith("test_") or info.name in named_here:
        continue
    try:
        module = __import__(f"test.test_asyncio.{info.name}", fromlist=["_"])
    except unittest.SkipTest:
        continue
    TAKEN.append(info.name)
    reexport(globals(), module, prefix=info.name[len("test_"):] + "__")
