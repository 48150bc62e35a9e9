"""The cffi builder's Windows decisions (socknotify_loop/_build.py), checked
on any OS by playing the platform: a 32-bit Windows Python is refused with a
clear error before any compiler runs, and MSVC is asked for C11."""
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILDER = os.path.join(ROOT, "socknotify_loop", "_build.py")


def load_builder() -> ModuleType:
    # By path: the builder is a build-time file the wheel leaves out, and
    # importing it through the package would load the compiled core.
    spec = importlib.util.spec_from_file_location("socknotify_loop_build_test", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Struct:
    def __init__(self, pointer_size: int) -> None:
        self.pointer_size = pointer_size

    def calcsize(self, fmt: str) -> int:
        assert fmt == "P"
        return self.pointer_size


def _compile_args(builder_ffi) -> list:
    # cffi keeps set_source()'s keywords with the FFI object.
    return builder_ffi._assigned_source[3]["extra_compile_args"]


def test_32bit_windows_refused(monkeypatch):
    build = load_builder()
    monkeypatch.setattr(build.sys, "platform", "win32")
    monkeypatch.setattr(build, "struct", _Struct(4))
    with pytest.raises(RuntimeError, match="64-bit Windows only"):
        build.make_builder()


def test_msvc_compiles_c11(monkeypatch):
    build = load_builder()
    monkeypatch.setattr(build.sys, "platform", "win32")
    monkeypatch.setattr(build, "struct", _Struct(8))
    monkeypatch.setattr(build.sysconfig, "get_platform", lambda: "win-amd64")
    assert "/std:c11" in _compile_args(build.make_builder())
    monkeypatch.setattr(build.sysconfig, "get_platform", lambda: "win-arm64")
    assert "/std:c11" in _compile_args(build.make_builder())


def test_cross_build_and_linux_flags(monkeypatch):
    build = load_builder()
    monkeypatch.setattr(build.sys, "platform", "linux")
    # tools/wine/ passes its own mingw-w64 flags; Linux builds are C99.
    assert _compile_args(build.make_builder(target_windows=True)) == []
    assert "-std=c99" in _compile_args(build.make_builder(target_windows=False))
    assert sys.platform  # the real module was left alone
