"""The C core compiled for Windows with mingw-w64, from the cffi builder.

The sources, the cdef and the libraries come from ``socknotify_loop/_build.py``,
the builder ``pip install`` uses: a source file added there is compiled
here too.
"""
from __future__ import annotations

import os

from .apt import MINGW_CC
from .config import PACKAGE, load_file, run
from .python import python_dir

BUILDER = os.path.join(PACKAGE, "_build.py")
#: The environment variable that asks for a core with checked transitions.
CHECK_TRANSITIONS = "SOCKNOTIFY_CHECK_TRANSITIONS"
#: The environment variable that asks for a test build (the builder's own).
TESTING = "SOCKNOTIFY_TESTING"


def load_builder():
    """socknotify_loop/_build.py as a module, loaded from its path (it needs
    cffi, not the package)."""
    return load_file("socknotify_loop_build", BUILDER)


def compile_extension(version: str, workdir: str) -> str:
    """Emit the cffi C code on Linux and compile it, with the core's C files,
    into ``workdir/_socknotify.pyd`` against that Windows Python's headers."""
    builder_module = load_builder()
    builder = builder_module.make_builder(target_windows=True)
    generated = os.path.join(workdir, "_socknotify.c")
    builder.emit_c_code(generated)
    pyd = os.path.join(workdir, "_socknotify.pyd")   # the limited-API name
    pydir = python_dir(version)
    core = builder_module.CORE
    sources = [os.path.join(core, name) for name in builder_module.SOURCES]
    libs = [f"-l{name}" for name in builder_module.windows_libraries()]
    with open(os.path.join(pydir, "include", "pyconfig.h"), encoding="latin-1") as f:
        # 3.12+ headers define MS_WIN64 for mingw themselves; older ones
        # only for MSVC, and the Win64 ABI must be named explicitly.
        knows_mingw = "__MINGW32__" in f.read()
    # SOCKNOTIFY_CHECK_TRANSITIONS=1 (`--check-transitions`): every record
    # transition checked (sn_record.h), a refused one aborting the process
    # with its name and line, as the Linux sanitizer run builds the core.
    checked = os.environ.get(CHECK_TRANSITIONS) == "1"
    # A test build (SOCKNOTIFY_TESTING=1) compiles the strict model in; the
    # builder says with which definitions, as it does for pip's builds.
    testing = builder_module.testing_requested()
    cmd = [MINGW_CC, "-O2", "-shared", "-Wall", "-Werror",
           *(["-DSN_CHECK_TRANSITIONS"] if checked else []),
           *[f"-D{name}={value}" for name, value in builder_module.core_macros(testing)],
           "-Wno-unused-parameter",  # in cffi's generated module, not ours
           # cffi's generated code defines Py_LIMITED_API itself (abi3).
           *([] if knows_mingw else ["-DMS_WIN64"]),
           "-I", os.path.join(pydir, "include"), "-I", core,
           generated, *sources, "-o", pyd,
           # python3.dll: the stable-ABI DLL every Windows CPython 3 ships.
           "-L", pydir, "-lpython3", *libs,
           "-static-libgcc"]
    run(cmd)
    with open(pyd, "rb") as f:
        binary = f.read()
    if checked and b"record transition" not in binary:
        raise SystemExit("the core was built without its transition checks")
    # A production build carries no test code: no model, no controls.
    if not testing and (b"sn_model_control" in binary or b"SOCKNOTIFY_STRICT_MODES" in binary):
        raise SystemExit("the production core carries the strict model")
    return pyd
