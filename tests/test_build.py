"""The cffi builder's platform decisions (socknotify_loop/_build.py), checked
on any OS by playing the platform: a 32-bit Windows Python is refused with a
clear error before any compiler runs, MSVC is asked for C11, and a
free-threaded CPython with a cffi older than 2.0 is refused."""
from __future__ import annotations

import sys

import pytest
from _builder import load_builder


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


def test_free_threaded_windows_build_defines_py_gil_disabled(monkeypatch):
    build = load_builder()
    real = build.sysconfig.get_config_var
    monkeypatch.setattr(build.sys, "platform", "win32")
    monkeypatch.setattr(build, "struct", _Struct(8))
    monkeypatch.setattr(build.sysconfig, "get_platform", lambda: "win-amd64")
    monkeypatch.setattr(build.sysconfig, "get_config_var",
                        lambda name: 1 if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(build.cffi, "__version_info__", (2, 0, 0))
    macros = build.make_builder(testing=False)._assigned_source[3]["define_macros"]
    assert macros == [("Py_GIL_DISABLED", "1")]
    # Not on a GIL build, and not for the mingw-w64 cross-build from Linux.
    monkeypatch.setattr(build.sysconfig, "get_config_var",
                        lambda name: None if name == "Py_GIL_DISABLED" else real(name))
    assert build.make_builder(testing=False)._assigned_source[3]["define_macros"] == []
    monkeypatch.setattr(build.sys, "platform", "linux")
    assert build.make_builder(target_windows=True,
                              testing=False)._assigned_source[3]["define_macros"] == []


def test_test_build_alone_compiles_and_declares_the_strict_model(monkeypatch):
    """A production build (the wheels, ``pip install .``) carries no test
    code: the core is compiled without SN_TESTING, which leaves out the
    strict model, its controls and the strict backend, and its cdef
    declares none of them. A test build (SOCKNOTIFY_TESTING=1) has both."""
    build = load_builder()
    monkeypatch.delenv(build.TESTING, raising=False)
    production = build.make_builder()
    assert ("SN_TESTING", "1") not in production._assigned_source[3]["define_macros"]
    declared = "".join(production._cdefsources)
    assert "sn_model_control" not in declared and "SN_BACKEND_STRICT" not in declared
    monkeypatch.setenv(build.TESTING, "1")
    testing = build.make_builder()
    assert ("SN_TESTING", "1") in testing._assigned_source[3]["define_macros"]
    declared = "".join(testing._cdefsources)
    assert "sn_model_control" in declared and "SN_BACKEND_STRICT" in declared


def test_free_threaded_build_needs_cffi_2(monkeypatch):
    build = load_builder()
    real = build.sysconfig.get_config_var
    monkeypatch.setattr(build.sysconfig, "get_config_var",
                        lambda name: 1 if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(build.cffi, "__version_info__", (1, 17, 1))
    with pytest.raises(RuntimeError, match=r"needs cffi 2\.0 or later \(this is cffi 1\.17\.1\)"):
        build.make_builder()
    monkeypatch.setattr(build.cffi, "__version_info__", (2, 0, 0))
    assert build.make_builder() is not None
    # A GIL build takes any cffi the requirements allow.
    monkeypatch.setattr(build.sysconfig, "get_config_var",
                        lambda name: None if name == "Py_GIL_DISABLED" else real(name))
    monkeypatch.setattr(build.cffi, "__version_info__", (1, 17, 1))
    assert build.make_builder() is not None
