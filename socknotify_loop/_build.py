"""cffi builder of the C core (API mode).

The cdef is read from the one public header, ``_core/socknotify.h``, between
its CDEF markers, so the C declarations and what Python sees cannot drift.
A test build (SOCKNOTIFY_TESTING=1 in the build's environment) compiles the
core with ``SN_TESTING`` defined -- the strict model of
ProcessSocketNotifications (``sn_model.c``), its controls and the ``strict``
backend -- and adds the header's CDEF-TESTING declarations to the cdef; a
production build (the wheels, ``pip install .``) carries none of it.
``setup.py`` names ``socknotify_loop/_build.py:ffibuilder`` in
``cffi_modules``; the Windows cross-build (``tools/wine/``) imports the
same ``ffibuilder`` and emits its C code for mingw-w64. A build-time file:
the sdist ships it, the wheels leave it out (setup.py).
"""
from __future__ import annotations

import os
import re
import struct
import sys
import sysconfig

import cffi
from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join(HERE, "_core")
HEADER = os.path.join(CORE, "socknotify.h")
#: The environment variable that asks for a test build: ``1`` compiles the
#: core with SN_TESTING defined and adds the header's test-only declarations
#: (between its CDEF-TESTING markers) to the cdef.
TESTING = "SOCKNOTIFY_TESTING"
#: The markers of the production declarations and of the test-only ones.
CDEF_MARKERS = ("CDEF-BEGIN", "CDEF-END")
TESTING_MARKERS = ("CDEF-TESTING-BEGIN", "CDEF-TESTING-END")

# One C file per concern (docs/design.md has the map); each backend file
# compiles to nothing on the operating systems it does not serve (#ifdef
# guards inside). The port is sn_port.c (its life cycle) and the files it
# is split into; the completion-port backends are sn_iocp.c (the port and
# its ops tables) and the sn_iocp_*.c it is split into; the AFD polyfill is
# sn_afd.c (its entry point) and the sn_afd_*.c it is split into. The strict
# model (sn_model.c) compiles to nothing outside a test build.
PORT_SOURCES = [
    "sn_port.c", "sn_backends.c", "sn_table.c", "sn_hash.c", "sn_translate.c",
    "sn_rearm.c", "sn_run.c", "sn_select.c",
]
SOURCES = PORT_SOURCES + [
    "sn_platform_posix.c", "sn_platform_win.c", "sn_epoll.c",
    "sn_iocp.c", "sn_iocp_fn.c", "sn_iocp_buf.c", "sn_iocp_fallback.c",
    "sn_afd.c", "sn_afd_sock.c", "sn_afd_port.c", "sn_afd_group.c",
    "sn_afd_ws.c", "sn_afd_nt.c", "sn_model.c",
]


def read_cdef(markers: tuple[str, str] = CDEF_MARKERS, path: str = HEADER) -> str:
    """Return the declarations between the header's two ``markers``
    (CDEF_MARKERS: the production interface; TESTING_MARKERS: what a test
    build adds)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin, end = (re.escape(marker) for marker in markers)
    match = re.search(rf"/\* {begin} \*/(.*?)/\* {end} \*/", text, re.S)
    if match is None:
        raise RuntimeError(f"{path}: {markers[0]} / {markers[1]} markers not found")
    return match.group(1)


def testing_requested() -> bool:
    """Whether the build's environment asks for a test build."""
    return os.environ.get(TESTING) == "1"


def core_macros(testing: bool) -> list[tuple[str, str]]:
    """The preprocessor definitions the core is compiled with for the kind
    of build (the mingw-w64 cross-build, tools/wine, passes them too)."""
    return [("SN_TESTING", "1")] if testing else []


def windows_libraries() -> list[str]:
    """Libraries the Windows backends link against."""
    return ["ws2_32", "ntdll"]


def windows_compile_args() -> list[str]:
    """Compiler flags for a native Windows build (MSVC, as setuptools and
    cibuildwheel use it). ``/std:c11``: MSVC's C mode knows ``_Static_assert``
    (the core's layout checks) only as C11; sn_win.h stops the build with a
    clear #error without it. A MinGW-built Python (sysconfig platform
    ``mingw*``) compiles with gcc, which speaks C11 already."""
    if sysconfig.get_platform().startswith("mingw"):
        return ["-std=c11", "-Wall", "-Wextra"]
    return ["/std:c11", "/W3"]


def check_windows_target() -> None:
    """Refuse a 32-bit Windows build with a clear message, before the C
    compiler's #error (sn_win.h) says the same thing less politely: the
    core's completion keys are 64-bit values, which a 32-bit PVOID and
    ULONG_PTR cannot carry."""
    if struct.calcsize("P") != 8:
        raise RuntimeError(
            "socknotify_loop supports 64-bit Windows only (x64 and ARM64): its "
            "completion keys are 64-bit and do not fit a 32-bit PVOID/ULONG_PTR. "
            "Use a 64-bit Python.")


def check_free_threaded_cffi() -> None:
    """Refuse a free-threaded CPython build (3.14t) with a cffi older than
    2.0: cffi 1.x compiles the module against the limited API, which the
    free-threaded build does not have (the module crashes), and does not
    declare it safe without the GIL (CPython would turn the GIL back on at
    import). cffi 2.0 builds the full API there and its backend makes the
    declaration when it loads the module. pyproject.toml asks for 2.0
    already; this catches a build made without build isolation."""
    version = tuple(cffi.__version_info__)
    if sysconfig.get_config_var("Py_GIL_DISABLED") and version[:2] < (2, 0):
        raise RuntimeError(
            f"socknotify_loop on a free-threaded CPython needs cffi 2.0 or later "
            f"(this is cffi {'.'.join(map(str, version))}): pip install 'cffi>=2.0'")


def make_builder(target_windows: bool | None = None, testing: bool | None = None) -> FFI:
    """Build the FFI object; target_windows overrides the host OS (cross builds);
    testing (default: SOCKNOTIFY_TESTING=1 in the environment) makes a test
    build (see the top of this file)."""
    if testing is None:
        testing = testing_requested()
    native_windows = sys.platform == "win32"
    if target_windows is None:
        target_windows = native_windows
    if native_windows:
        check_windows_target()
    check_free_threaded_cffi()
    if not target_windows:
        compile_args = ["-std=c99", "-Wall", "-Wextra"]
    elif native_windows:
        compile_args = windows_compile_args()
    else:
        # The mingw-w64 cross-build (tools/wine/) passes its own flags.
        compile_args = []
    builder = FFI()
    builder.cdef(read_cdef() + (read_cdef(TESTING_MARKERS) if testing else ""))
    macros = core_macros(testing)
    if native_windows:
        macros += free_threaded_windows_macros()
    builder.set_source(
        "socknotify_loop._socknotify",
        '#include "socknotify.h"\n',
        sources=[os.path.relpath(os.path.join(CORE, name)) for name in SOURCES],
        include_dirs=[os.path.relpath(CORE)],
        libraries=windows_libraries() if target_windows else [],
        extra_compile_args=compile_args,
        define_macros=macros,
    )
    return builder


def free_threaded_windows_macros() -> list[tuple[str, str]]:
    """``Py_GIL_DISABLED=1`` for a free-threaded CPython on Windows, where
    the installer's pyconfig.h is shared with the default build and does
    not define it (CPython's gh-111650; setuptools' distutils defines it
    too since 75.3, this keeps the build right without it): compiled
    without it, the module would link to the GIL build's DLL."""
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return [("Py_GIL_DISABLED", "1")]
    return []


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
