"""CPython's loop-level test_asyncio mixins bound to socknotify_loop.Loop.

Each stock loop has a concrete class in CPython (``EPollEventLoopTests``,
``SelectEventLoopTests`` ...); these are the same mixins with a factory that
returns our loop.
"""
import unittest

from socknotify_loop import Loop

from ._bind import bound_class, cpython_test_module, first_attr

test_utils = cpython_test_module("test_asyncio.utils")
test_events = cpython_test_module("test_asyncio.test_events")
test_sock_lowlevel = cpython_test_module("test_asyncio.test_sock_lowlevel")
test_server = cpython_test_module("test_asyncio.test_server")
test_buffered_proto = cpython_test_module("test_asyncio.test_buffered_proto")
test_sendfile = cpython_test_module("test_asyncio.test_sendfile")

_events_mixin = first_attr(test_events, "UnixEventLoopTestsMixin", "EventLoopTestsMixin")
# SubprocessTestsMixin on every platform: on Windows the loop runs
# subprocesses as overlapped I/O on its own port (socknotify_loop._windows_io).
_events_bases = (_events_mixin, test_events.SubprocessTestsMixin)

NotifyEventLoopTests = bound_class(
    "NotifyEventLoopTests", _events_bases + (test_utils.TestCase,),
    "create_event_loop", Loop)

NotifySockTests = bound_class(
    "NotifySockTests", (test_sock_lowlevel.BaseSockTestsMixin, test_utils.TestCase),
    "create_event_loop", Loop)

NotifyStartServerTests = bound_class(
    "NotifyStartServerTests", (test_server.BaseStartServer, unittest.TestCase),
    "new_loop", Loop)

NotifyBufferedProtocolTests = bound_class(
    "NotifyBufferedProtocolTests",
    (test_buffered_proto.BaseTestBufferedProtocol, unittest.TestCase),
    "new_loop", Loop)

NotifySendfileTests = bound_class(
    "NotifySendfileTests", (test_sendfile.SendfileTestsBase, test_utils.TestCase),
    "create_event_loop", Loop)
