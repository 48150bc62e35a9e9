"""Helpers that bind CPython's own test classes to our selector and loop.

CPython's ``Lib/test`` suites are written as mixins plus one concrete class
per stock loop (``EPollEventLoopTests(UnixEventLoopTestsMixin, ...)`` with
``create_event_loop`` returning ``SelectorEventLoop(EpollSelector())``).
We add one concrete class per mixin whose factory returns our Loop, so the
same test bodies run against socknotify_loop unchanged.

The ``test`` package comes from the running Python (the pyenv Pythons ship
it; the Windows Python under Wine gets a copy of the same minor version).
"""
from __future__ import annotations

import importlib
import platform
import sys
from typing import Optional

import pytest


def cpython_test_module(name: str):
    """Import ``test.<name>`` or skip the calling module with the reason."""
    try:
        return importlib.import_module(f"test.{name}")
    except ImportError as exc:
        pytest.skip(f"CPython's test.{name} is not available in this Python "
                    f"({platform.python_implementation()} {sys.version.split()[0]}): {exc}",
                    allow_module_level=True)


def first_attr(module, *names: str) -> Optional[type]:
    """The first of ``names`` that the module defines (they vary by version)."""
    for name in names:
        found = getattr(module, name, None)
        if found is not None:
            return found
    return None


def bound_class(name: str, bases: tuple, factory_name: str, factory) -> type:
    """A TestCase subclass of ``bases`` whose ``factory_name`` method builds our loop."""
    return type(name, bases, {factory_name: lambda self: factory(),
                              "__module__": sys._getframe(1).f_globals["__name__"]})


def reexport(namespace: dict, module, prefix: str = "") -> list:
    """Copy the TestCase classes ``module`` defines into ``namespace``
    (each under ``prefix`` + its name).

    For suites whose tests build loops with ``asyncio.new_event_loop()``,
    a policy or ``asyncio.SelectorEventLoop()``: conftest.py makes our
    loop the default while they run.
    """
    import asyncio
    import unittest

    from socknotify_loop import Loop
    stock = getattr(asyncio, "EventLoop", None)
    names = []
    for name, value in vars(module).items():
        if (isinstance(value, type) and issubclass(value, unittest.TestCase)
                and value.__module__ == module.__name__):
            if stock is not None and vars(value).get("loop_factory") is stock:
                # IsolatedAsyncioTestCase classes that name asyncio.EventLoop
                # as their loop factory (3.14+'s test_taskgroups): bound to
                # ours, or they would test the stock loop.
                value = type(name, (value,), {"loop_factory": Loop,
                                              "__module__": namespace["__name__"]})
            namespace[prefix + name] = value
            names.append(prefix + name)
    return names
