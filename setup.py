# Only what pyproject.toml cannot say: the cffi module, the limited-API
# wheel tag, and keeping the cffi builder out of the wheel.
import os
import platform
import shutil
import sys
import sysconfig
import uuid

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.errors import CCompilerError, ExecError, PlatformError

NO_COMPILER = """\
socknotify_loop: its C core could not be compiled: building it from source
needs a C compiler. On Windows, install Microsoft's "Build Tools for Visual
Studio" with the "Desktop development with C++" workload (the MSVC compiler
and a Windows SDK) and open a new terminal; on Linux, gcc and the Python
headers (Debian/Ubuntu: apt-get install build-essential python3-dev). Or
install a wheel, which needs no compiler: on Windows the
socknotify_loop-*-cp39-abi3-win_amd64.whl that the project's Windows wheel
workflow publishes as a build artifact (pip install <that file>). The
compiler's error: {reason}"""


class build_ext_explained(build_ext):
    """build_ext that compiles the core afresh on every build, and whose
    compiler failures end in one paragraph saying what is missing and how
    to get it, instead of pip's bare "Failed building wheel" after a
    compiler traceback.

    Afresh: setuptools skips an extension whose output (build/lib.*, where
    pip's in-tree builds of `pip install .` leave it) is newer than its .c
    files, so a second build in the same tree ignored a changed CC or
    CFLAGS, and a changed header (the headers are not among those files).
    Here every build compiles every file, into an object folder of its own
    that is removed afterwards, so nothing compiled by another build is
    used: the core compiles in seconds."""

    def finalize_options(self):
        super().finalize_options()
        self.force = True

    def run(self):
        # cffi has written the core's generated .c file into the usual
        # build_temp already (its build_ext runs this one afterwards).
        usual = self.build_temp
        self.build_temp = f"{usual}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError) as exc:
            reason = " ".join(str(exc).split()) or type(exc).__name__
            raise SystemExit(NO_COMPILER.format(reason=reason)) from exc
        finally:
            shutil.rmtree(self.build_temp, ignore_errors=True)
            self.build_temp = usual


class build_py_without_builder(build_py):
    """build_py that leaves socknotify_loop/_build.py out of the wheel: it is
    the build recipe (cffi loads it from the source tree or the unpacked
    sdist), useless once the core is compiled."""

    def find_package_modules(self, package, package_dir):
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) != ("socknotify_loop", "_build")]


options = {}
# cffi compiles the core against CPython's limited API (_socknotify.abi3.so /
# _socknotify.pyd), so one wheel per platform serves CPython 3.9 and later:
# tag it cp39-abi3. PyPy has no limited API, and neither have free-threaded
# and debug CPython builds (cffi compiles the full API there): their wheels
# keep their own interpreter tags.
if (platform.python_implementation() == "CPython"
        and not sysconfig.get_config_var("Py_GIL_DISABLED")
        and not hasattr(sys, "gettotalrefcount")):
    options["bdist_wheel"] = {"py_limited_api": "cp39"}

setup(
    cffi_modules=["socknotify_loop/_build.py:ffibuilder"],
    cmdclass={"build_py": build_py_without_builder, "build_ext": build_ext_explained},
    options=options,
)
