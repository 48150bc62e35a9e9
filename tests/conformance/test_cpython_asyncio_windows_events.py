"""CPython's test_asyncio.test_windows_events, run with our Loop as the default loop
(conftest.py makes asyncio's default policy, asyncio.new_event_loop() and
asyncio.SelectorEventLoop() create it). Its mixins are bound to our Loop in
test_cpython_asyncio_loop.py; the classes that bind them to stock loops are
excluded here (exclusions.txt)."""
from ._bind import cpython_test_module, reexport

reexport(globals(), cpython_test_module("test_asyncio.test_windows_events"))

# No test of this module makes a loop of ours (conftest.py's check that each
# module made one does not apply): on Windows its classes run asyncio's
# proactor loop (excluded there: test_cpython_asyncio_windows_io.py binds
# ProactorTests to our Loop) or set asyncio's own Windows policies and check
# which stock loop each makes (WinPolicyTests).
MAKES_NO_LOOP = True
